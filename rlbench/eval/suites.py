"""Finding suite files (suites/, --include-path, or a path) and loading their problems from a data dir, a
data file beside the suite file, or the HF hub (suite_file.py says what a suite file holds).

A data dir holds one JSONL file per suite (the suite's `data.file`), one problem per line with `id`,
`problem`, `answer` and suite-specific extras (e.g. K&K's `names`); the hub path maps each dataset's own
field names onto that schema with the suite's `data.fields`.
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from reference_trainer.errors import UserError
from reference_trainer.inputs import BoundedReader, inside, open_input
from reference_trainer.tasks.grading import Grader, get_grader
from reference_trainer.tasks.prompts import plain_prompt
from reference_trainer.tasks.user_grader import is_user_grader, load_grader
from reference_trainer.trace.records import read_jsonl, write_jsonl
from rlbench.eval.schema import is_text, short
from rlbench.eval.suite_file import SUITE_SUFFIXES, Group, Suite, parse_file

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


# The suites shipped with rlbench: the repository's top-level suites/, reached through the package's
# rlbench/suites link (a wheel holds the files themselves there).
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "suites"


def suite_files(include: Sequence[Path] = ()) -> dict[str, Path]:
    """Every suite or group file by name (its stem): the --include-path folders first, then the built-in
    ones, so a user's file of the same name is the one used."""
    found: dict[str, Path] = {}
    for folder in [*include, BUILTIN_DIR]:
        if not Path(folder).is_dir():
            raise UserError(f"--include-path {folder}: not a folder")
        for path in sorted(Path(folder).iterdir()):
            if path.suffix in SUITE_SUFFIXES and path.is_file():
                found.setdefault(path.stem, path)
    return found


def find_suite_file(spec: str, include: Sequence[Path] = ()) -> Path:
    """--suite NAME_OR_FILE: a path to a suite file, or a name in the include folders or the built-ins."""
    if Path(spec).suffix in SUITE_SUFFIXES or "/" in spec:
        if not Path(spec).exists():  # one that exists is read as a file (a FIFO or device is refused then)
            raise UserError(f"suite file not found: {spec}")
        return Path(spec)
    files = suite_files(include)
    if spec not in files:
        raise UserError(f"unknown suite {spec!r}; valid suites: {', '.join(sorted(files)) or '(none found)'}")
    return files[spec]


def resolve(spec: str, include: Sequence[Path] = ()) -> Suite | Group:
    record, _ = parse_file(find_suite_file(spec, include))
    assert record is not None  # parse_file raises at the first problem
    return record


def get_suite(spec: str, include: Sequence[Path] = ()) -> Suite:
    record = resolve(spec, include)
    if isinstance(record, Group):
        raise UserError(f"{spec!r} is a group of suites ({', '.join(record.suites)}), not one suite")
    return record


def member_suite(group: Group, member: str, include: Sequence[Path] = ()) -> Suite:
    """One member of a group: a file path is read inside the group file's folder (never outside it), a
    name is found beside the group file first, then as --suite finds it."""
    base = group.path.parent if group.path is not None else Path(".")
    if Path(member).suffix in SUITE_SUFFIXES or "/" in member:
        path = inside(base, member, "the path")
        if not path.is_file():
            raise UserError(f"suite file not found: {path}")
        member = str(path)
    return get_suite(member, [base, *include])


def group_members(group: Group, include: Sequence[Path] = ()) -> list[Suite]:
    """A group's suites, each read and checked (before any runs). Each runs into OUT/<its name>, so two
    members of one name would write one folder: refused."""
    members = [member_suite(group, member, include) for member in group.suites]
    seen: dict[str, str] = {}
    for spec, suite in zip(group.suites, members, strict=True):
        if suite.name in seen:
            both = f"suites {seen[suite.name]} and {spec}"
            raise UserError(f"{group.path}: {both} are both named {suite.name!r}: each runs into OUT/NAME")
        seen[suite.name] = spec
    return members


