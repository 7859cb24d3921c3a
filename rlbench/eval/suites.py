"""Suite manifests (`suites/<name>.json`) and loading their problems from a data dir or the HF hub.

A data dir holds one JSONL file per suite (the manifest's `data_file`), one problem per line with `id`,
`problem`, `answer` and suite-specific extras (e.g. K&K's `names`); the hub path maps each dataset's own
field names onto that schema with the manifest's `hub.fields`.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rlbench.errors import UserError
from rlbench.records import read_json, read_jsonl

# Extra fields kept from data rows: report grouping and the K&K grader need them.
EXTRA_FIELDS = ("subject", "level", "exam", "names", "solution", "n_people", "answer_type")


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


def _manifest_dirs() -> list[Path]:
    """`suites/` beside the package in a source checkout, else the copy installed as package data."""
    from rlbench.shipped import shipped_dirs

    return shipped_dirs("suites", "rlbench._suites")


def available_suites() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in _manifest_dirs():
        for path in sorted(d.glob("*.json")):
            found.setdefault(path.stem, path)
    return found


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


def _row_to_problem(row: dict[str, Any], fields: dict[str, str | None], index: int, suite: str) -> Problem:
    def get(path: str) -> Any:
        m = re.fullmatch(r"(\w+)\[(\d+)\]", path)  # `final_answer[0]`: first element of a list field
        if m:
            value = row.get(m.group(1))
            return (
                value[int(m.group(2))] if isinstance(value, list) and len(value) > int(m.group(2)) else None
            )
        return row.get(path)

    pid = get(fields["id"]) if fields.get("id") else None
    extra = {k: row[k] for k in EXTRA_FIELDS if k in row}
    for k, src in fields.items():
        if k not in ("id", "problem", "answer") and src:
            extra[k] = get(src)
    if "names" in extra and "n_people" not in extra:
        extra["n_people"] = len(extra["names"])
    return Problem(
        id=str(pid) if pid is not None else f"{suite}-{index:04d}",
        problem=str(get(fields["problem"])),
        answer=_clean_gold(get(fields["answer"])),
        extra=extra,
    )


def read_data_file(path: Path) -> list[dict[str, Any]]:
    """Parse JSONL line by line so a bad row is reported with its file and line number.

    (datasets' JSON builder reports neither, and would merge per-row dict keys such as K&K's
    `assignment` into one struct of every name; the rows are small, so plain JSON is the faithful path.)
    """
    # torn_tail=False: user data is not appended by a process that can be killed, so a bad last line is
    # an error like any other rather than a silently smaller suite.
    return read_jsonl(path, required=("id", "problem", "answer"), torn_tail=False)


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
        problems = [_row_to_problem(r, identity, i, suite.name) for i, r in enumerate(read_data_file(path))]
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
    return [_row_to_problem(dict(r), hub["fields"], i, suite.name) for i, r in enumerate(ds)]


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
                with open(path, encoding="utf-8") as fh:
                    size = sum(1 for line in fh if line.strip())
                source = str(path)
            else:
                source = f"{suite.hub_source} ({suite.data_file} not in data dir)"
        rows.append(
            {"suite": name, "title": suite.title, "size": size, "source": source, "grader": suite.grader}
        )
    return rows
