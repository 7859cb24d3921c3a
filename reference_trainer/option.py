"""One typed `KEY=VALUE` option of a mode (`--mode-option`): its JSON type, default, range and meaning.

Defined below every component that declares options (the rollout strategies' in mode_options.py, the
drafters' and the speculator's in speculation/drafters.py), so each declares its own and the mode registry
(modes.py) only gathers them. Imports nothing heavy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reference_trainer.errors import MAX_COEFFICIENT, MAX_COUNT

_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


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

    @property
    def key(self) -> str:
        """The name without its group prefix: the component's constructor argument."""
        return self.name.rpartition(".")[2]

    def check(self, value: Any) -> Any:
        """The value if it has this option's type, else a one-line ValueError."""
        if value is None and self.nullable:
            return None
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "list[int]": isinstance(value, list) and all(type(v) is int for v in value),
            "list": isinstance(value, list),
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
        if self.choices and value not in self.choices:
            raise ValueError(f"unknown {self.name} {value!r}; valid: {', '.join(self.choices)}")
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