def import_path(suite: Suite) -> None:
    """A `python:module:function` grader is imported from the suite file's folder first (pool workers
    inherit sys.path)."""
    if is_user_grader(suite.grader) and suite.path is not None:
        folder = str(suite.path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _clean_gold(value: Any) -> str:
    """Hub golds come as floats (amc23: 27.0) or `$...$` LaTeX (OlympiadBench): normalise as the data dir."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if "$" in text:
        text = re.sub(r"\$\s*,\s*\$", ", ", text).replace("$", "").strip()
        text = text[:-1] if text.endswith(".") else text
    return text


def row_problem(row: dict[str, Any], grader: Grader) -> str | None:
    """What is wrong with one problem's fields for the runner, the grader and the report (None: nothing):
    a missing or null id/problem/answer, a field of the wrong type (a list where a subject goes), text that
    cannot be written as UTF-8 (a lone surrogate such as \\ud800), a field the grader needs missing (K&K
    problems without their names)."""
    for name in REQUIRED_FIELDS:
        if row.get(name) is None:
            return f"{name} is missing or null"
    for name in grader.needs:
        if row.get(name) is None:
            return f"a {grader.title} problem needs its {name}"
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
            value, i = row.get(m.group(1)), int(m.group(2))
            return value[i] if isinstance(value, list) and len(value) > i else None
        return row.get(path)

    pid = get(fields["id"]) if fields.get("id") else f"{suite.name}-{index:04d}"
    extra = {k: row[k] for k in EXTRA_FIELDS if row.get(k) is not None}  # null: absent
    for k, src in fields.items():
        if k not in ("id", "problem", "answer") and src and get(src) is not None:
            extra[k] = get(src)
    mapped = {"id": pid, "problem": get(fields["problem"]), "answer": get(fields["answer"]), **extra}
    # data-dir rows were checked when read
    if (why := row_problem(mapped, get_grader(suite.grader))) is not None:
        raise UserError(f"{suite.hub_source}: row {index}: {why}")
    if "names" in extra and "n_people" not in extra:
        extra["n_people"] = len(extra["names"])
    return Problem(id=str(pid), problem=mapped["problem"], answer=_clean_gold(mapped["answer"]), extra=extra)


def read_data_file(path: Path, grader: Grader) -> list[dict[str, Any]]:
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


def check_data_dir(data_dir: Path) -> None:
    if Path(data_dir).is_file():
        raise UserError(
            f"--data-dir {data_dir} is a file; pass the folder that holds the suites' JSONL files"
        )
    if not Path(data_dir).is_dir():
        raise UserError(f"data dir not found: {data_dir}")


def data_path(suite: Suite, data_dir: Path | None) -> Path | None:
    """Where the suite's rows are read from: the data dir's file, else the file beside the suite file;
    None: the hub dataset. A data dir without the file, with no other source, is one line."""
    if data_dir is not None:
        check_data_dir(data_dir)
        if suite.data_file is not None and inside(data_dir, suite.data_file, "data.file").is_file():
            return Path(data_dir) / suite.data_file
    if suite.local_file is not None:
        return suite.local_file
    if data_dir is not None:
        raise UserError(f"suite {suite.name!r} needs {suite.data_file} in the data dir {data_dir}; not found")
    if suite.hub is None:
        raise UserError(f"suite {suite.name!r} names no hub dataset, and {suite.data_file} is not beside it")
    return None


def load_problems(suite: Suite, data_dir: Path | None) -> list[Problem]:
    path = data_path(suite, data_dir)
    if path is not None:
        identity = {"id": "id", "problem": "problem", "answer": "answer"}
        rows = read_data_file(path, get_grader(suite.grader))
        problems = [_row_to_problem(r, identity, i, suite) for i, r in enumerate(rows)]
    else:
        problems = _load_from_hub(suite)
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise UserError(f"suite {suite.name!r}: duplicate problem id {p.id!r}")
        seen.add(p.id)
    return problems


HUB_PROBE_S = 2.0  # the TCP probe's limit: datasets alone retries an unreachable hub for ~23 s


def hub_offline() -> bool:
    """Has the environment turned the hub off (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)?"""
    return (
        os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    )


def hub_address() -> tuple[str, int]:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or 443


def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """A short TCP probe of the hub (HF_ENDPOINT): without one, datasets retries for ~23 s before failing."""
    if hub_offline():
        return False
    try:
        with socket.create_connection(hub_address(), timeout=timeout):
            return True
    except OSError:
        return False


def offline_hint(suite: Suite) -> str:
    """What to do where the hub cannot be reached: the command that writes the data dir, and the flag."""
    return (
        f"on a connected machine, `rlbench suites download {suite.name} --to DIR` writes its data; "
        "then pass --data-dir DIR (or set RLBENCH_DATA_DIR)"
    )


def _load_from_hub(suite: Suite, hint: str | None = None) -> list[Problem]:
    """The suite's problems from its hub dataset (`data.hub.id` may also be a local dataset folder, which
    `datasets` reads without the network)."""
    hub = suite.hub
    assert hub is not None  # data_path said so
    hint = hint or offline_hint(suite)
    if not Path(hub["id"]).is_dir() and not hub_reachable():
        raise UserError(f"cannot reach the HuggingFace hub to load {hub['id']}; {hint}")
    import datasets

    try:
        ds = datasets.load_dataset(
            hub["id"], hub.get("config"), split=hub["split"], data_files=hub.get("data_files")
        )
    except Exception as err:  # network, auth and schema failures all end the same way for the user
        raise UserError(
            f"loading {suite.hub_source} from the hub failed ({type(err).__name__}: {err}); {hint}"
        ) from None
    return [_row_to_problem(dict(r), hub["fields"], i, suite) for i, r in enumerate(ds)]


def download(names: Sequence[str], to: Path, include: Sequence[Path] = ()) -> list[tuple[Suite, Path, int]]:
    """Write each named suite's problems (a group: each member's) to `to`/<data.file>, one JSON row per
    problem in the schema a data dir holds, then read them back from there as `--data-dir` does and check
    they are the same problems. Returns (suite, file written, rows) per suite. Every name is resolved, and
    every suite checked for a data.file, before anything is fetched."""
    if (Path(to).exists() or Path(to).is_symlink()) and not Path(to).is_dir():
        raise UserError(f"--to {to} is not a folder; pass the folder to write the suites' JSONL files into")
    suites: list[Suite] = []
    for name in names:
        record = resolve(name, include)
        for suite in group_members(record, include) if isinstance(record, Group) else [record]:
            if suite.name not in {s.name for s in suites}:  # named twice (itself and in a group): once
                suites.append(suite)
    files: dict[str, str] = {}
    for suite in suites:
        if suite.data_file is None:
            raise UserError(f"suite {suite.name!r} names no data.file: a data dir cannot hold it")
        # Two suites on one file: the second would overwrite the first, and both would be reported written.
        key = os.path.normpath(str(suite.data_file))
        if key in files:
            raise UserError(
                f"suites {files[key]!r} and {suite.name!r} both write data.file "
                f"{suite.data_file}: download them into separate folders"
            )
        files[key] = suite.name
    written = []
    for suite in suites:
        if suite.hub is not None:
            problems = _load_from_hub(suite, "run the download where the hub can be reached")
        else:
            problems = load_problems(suite, None)  # the file beside the suite file
        target = Path(to) / str(suite.data_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"id": p.id, "problem": p.problem, "answer": p.answer, **p.extra} for p in problems]
        write_jsonl(target, rows)
        if load_problems(suite, Path(to)) != problems:
            raise UserError(f"{target}: what was written does not read back as the suite's problems")
        written.append((suite, target, len(rows)))
    return written


def _count_rows(path: Path) -> int:
    with open_input(path) as fh:  # counted as bytes: a listing need not decode (eval checks the rows)
        return sum(1 for line in BoundedReader(fh, path) if line.strip())


def suite_sizes(data_dir: Path | None, include: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """Rows for `rlbench suites`: size counted from the data file when there is one, else the suite's."""
    rows = []
    for name, file in suite_files(include).items():
        record, _ = parse_file(file)
        if isinstance(record, Group):
            rows.append({"suite": name, "title": record.title, "size": "", "grader": "",
                         "source": f"group: {', '.join(record.suites)}"})  # fmt: skip
            continue
        assert record is not None
        size: int | str = record.size if record.size is not None else "?"
        source = record.hub_source
        local = inside(data_dir, record.data_file, "data.file") if data_dir and record.data_file else None
        if local is not None and local.is_file() or record.local_file is not None:
            path = local if local is not None and local.is_file() else record.local_file
            assert path is not None
            size, source = _count_rows(path), str(path)
        elif data_dir is not None:
            source = f"{record.hub_source} ({record.data_file} not in data dir)"
        rows.append(
            {"suite": name, "title": record.title, "size": size, "source": source, "grader": record.grader}
        )
    return rows


