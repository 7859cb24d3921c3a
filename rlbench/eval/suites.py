"""Suite manifests (`manifests/<name>.json`, package data) and loading their problems from a data dir or
the HF hub.

A data dir holds one JSONL file per suite (the manifest's `data_file`), one problem per line with `id`,
`problem`, `answer` and suite-specific extras (e.g. K&K's `names`); the hub path maps each dataset's own
field names onto that schema with the manifest's `hub.fields`.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_json, read_jsonl
from rlbench.eval.schema import is_text, short

# Extra fields kept from data rows: report grouping and the K&K grader need them.
EXTRA_FIELDS = ("subject", "level", "exam", "names", "solution", "n_people", "answer_type")


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _bools(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(b, bool) for b in value)


def _names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(n, str) for n in value)


# What each field a problem uses may hold (null: absent, for the extras), checked when the suite loads so a
# bad row is one line naming file:line before any generation, not a crash when the report is written.
FIELD_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "id": ("a string or an integer", lambda v: (isinstance(v, str) and v != "") or type(v) is int),
    "problem": ("a non-empty string", lambda v: isinstance(v, str) and v.strip() != ""),
    "answer": ("a string or a number", _scalar),
    "subject": ("a string or a number", _scalar),
    "level": ("a string or a number", _scalar),
    "exam": ("a string or a number", _scalar),
    "answer_type": ("a string", lambda v: isinstance(v, str)),
    "names": ("a list of names", _names),
    "solution": ("a string or a list of true/false", lambda v: isinstance(v, str) or _bools(v)),
    "n_people": ("a positive integer", lambda v: type(v) is int and v > 0),
}
REQUIRED_FIELDS = ("id", "problem", "answer")


@dataclass
class Problem:
    id: str
    problem: str
    answer: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    name: str
    title: str
    size: int
    hub: dict[str, Any]
    data_file: str
    template: str
    grader: str
    group_by: list[str]
    license: str = ""

    @property
    def hub_source(self) -> str:
        cfg = f" [{self.hub['config']}]" if self.hub.get("config") else ""
        files = f" files={','.join(self.hub['data_files'])}" if self.hub.get("data_files") else ""
        return f"{self.hub['id']}{cfg} split={self.hub['split']}{files}"


MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"  # package data: one <name>.json per suite


def available_suites() -> dict[str, Path]:
    return {path.stem: path for path in sorted(MANIFEST_DIR.glob("*.json"))}


def get_suite(name: str) -> Suite:
    suites = available_suites()
    if name not in suites:
        raise UserError(
            f"unknown suite {name!r}; valid suites: {', '.join(sorted(suites)) or '(none found)'}"
        )
    raw = read_json(suites[name])
    keys = Suite.__dataclass_fields__
    return Suite(**{k: v for k, v in raw.items() if k in keys})


def _clean_gold(value: Any) -> str:
    """Hub golds come as floats (amc23: 27.0) or `$...$` LaTeX (OlympiadBench): normalise as the data dir."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if "$" in text:
        text = re.sub(r"\$\s*,\s*\$", ", ", text).replace("$", "").strip()
        text = text[:-1] if text.endswith(".") else text
    return text


def row_problem(row: dict[str, Any], grader: str = "math") -> str | None:
    """What is wrong with one problem's fields for the runner, the grader and the report (None: nothing):
    a missing or null id/problem/answer, a field of the wrong type (a list where a subject goes), text that
    cannot be written as UTF-8 (a lone surrogate such as \\ud800), K&K problems without their names."""
    for name in REQUIRED_FIELDS:
        if row.get(name) is None:
            return f"{name} is missing or null"
    if grader == "kk" and row.get("names") is None:
        return "a K&K problem needs its names"
    for name, (want, ok) in FIELD_TYPES.items():
        value = row.get(name)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name} is {value!r}, not {want}"
        if not ok(value):
            return f"{name} is {short(value)}, not {want}"
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not is_text(text):
                return f"{name} holds a lone surrogate (such as \\ud800), which is not text"
    return None


