"""A suite file (YAML, or JSON): what one evaluation suite is, read and checked into one `Suite` record.

    name: math500                  # how --suite finds it (the file's stem, in suites/ or an --include-path)
    title: MATH-500
    license: MIT (PRM800K / MATH)
    size: 500                      # listed by `rlbench suites`; the data decides what runs
    data:
      file: math500.jsonl          # JSONL (id, problem, answer): in --data-dir, or beside this file
      hub: {id: HuggingFaceH4/MATH-500, split: test, config: null, data_files: null}  # id: or a folder
      fields: {id: unique_id, problem: problem, answer: answer}   # suite field: the hub dataset's field
    prompt: math                   # a prompt of grading.PROMPTS (math, kk) | a text holding {problem}
    grader: math                   # a grader of grading.GRADERS (math, kk) | python:module:function (yours)
    sampling: {temperature: 0.6, top_p: 0.95, max_tokens: 1024, samples: 1}
    metrics: [avg@k, pass@k, maj@k]
    group_by: [subject, level]

A group file names several suites: `group: NAME`, `title`, `suites: [NAME_OR_FILE, ...]`.
Every key is checked here; an unknown one is refused with its name (a typo must not be a silent default).
A file is read safely (reference_trainer/inputs.py): a regular file of at most 1 MiB, YAML aliases bounded.
Paths it names stay inside their roots: `name` is a plain name (a group runs each suite into OUT/NAME) and
`data.file` a relative path without `..` (inside --data-dir, or beside the suite file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError, check_integer, check_sequences, check_temperature, check_top_p
from reference_trainer.inputs import MAX_YAML_BYTES, inside, load_yaml, plain_name, read_input
from reference_trainer.tasks.grading import PROMPTS, get_grader
from reference_trainer.trace.records import decode_json
from rlbench.eval.schema import GROUP_FIELDS, short

SUITE_SUFFIXES = (".yaml", ".yml", ".json")
METRICS = ("avg@k", "pass@k", "maj@k")
SAMPLING_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.6,
    "top_p": 0.95,
    "max_tokens": 1024,
    "samples": 1,
}
HUB_KEYS = ("id", "split", "config", "data_files")
DATA_KEYS = ("file", "hub", "fields")
SUITE_KEYS = (
    "name",
    "title",
    "license",
    "size",
    "data",
    "prompt",
    "grader",
    "sampling",
    "metrics",
    "group_by",
)
GROUP_KEYS = ("group", "title", "suites")


@dataclass
class Suite:
    name: str
    title: str
    data_file: str | None  # a JSONL file in --data-dir, or beside the suite file
    template: str  # the prompt: a name of grading.PROMPTS | a text holding {problem}
    grader: str  # a name of grading.GRADERS | python:module:function
    hub: dict[str, Any] | None = None  # id, split, config, data_files, fields
    size: int | None = None
    license: str = ""
    sampling: dict[str, float | int] = field(default_factory=lambda: dict(SAMPLING_DEFAULTS))
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    group_by: list[str] = field(default_factory=list)
    path: Path | None = None  # the suite file
    sha256: str = ""  # of the suite file's bytes, recorded in results.json

    @property
    def hub_source(self) -> str:
        if not self.hub:
            return "(no hub dataset)"
        cfg = f" [{self.hub['config']}]" if self.hub.get("config") else ""
        files = f" files={','.join(self.hub['data_files'])}" if self.hub.get("data_files") else ""
        return f"{self.hub['id']}{cfg} split={self.hub['split']}{files}"

    @property
    def local_file(self) -> Path | None:
        """The data file beside the suite file, when there is one."""
        if self.data_file is None or self.path is None:
            return None
        path = inside(self.path.parent, self.data_file, "data.file")
        return path if path.is_file() else None


@dataclass
class Group:
    name: str
    title: str
    suites: list[str]  # names or files, resolved as --suite resolves them
    path: Path | None = None


class _Problems:
    """Collects every problem of a file (for `rlbench suites validate`); `first` raises at the first."""

    def __init__(self, source: Path, first: bool) -> None:
        self.source, self.first = source, first
        self.found: list[str] = []

    def add(self, message: str) -> None:
        if self.first:
            raise UserError(f"{self.source}: {message}")
        self.found.append(message)


def read_raw(path: Path) -> tuple[Any, str]:
    """A suite file's parsed contents and its SHA-256; an unreadable or malformed file is one line."""
    data = read_input(path, MAX_YAML_BYTES)  # a regular file: no FIFO, device or endless read
    if path.suffix == ".json":
        doc, why, _ = decode_json(data)
        if why:
            raise UserError(f"{path}: not valid JSON: {why}")
    else:
        doc = load_yaml(data, path)  # aliases bounded: a billion-laughs file is one line
    return doc, hashlib.sha256(data).hexdigest()


