"""Options are fields: a part that takes options declares them once, as a frozen dataclass beside its class
(`Options`), each field's name, type and default the option's, its range and meaning in `option(...)`'s
metadata. `options_of` reads those fields (as nano-vllm's Config is read with `dataclasses.fields`) as the
`Option` rows the mode registry (modes.py), `rlbench modes`, the command-line checks and the simulator use,
so no default, range or help is written twice. Imports nothing heavy."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reference_trainer.errors import MAX_COEFFICIENT, MAX_COUNT

_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
# A field's annotation (a string: the modules use `from __future__ import annotations`) -> its JSON type.
_KINDS = {kind: kind for kind in _TYPE_WORDS} | {
    "tuple[int, ...]": "list[int]",
    "list[list[float]]": "list",
    "int | tuple[int, int]": "int | [lo,hi]",  # a task's range of sizes (tasks/kk.py)
}


def option(default: Any, help: str, **meta: Any) -> Any:
    """A field of an `Options` record: its default and help, plus any of `minimum`, `choices`, `null_word`,
    `multi_worker`, `simulated`, `dotted_path` (as `Option` has them)."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})


class Options:
    """The base of every options record (a frozen dataclass): each field is checked against its option on
    construction, so a record never holds a value out of range."""

    def __post_init__(self) -> None:
        for o in options_of(type(self)):
            value = o.check(getattr(self, o.key))
            if value is not getattr(self, o.key) and o.type == "float":
                object.__setattr__(self, o.key, value)

    @classmethod
    def take(cls, values: Mapping[str, Any]) -> Any:
        """A record from the entries of `values` that are this record's fields (the rest are another's)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class Option:
    """One `--mode-option KEY=VALUE`."""

    name: str  # speculation options are "spec.<key>"
    type: str  # int | float | bool | str | list[int] | list
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    nullable: bool = False  # JSON null is allowed (and usually the default: "the component decides")
    null_word: str = "none"  # how `rlbench modes` shows a null default ("auto": the component picks one)
    multi_worker: bool = False  # takes effect only with --workers > 1
    simulated: bool = False  # rlbench simulate models it
    # A value outside `choices` of the form package.module:Class is accepted too: the record that takes it
    # loads the class (a user's own dispatch policy), so a name that cannot be loaded is its error.
    dotted_path: bool = False

    @property
    def key(self) -> str:
        """The name without its group prefix: the record's field."""
        return self.name.rpartition(".")[2]

    def check(self, value: Any) -> Any:
        """The value if it has this option's type, else a one-line ValueError."""
        if value is None and self.nullable:
            return None
        listed = isinstance(value, (list, tuple))  # JSON gives lists, a record's default is a tuple
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "list[int]": listed and all(type(v) is int for v in value),
            "list": listed,
        }[self.type]
        if ok and self.type == "float" and not math.isfinite(value):  # JSON 1e999 parses as inf
            raise ValueError(f"option {self.name} must be a finite number, got {value!r}")
        if ok and self.type == "float" and abs(value) > MAX_COEFFICIENT:  # 1e308 x a batch is inf
            raise ValueError(f"option {self.name} must be within ±{MAX_COEFFICIENT:g}, got {value!r}")
        if ok and self.type == "int" and value > MAX_COUNT:
            raise ValueError(f"option {self.name} must be <= {MAX_COUNT}, got {value!r}")
        if not ok:
            want = _TYPE_WORDS.get(self.type, f"a JSON {self.type}")
            raise ValueError(f"option {self.name} must be {want}{' or null' * self.nullable}, got {value!r}")
        if self.choices and value not in self.choices and not (self.dotted_path and ":" in value):
            more = ", or package.module:Class" if self.dotted_path else ""
            raise ValueError(f"unknown {self.name} {value!r}; valid: {', '.join(self.choices)}{more}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"option {self.name} must be >= {self.minimum:g}, got {value!r}")
        return float(value) if self.type == "float" else value

    def shown_default(self) -> str:
        if self.default is None:
            return self.null_word
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, (list, tuple)):
            return "[" + ",".join(str(v) for v in self.default) + "]"
        return str(self.default)


@functools.cache
def options_of(record: type, prefix: str = "") -> tuple[Option, ...]:
    """The options an `Options` record declares, named `prefix` + field name."""
    out = []
    for f in dataclasses.fields(record):
        kind = str(f.type)
        nullable = kind.endswith(" | None")
        meta = dict(f.metadata)
        out.append(
            Option(
                prefix + f.name,
                _KINDS[kind.removesuffix(" | None")],
                list(f.default) if isinstance(f.default, tuple) else f.default,
                meta.pop("help"),
                nullable=nullable,
                **meta,
            )
        )
    return tuple(out)