def validate(path: Path, data_dir: Path | None, include: Sequence[Path] = ()) -> list[str]:
    """Every problem of one suite or group file, before any model loads: its keys and values, the prompt
    rendering, the grader importing, the data resolving (the rows read and checked when they are local;
    a hub dataset is named, not fetched). Empty: the file is good."""
    record, found = parse_file(Path(path), first=False)
    if record is None or found:
        return found
    if isinstance(record, Group):
        for member in record.suites:
            try:
                member_suite(record, member, include)
            except UserError as err:
                found.append(f"suites: {member}: {err}")
        if not found:
            try:
                group_members(record, include)
            except UserError as err:
                found.append(str(err))
        return found
    for check in (_check_prompt, _check_grader, lambda s: _check_data(s, data_dir)):
        try:
            check(record)
        except UserError as err:
            found.append(str(err))
    return found


def _check_prompt(suite: Suite) -> None:
    plain_prompt("What is 1 + 1?", suite.template)


def _check_grader(suite: Suite) -> None:
    if is_user_grader(suite.grader):
        import_path(suite)
        load_grader(suite.grader)


def _check_data(suite: Suite, data_dir: Path | None) -> None:
    path = data_path(suite, data_dir)
    if path is not None and not read_data_file(path, get_grader(suite.grader)):
        raise UserError(f"{path}: no problems")
