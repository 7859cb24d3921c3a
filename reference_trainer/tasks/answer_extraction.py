"""Which part of a response is its answer: the policy a careful human grader applies, the same in every suite.

math-verify's `parse` ranks its patterns by kind (a box first, then "final answer", "answer:", and the last
expression) and reads the whole text at once, so a box wins over a later correction ("\\boxed{204} ... I must
add 24 more: the answer is 228."), the boxes of a response are joined into one answer when anything with a
comma separates them ("So \\boxed{3}. Wait, recheck: \\boxed{5}" gives 3,5), and its last-number fallback
fires on a negated or cut-off sentence ("The answer is not 204; it is 210." gives 204). It has no option for
any of these, so the answer is located here and only the answer's own text is handed to math-verify to parse.

An answer statement is a box or an answer phrase; the rules that pick the answer, numbered 1 to 5 (the
numbers the comments here cite), are docs/eval.md's "Which answer counts". Text after a chat template's
turn marker ("<|im_start|>") is another turn, not the response.
"""

from __future__ import annotations

import re

from reference_trainer.tasks.answer_boxes import box_answers
from reference_trainer.tasks.answer_clause import ends_complete as ends_complete
from reference_trainer.tasks.answer_clause import last_clause
from reference_trainer.tasks.answer_phrases import PHRASE_IN_MATHS, statement_answers, whole_answer
from reference_trainer.tasks.answer_text import (
    CONDITION,
    CORRECTION,
    MATHS_SPAN,
    MAX_LABEL_GAP_CHARS,
    MAX_RESPONSE_CHARS,
    SENTENCE_END,
    LocatedAnswer,
    mask_math,
)

__all__ = ["MAX_RESPONSE_CHARS", "LocatedAnswer", "ends_complete", "locate_answer", "own_turn"]

_MAX_HEDGE_SPAN_CHARS = 200  # two answers further apart than this are not one hedged sentence pair


def _hedges(masked: str, before: LocatedAnswer, last: LocatedAnswer) -> bool:
    """Are the last two statements different answers under conditions, with no correction between them
    ("If order matters the answer is \\boxed{6}; if not, it is \\boxed{3}.")?"""
    if before.hedged or last.hedged or before.value == last.value:
        return False
    too_far = last.start - before.start > _MAX_HEDGE_SPAN_CHARS
    if too_far or CORRECTION.search(masked, before.start, last.start):
        return False
    sentence_end = SENTENCE_END.search(masked, last.start)
    end = sentence_end.start() if sentence_end else len(masked)
    return CONDITION.search(masked, max(0, before.start - MAX_LABEL_GAP_CHARS), end) is not None


# Doubt about the stated answer, offering another: "I think the answer is 12, but ... It could be 13."
_DOUBT = re.compile(
    r"\b(?:it|answer|this|that|value|result)\s+(?:could|might|may)\s+(?:also\s+)?be\b|\bor\s+(?:maybe|perhaps)\b",
    re.IGNORECASE,
)
# A chat template's turn marker: what follows is another turn (a hallucinated user), not this response.
_TURN_MARKER = re.compile(
    r"<\|(?:im_start|im_end|eot_id|endoftext|start_header_id|end_of_turn)\|>"
    r"|\n[ \t]*(?:\*\*)?(?:User|Human|USER|HUMAN)(?:\*\*)?[ \t]*:"  # a turn written as text: "\n\nUser: ..."
)


def _doubted(masked: str, last: LocatedAnswer) -> bool:
    doubt = _DOUBT.search(masked, last.start + 1)
    if doubt is None:
        return False
    sentence_end = SENTENCE_END.search(masked, doubt.end())
    return (
        MATHS_SPAN.search(masked, doubt.end(), sentence_end.start() if sentence_end else len(masked))
        is not None
    )


# After the last statement, words that take it back: what the response concludes after them is its answer.
_RETRACTION = re.compile(
    r"\b(?:wait|actually|oops|sorry|mistakes?|mistaken|wrong|incorrect|errors?|redo\w*|re-?calculat\w*|"
    r"re-?comput\w*|re-?count\w*|re-?do\w*|re-?evaluat\w*|should\s+(?:be|have|include)|on\s+second\s+thought|"
    r"let\s+me\s+re\w*|correction)\b",
    re.IGNORECASE,
)
_LEFT_OF_BOX = re.compile(r"([^$=<>]{1,40})=\s*$")  # "m + n = " before "\boxed{3}"


def _later_commitment(text: str, masked: str, last: LocatedAnswer, problem: str) -> LocatedAnswer | None:
    """What the response commits to after its last statement, `last` when nothing: a box taken back
    ("... = \\boxed{3}$. Wait, ... Redoing it gives ..., so $m + n = 4$.") answers what follows the
    retraction; the quantity the box equated, stated again with
    another value ("m + n = \\boxed{3}" ... "so $m + n = 4$."), answers that value."""
    after = SENTENCE_END.search(masked, max(last.start, last.end))
    if after is None or not text[after.end() :].strip():
        return last
    tail = after.end()
    retraction = _RETRACTION.search(masked, tail)
    if retraction is None and not _restates_left_side(text, last, tail):
        return last
    later = last_clause(text[tail:], problem)
    if later is not None and (later.value is not None or later.text):
        return LocatedAnswer(tail + later.start, later.value, later.text)
    return last  # taken back with nothing after it: the statement stands, as a reader would mark it


def _restates_left_side(text: str, last: LocatedAnswer, tail: int) -> bool:
    left = _LEFT_OF_BOX.search(text, max(0, last.start - 40), last.start)
    if left is None or not re.search(r"[A-Za-z]", left.group(1)):
        return False
    name = re.sub(r"\s+|\$", "", left.group(1).split("$")[-1])
    return bool(name) and f"{name}=" in re.sub(r"\s+|\$", "", text[tail:])


def own_turn(response: str) -> str:
    """The response up to the first turn marker that follows some text of its own."""
    for marker in _TURN_MARKER.finditer(response):
        if response[: marker.start()].strip():
            return response[: marker.start()]
    return response


def locate_answer(response: str, problem: str = "") -> LocatedAnswer | None:
    """The response's answer under the policy (docs/eval.md); None when it gives none. `problem` is the
    problem statement, where known (rule 5)."""
    text = PHRASE_IN_MATHS.sub(r"\2: \1 ", own_turn(response[-MAX_RESPONSE_CHARS:]))
    stated = sorted(box_answers(text) + statement_answers(text), key=lambda a: a.start)
    masked = mask_math(text) if stated else ""
    if stated and (
        len(stated) > 1 and _hedges(masked, stated[-2], stated[-1]) or _doubted(masked, stated[-1])
    ):
        return LocatedAnswer(stated[-1].start, hedged=True)
    if stated:
        return _later_commitment(text, masked, stated[-1], problem)
    return whole_answer(text) or last_clause(text, problem)