def _row_to_problem(row: dict[str, Any], fields: dict[str, str | None], index: int, suite: Suite) -> Problem:
    def get(path: str) -> Any:
        m = re.fullmatch(r"(\w+)\[(\d+)\]", path)  # `final_answer[0]`: first element of a list field
        if m:
            value = row.get(m.group(1))
            return (
                value[int(m.group(2))] if isinstance(value, list) and len(value) > int(m.group(2)) else None
            )
        return row.get(path)

    pid = get(fields["id"]) if fields.get("id") else f"{suite.name}-{index:04d}"
    extra = {k: row[k] for k in EXTRA_FIELDS if row.get(k) is not None}  # null: absent
    for k, src in fields.items():
        if k not in ("id", "problem", "answer") and src and get(src) is not None:
            extra[k] = get(src)
    mapped = {"id": pid, "problem": get(fields["problem"]), "answer": get(fields["answer"]), **extra}
    if (why := row_problem(mapped, suite.grader)) is not None:  # data-dir rows were checked when read
        raise UserError(f"{suite.hub_source}: row {index}: {why}")
    if "names" in extra and "n_people" not in extra:
        extra["n_people"] = len(extra["names"])
    return Problem(id=str(pid), problem=mapped["problem"], answer=_clean_gold(mapped["answer"]), extra=extra)


def read_data_file(path: Path, grader: str = "math") -> list[dict[str, Any]]:
    """Parse JSONL line by line so a bad row (malformed, or failing `row_problem`) is reported with its file
    and line number.

    (datasets' JSON builder reports neither, and would merge per-row dict keys such as K&K's
    `assignment` into one struct of every name; the rows are small, so plain JSON is the faithful path.)
    """
    # torn_tail=False: user data is not appended by a process that can be killed, so a bad last line is
    # an error like any other rather than a silently smaller suite.
    return read_jsonl(
        path, required=REQUIRED_FIELDS, torn_tail=False, check=lambda row: row_problem(row, grader)
    )


def load_problems(suite: Suite, data_dir: Path | None) -> list[Problem]:
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise UserError(f"data dir not found: {data_dir}")
        path = data_dir / suite.data_file
        if not path.is_file():
            raise UserError(
                f"suite {suite.name!r} needs {suite.data_file} in the data dir {data_dir}; not found"
            )
        identity = {"id": "id", "problem": "problem", "answer": "answer"}
        rows = read_data_file(path, suite.grader)
        problems = [_row_to_problem(r, identity, i, suite) for i, r in enumerate(rows)]
    else:
        problems = _load_from_hub(suite)
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise UserError(f"suite {suite.name!r}: duplicate problem id {p.id!r}")
        seen.add(p.id)
    return problems


def hub_reachable(timeout: float = 2.0) -> bool:
    """A short TCP probe: without one, datasets retries an unreachable hub for ~23 s before failing."""
    if (
        os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    ):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_from_hub(suite: Suite) -> list[Problem]:
    hint = "pass --data-dir DIR (or set RLBENCH_DATA_DIR) holding the suite's JSONL files"
    if not hub_reachable():
        raise UserError(f"cannot reach the HuggingFace hub to load {suite.hub['id']}; {hint}")
    import datasets

    hub = suite.hub
    try:
        ds = datasets.load_dataset(
            hub["id"], hub.get("config"), split=hub["split"], data_files=hub.get("data_files")
        )
    except Exception as err:  # network, auth and schema failures all end the same way for the user
        raise UserError(
            f"loading {suite.hub_source} from the hub failed ({type(err).__name__}: {err}); {hint}"
        ) from None
    return [_row_to_problem(dict(r), hub["fields"], i, suite) for i, r in enumerate(ds)]


def suite_sizes(data_dir: Path | None) -> list[dict[str, Any]]:
    """Rows for `rlbench suites`: size counted from the data dir when one is given, else the manifest's."""
    rows = []
    for name in available_suites():
        suite = get_suite(name)
        size: int | str = suite.size
        source = suite.hub_source
        if data_dir is not None:
            path = Path(data_dir) / suite.data_file
            if path.is_file():
                try:  # counted as bytes: a listing need not decode (eval checks the rows themselves)
                    with open(path, "rb") as fh:
                        size = sum(1 for line in fh if line.strip())
                except OSError as err:
                    raise UserError(f"{path}: cannot read ({err.strerror or err})") from None
                source = str(path)
            else:
                source = f"{suite.hub_source} ({suite.data_file} not in data dir)"
        rows.append(
            {"suite": name, "title": suite.title, "size": size, "source": source, "grader": suite.grader}
        )
    return rows
