"""A second grader beside rlbench's own, so that every eval states how much its score owes to the grader:
plain math-verify as released for maths, the training reward's strict reader for Knights-and-Knaves (what
each reads: docs/eval.md, "A second grader on every eval"). Both graders' versions are recorded with every
score (`grader_versions`); `answer_type` names the kind of a gold, so that disagreements count by kind.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from reference_trainer.tasks import answer_equality
from reference_trainer.tasks.grading import GradeItem, GradeResult, grade_item, kk_gold
from reference_trainer.tasks.kk import parse_compact_assignment

# The version of rlbench's grading rules: changed with any rule of docs/eval.md's grading policy, so that a
# score names the rules that made it (the date the rules last changed, and a counter for that day).
RULES_VERSION = "2026-11-29.1"
SECOND_GRADER = {"math": "math-verify", "kk": "strict K&K reader"}


@functools.cache
def grader_versions() -> dict[str, str]:
    """{"rlbench": rules version, "math-verify": installed version}, as recorded in results.json."""
    try:
        mv = metadata.version("math-verify")
    except metadata.PackageNotFoundError:  # an editable or vendored copy: its own attribute, if any
        mv = "unknown"
    return {"rlbench": RULES_VERSION, "math-verify": mv, "strict K&K reader": RULES_VERSION}


def second_math(response: str, gold: str, timeout_s: int) -> tuple[str | None, bool]:
    """(what math-verify extracted, correct) under plain math-verify."""
    from math_verify import parse, verify

    answer_equality.install_exact_comparison()  # so that the swap below has rlbench's to put back
    with answer_equality.math_verify_as_released():
        pred = parse(response, parsing_timeout=timeout_s)
        golds = parse(f"${gold}$", parsing_timeout=timeout_s)
        correct = bool(pred and golds and verify(golds, pred, timeout_seconds=timeout_s))
    extracted = (pred[-1] if isinstance(pred[-1], str) else str(pred[0])) if pred else None
    return extracted or None, correct


_CONCLUSION = re.compile(r"^[ \t#*_>]*conclusion\b", re.IGNORECASE | re.MULTILINE)


def second_kk(response: str, names: Sequence[str], solution: Sequence[bool]) -> tuple[str | None, bool]:
    """(the roles read, correct) under the strict reader."""
    blocks = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL | re.IGNORECASE)
    markers = list(_CONCLUSION.finditer(response))
    stated = blocks[-1] if blocks else response[markers[-1].end() :] if markers else response
    roles = parse_compact_assignment(stated, list(names))
    if roles is None:
        return None, False
    text = ", ".join(f"{n}: {'knight' if k else 'knave'}" for n, k in roles.items())
    return text, [roles[n] for n in names] == list(solution)


_NUMBER = re.compile(r"-?\d+")
_GROUPED = re.compile(r"-?\d{1,3}(?:(?:,|\{,\})\d{3})+")
_CONSTANT = re.compile(r"[-\d\\{}^()+*/.]*(?:sqrt|pi|e\^|log|sin|cos|tan)[-\w\\{}^()+*/.]*")
_DECIMAL = re.compile(r"-?\d*\.\d+")
_FRACTION = re.compile(r"-?\\d?frac\{-?\d+\}\{\d+\}|-?\d+/\d+")


def answer_type(gold: str, grader: str) -> str:
    """The kind of a gold, for counting disagreements: integer, decimal, fraction, radical or constant,
    expression, equation, interval, tuple or list, matrix, text, or K&K."""
    if grader == "kk":
        return "K&K"
    text = re.sub(r"\s+|\\[,;!]|\\left|\\right|\$", "", gold)
    checks: list[tuple[str, Any]] = [
        ("integer", _NUMBER.fullmatch(text) or _GROUPED.fullmatch(text)),
        ("decimal", _DECIMAL.fullmatch(text)),
        ("fraction", _FRACTION.fullmatch(text)),
        ("matrix", "matrix" in text),
        ("interval", re.fullmatch(r"[\[(].*,.*[\])](?:\\cup[\[(].*[\])])*", text) and "infty" in text),
        ("tuple or list", "," in text),
        ("equation", "=" in text or "<" in text or ">" in text or "\\le" in text or "\\ge" in text),
        ("text", re.fullmatch(r"(?:\\text\{[^{}]*\}|[A-Za-z ]{2,})", text)),
        ("radical or constant", _CONSTANT.fullmatch(text) and not re.search(r"(?<!\\)\b[a-df-z]\b", text)),
    ]
    return next((name for name, ok in checks if ok), "expression")


def grade_both(item: GradeItem) -> GradeResult:
    """`grading.grade_item`, with the second grader's reading and verdict where the item's grader has one
    (maths, K&K) and the item asks for it; the grading pool's default."""
    result = grade_item(item)
    if not item.second:
        return result
    if item.grader == "math":
        result.second_extracted, result.second_correct = second_math(
            item.response, item.gold, item.verify_timeout_s
        )
    elif item.grader == "kk":
        solution = list(kk_gold(item.gold, item.names or [], item.solution).values())
        result.second_extracted, result.second_correct = second_kk(item.response, item.names or [], solution)
    return result