def parse_file(path: Path, first: bool = True) -> tuple[Suite | Group | None, list[str]]:
    """The suite or group in `path`, and the problems found (with `first`, the first raises instead)."""
    problems = _Problems(path, first)
    try:
        doc, sha = read_raw(path)
    except UserError as err:  # unreadable or not YAML/JSON: with `first`, the one line; else one problem
        if first:
            raise
        return None, [str(err).removeprefix(f"{path}: ")]
    if not isinstance(doc, dict):
        problems.add("not a suite (a mapping of keys such as name, data, prompt, grader)")
        return None, problems.found
    if "group" in doc:
        return _parse_group(doc, path, problems), problems.found
    return _parse_suite(doc, path, sha, problems), problems.found


def _unknown(doc: dict[str, Any], allowed: tuple[str, ...], where: str, problems: _Problems) -> None:
    for key in doc:
        if key not in allowed:
            problems.add(f"unknown key {where + str(key)!r}; allowed: {', '.join(allowed)}")


def _text(doc: dict[str, Any], key: str, problems: _Problems, required: bool = True, where: str = "") -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        problems.add(f"{where}{key} is {short(value)}, not a non-empty text")
        return ""
    return value


def _names(value: Any, key: str, problems: _Problems, allowed: tuple[str, ...] | None = None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.add(f"{key} is {short(value)}, not a list of names")
        return []
    for v in value:
        if allowed is not None and v not in allowed:
            problems.add(f"{key}: unknown {short(v)}; choose from {', '.join(allowed)}")
    return value


def _parse_group(doc: dict[str, Any], path: Path, problems: _Problems) -> Group:
    _unknown(doc, GROUP_KEYS, "", problems)
    suites = _names(doc.get("suites"), "suites", problems)
    if not suites:
        problems.add("suites: a group names at least one suite")
    return Group(_text(doc, "group", problems), _text(doc, "title", problems, required=False), suites, path)


def _parse_data(doc: Any, folder: Path, problems: _Problems) -> tuple[str | None, dict[str, Any] | None]:
    if not isinstance(doc, dict):
        problems.add(f"data is {short(doc)}, not a mapping with file, hub and fields")
        return None, None
    _unknown(doc, DATA_KEYS, "data.", problems)
    file = _text(doc, "file", problems, required=False, where="data.") or None
    if file is not None:
        try:  # read from --data-dir or the suite's folder: it must stay inside them
            inside(folder, file, "data.file")
        except UserError as err:
            problems.add(str(err))
    hub = doc.get("hub")
    if hub is None:
        if file is None:
            problems.add("data names neither a file nor a hub dataset")
        return file, None
    if not isinstance(hub, dict):
        problems.add(f"data.hub is {short(hub)}, not a mapping with id and split")
        return file, None
    _unknown(hub, HUB_KEYS, "data.hub.", problems)
    _text(hub, "id", problems, where="data.hub.")
    _text(hub, "split", problems, where="data.hub.")
    if hub.get("data_files") is not None:
        _names(hub["data_files"], "data.hub.data_files", problems)
    fields = doc.get("fields", {"id": "id", "problem": "problem", "answer": "answer"})
    if not isinstance(fields, dict) or not all(isinstance(v, str) or v is None for v in fields.values()):
        problems.add(f"data.fields is {short(fields)}, not a mapping of suite field: dataset field")
        fields = {}
    for key in ("problem", "answer"):
        if not fields.get(key):
            problems.add(f"data.fields needs {key} (the dataset's field holding it)")
    return file, {**{k: hub.get(k) for k in HUB_KEYS}, "fields": fields}


def _samples(name: str, value: Any) -> int:
    where = f"{name} (-k)" if name == "--samples" else name  # the flag has a short form
    return check_sequences(where, check_integer(name, value, low=1))


# Each sampling setting's flag and its check: the one rule for the flag and for a suite file's key (a suite
# cannot set what the flag refuses: `sampling: {samples: 0}` is `-k 0`).
SAMPLING_CHECKS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "temperature": ("--temperature", check_temperature),
    "top_p": ("--top-p", check_top_p),
    "max_tokens": ("--max-tokens", partial(check_integer, low=1)),
    "samples": ("--samples", _samples),
}


