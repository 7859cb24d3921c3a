"""What an eval run's files hold, for the readers: a `problems.jsonl` row (runner.py `_problem_row`) and
`results.json` (runner.py `summarize`). A resume, `rlbench report` and the eval report read them back through
these checks, so a hand-edited or foreign file is one line naming the file and the first wrong field, before
anything trips over it (as trace/schema.py does for traces).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.schema import is_number

GROUP_FIELDS = ("subject", "level", "exam", "n_people")  # what results are grouped by


def is_text(value: Any) -> bool:
    """A str that can be written as UTF-8 (a lone surrogate such as \\ud800 cannot)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _list_of(ok: Callable[[Any], bool], nullable: bool = False) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) or (nullable and x is None) for x in v)


def _scalar(value: Any) -> bool:
    return is_text(value) or is_number(value)


# field -> (what it must be, the test); a row may hold more fields, which readers ignore
ROW_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "id": ("text", is_text),
    "gold": ("text", is_text),
    "correct": ("a list of true/false", _list_of(lambda x: isinstance(x, bool))),
    "n_correct": ("a count", _count),
    "avg": ("a number", is_number),
    "maj_correct": ("true or false", lambda v: isinstance(v, bool)),
    "grade_errors": ("a list of texts or nulls", _list_of(is_text, nullable=True)),
}
OPTIONAL_ROW_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "extracted": ("a list of texts or nulls", _list_of(is_text, nullable=True)),
    "answer_classes": ("a list of integers or nulls", _list_of(lambda x: type(x) is int, nullable=True)),
    "maj_answer": ("text or null", is_text),
    "response_chars": ("a list of counts", _list_of(_count)),
    "response_tokens": ("a list of counts or null", _list_of(_count)),
    "truncated_prompts": ("a count", _count),
    "responses": ("a list of texts", _list_of(is_text)),
    "second_extracted": ("a list of texts or nulls", _list_of(is_text, nullable=True)),
    "second_correct": (
        "a list of true/false or nulls",
        _list_of(lambda x: isinstance(x, bool), nullable=True),
    ),
    **{name: ("text or a number", _scalar) for name in GROUP_FIELDS},
}


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with one problems.jsonl row (or results.json problem), or None."""
    for name, (want, ok) in ROW_FIELDS.items():
        if name not in row:
            return f"lacks {name}"
        if not ok(row[name]):
            return f"{name} is {short(row[name])}, not {want}"
    for name, (want, ok) in OPTIONAL_ROW_FIELDS.items():
        if row.get(name) is not None and not ok(row[name]):
            return f"{name} is {short(row[name])}, not {want}"
    if row["n_correct"] > len(row["correct"]):
        return f"n_correct {row['n_correct']} exceeds its {len(row['correct'])} samples"
    return None


def check_results(doc: Any, source: Any) -> dict[str, Any]:
    """`doc` if it is a results.json the report can render, else a one-line UserError naming `source`."""
    if (why := _results_problem(doc)) is not None:
        raise UserError(f"{source}: {why}")
    return doc


def _results_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "not an eval's results (a JSON object)"
    for name in ("suite", "model", "engine", "template"):
        if not is_text(doc.get(name)):
            return f"{name} is {short(doc.get(name))}, not text"
    samples = doc.get("samples")
    if type(samples) is not int or samples < 1:
        return f"samples is {short(samples)}, not a positive integer"
    if not (is_number(doc.get("accuracy")) and 0 <= doc["accuracy"] <= 1):
        return f"accuracy is {short(doc.get('accuracy'))}, not a share between 0 and 1"
    if not _count(doc.get("problems_evaluated")):
        return f"problems_evaluated is {short(doc.get('problems_evaluated'))}, not a count"
    for name in ("pass_at_k", "maj_at_k"):
        table = doc.get(name)
        if not isinstance(table, dict) or str(samples) not in table:
            return f"{name} is {short(table)}, not a {{k: value}} table with k = {samples}"
        if not all(k.isdigit() and is_number(v) and 0 <= v <= 1 for k, v in table.items()):
            return f"{name} is {short(table)}, not a {{k: share between 0 and 1}} table"
    sampling = doc.get("sampling")
    numbers = ("temperature", "top_p", "max_tokens", "seed")
    if not isinstance(sampling, dict) or not all(is_number(sampling.get(k)) for k in numbers):
        return f"sampling is {short(sampling)}, not the sampling settings"
    for name in ("grading_failures", "truncated_prompts"):
        if doc.get(name) is not None and not _count(doc[name]):
            return f"{name} is {short(doc[name])}, not a count"
    groups = doc.get("by_group", {})
    if not isinstance(groups, dict) or not all(
        isinstance(rows, list) and all(isinstance(g, dict) and _scalar(g.get(field)) for g in rows)
        for field, rows in groups.items()
    ):
        return "by_group is not a {field: [groups]} table"
    problems = doc.get("problems", [])
    if not isinstance(problems, list):
        return "problems is not a list"
    for n, row in enumerate(problems, 1):
        if not isinstance(row, dict):
            return f"problem {n} is not an object"
        if (why := row_problem(row)) is not None:
            return f"problem {n}: {why}"
    return None


def short(value: Any) -> str:
    """A value as a message shows it: its repr, cut at 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
