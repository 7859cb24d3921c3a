"""Boxes (rule 1 of docs/eval.md): every box, and the runs of boxes that separators, labels or
successive parts join into one answer, a list; boxes joined under a condition are a hedge."""

from __future__ import annotations

import re

from reference_trainer.tasks.answer_forms import clean_value
from reference_trainer.tasks.answer_text import (
    BOX,
    CONDITION,
    CORRECTION,
    MAX_LABEL_GAP_CHARS,
    MAX_SENTENCE_CHARS,
    SENTENCE_END,
    LocatedAnswer,
    mask_math,
)

# What may stand between boxes that list one answer: math delimiters, spacing, commas, "and", "or".
_LIST_SEPARATOR = re.compile(
    r"(?:\s|\$|\\[()\[\]]|[,;&~]|\\[,;:! ]|\\q?quad|\band\b|\bor\b|\\text\{\s*(?:and|or)\s*\})*"
)


def _closing_braces(text: str) -> dict[int, int]:
    """The position of the closing brace of every balanced opening one, in one pass (a scan per box
    would be quadratic in a response of nested or unclosed boxes)."""
    stack: list[int] = []
    closing: dict[int, int] = {}
    for m in re.finditer(r"[{}]", text):
        if m.group(0) == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    return closing


def boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete box that is not inside another, in order; an unfinished
    box (cut off) states nothing."""
    closing = _closing_braces(text) if "\\boxed" in text or "\\fbox" in text else {}
    found: list[tuple[int, int, str]] = []
    for m in BOX.finditer(text):
        end = closing.get(m.end() - 1)
        if end is not None and (not found or m.start() >= found[-1][1]):
            found.append((m.start(), end + 1, text[m.end() : end].strip()))
    return found


# Between boxes of one sentence: labels joined by a comma or "and" list parts of one answer ("\\boxed{1}
# papers and \\boxed{2} bins"); a condition makes them a hedge ("\\boxed{3} if unordered, and \\boxed{6} if
# ordered"); a correction or a consequence makes the later box a statement of its own.
_JOINING_WORDS = re.compile(r",|\band\b", re.IGNORECASE)
_CONSEQUENCE_OR_NEGATION = re.compile(
    r"\b(?:so|thus|hence|therefore|gives?|giving|then|let|final|no|not)\b|n't\b|=", re.IGNORECASE
)


def _gap_joins(gap: str, words: str) -> bool:
    """Do the words between two boxes (`gap`, and `words`: the gap with its maths masked) make them parts
    of one answer (or of one hedge)?"""
    if _LIST_SEPARATOR.fullmatch(gap):
        return True
    return (
        len(gap) <= MAX_LABEL_GAP_CHARS
        and SENTENCE_END.search(words) is None
        and CORRECTION.search(words) is None
        and _CONSEQUENCE_OR_NEGATION.search(words) is None
        and _JOINING_WORDS.search(words) is not None
    )


_TEXT_WORDS = re.compile(r"\\text\s*\{([^{}]*)\}")


def _gap_words(text: str, masked: str, a: int, b: int) -> str:
    """The words between two boxes: the gap with its maths masked, and the words of its `\\text{}` (boxes
    inside one display: "$$\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}$$")."""
    return masked[a:b] + " " + " ".join(_TEXT_WORDS.findall(text, a, b))


def box_answers(text: str) -> list[LocatedAnswer]:
    """One answer per run of boxes that separators or labels join (a list of answers); a box with a
    sentence end, a correction or a consequence before the next one is an answer of its own
    ("\\boxed{3}. Wait: \\boxed{5}")."""
    answers: list[LocatedAnswer] = []
    run: list[tuple[int, int, str]] = []
    masked = mask_math(text)
    for box in boxes(text):
        if (
            run
            and not _gap_joins(text[run[-1][1] : box[0]], _gap_words(text, masked, run[-1][1], box[0]))
            and not _next_part(text, run[-1], box)
        ):
            answers.append(_join(run, masked))
            run = []
        run.append(box)
    if run:
        answers.append(_join(run, masked))
    return [a for a in answers if a.value or a.hedged]


# A part's label ("(a)", "b)", "(ii)", "Part 2"): boxes of successive parts are one answer, a list.
_PART = r"(?:\(([a-h]|[ivx]{1,4}|\d)\)|\b([a-h])\)|\bpart\s*\(?([a-h]|\d)\b\)?)"
_PART_GAP = re.compile(rf"[\s,;.$]*(?:and\s+)?[*_]*{_PART}[*_]*[\s:.$]*", re.IGNORECASE)
_PART_LINE = re.compile(rf"^[ \t>#*_-]*{_PART}", re.IGNORECASE | re.MULTILINE)
_ROMAN = ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"]


def _label(m: re.Match[str]) -> str:
    return (m.group(1) or m.group(2) or m.group(3)).lower()


def _follows(before: str, after: str) -> bool:
    if before in _ROMAN and after in _ROMAN:
        return _ROMAN.index(after) == _ROMAN.index(before) + 1
    return len(before) == len(after) == 1 and ord(after) == ord(before) + 1


def _next_part(text: str, before: tuple[int, int, str], box: tuple[int, int, str]) -> bool:
    """Is `box` the answer to the part after the one `before` answers: a part's label alone between them
    ("(a) \\boxed{3} (b) \\boxed{5}"), or lines labelled with successive parts ("(a) ... \\boxed{3}\\n(b) ...
    \\boxed{5}")?"""
    gap = text[before[1] : box[0]]
    if (m := _PART_GAP.fullmatch(gap)) is not None:
        first = list(_PART_LINE.finditer(text, max(0, before[0] - MAX_SENTENCE_CHARS), before[0]))
        return not first or _follows(_label(first[-1]), _label(m))
    first = list(_PART_LINE.finditer(text, max(0, before[0] - MAX_SENTENCE_CHARS), before[0]))
    second = list(_PART_LINE.finditer(text, before[1], box[0]))
    return bool(first and second) and _follows(_label(first[-1]), _label(second[-1]))


def _join(run: list[tuple[int, int, str]], masked: str) -> LocatedAnswer:
    contents = list(dict.fromkeys(clean_value(content) for _, _, content in run))  # a repeated box once
    if len(contents) > 1 and CONDITION.search(masked[run[0][1] : run[-1][0]]):
        return LocatedAnswer(run[0][0], hedged=True, end=run[-1][1])
    return LocatedAnswer(run[0][0], ", ".join(c for c in contents if c), end=run[-1][1])