def check_sampling(values: dict[str, Any]) -> None:
    """The CLI's check of each sampling value given (None: the suite's); the first bad one is one line."""
    for key, (option, check) in SAMPLING_CHECKS.items():
        if values.get(key) is not None:
            check(option, values[key])


def _parse_sampling(value: Any, problems: _Problems) -> dict[str, float | int]:
    if value is None:
        return dict(SAMPLING_DEFAULTS)
    if not isinstance(value, dict):
        problems.add(f"sampling is {short(value)}, not a mapping")
        return dict(SAMPLING_DEFAULTS)
    _unknown(value, tuple(SAMPLING_DEFAULTS), "sampling.", problems)
    for key, given in value.items():
        if key not in SAMPLING_CHECKS:
            continue
        option, check = SAMPLING_CHECKS[key]
        try:
            check(option, given)
        except UserError as err:  # the flag's rule, said of the key that set it
            problems.add(str(err).replace(option, f"sampling.{key}", 1))
    return {**SAMPLING_DEFAULTS, **{k: v for k, v in value.items() if k in SAMPLING_DEFAULTS}}


def _parse_suite(doc: dict[str, Any], path: Path, sha: str, problems: _Problems) -> Suite:
    _unknown(doc, SUITE_KEYS, "", problems)
    name = _text(doc, "name", problems)
    if name:
        try:  # a group runs each of its suites into OUT/NAME
            plain_name(name, "name")
        except UserError as err:
            problems.add(str(err))
    data_file, hub = _parse_data(doc.get("data"), path.parent, problems)
    prompt = _text(doc, "prompt", problems)
    if prompt and prompt not in PROMPTS and "{problem}" not in prompt:
        problems.add(f"prompt {prompt!r} is neither {' nor '.join(PROMPTS)} nor a text holding {{problem}}")
    grader = _text(doc, "grader", problems)
    if grader:
        try:
            get_grader(grader)
        except UserError as err:
            problems.add(str(err))
    size = doc.get("size")
    if size is not None and (type(size) is not int or size < 0):
        problems.add(f"size is {short(size)}, not a count")
    return Suite(
        name=name,
        title=_text(doc, "title", problems, required=False) or name,
        data_file=data_file,
        template=prompt,
        grader=grader,
        hub=hub,
        size=size if type(size) is int else None,
        license=_text(doc, "license", problems, required=False),
        sampling=_parse_sampling(doc.get("sampling"), problems),
        metrics=_names(doc.get("metrics", list(METRICS)), "metrics", problems, METRICS),
        group_by=_names(doc.get("group_by", []), "group_by", problems, GROUP_FIELDS),
        path=path,
        sha256=sha,
    )
