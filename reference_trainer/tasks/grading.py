"""Grading one response: math by the answer a careful grader reads (`answer_extraction`), parsed by
math-verify and compared exactly where both sides are exact (`answer_equality`); Knights-and-Knaves by the
stated assignment (`kk_answers`); and the equivalence classes of a problem's answers for majority voting.
`GRADERS` is the one table of the names a suite (or a task's chat prompt) uses: each name's grading, its
answer classes and its prompt's instruction; a suite's own `python:module:function` is looked up there too.

The answer's own text is parsed as if boxed, with math-verify's box pattern only: a value that does not
parse stays text, rather than taking a number from inside it. A response that states no answer is read by
math-verify within its last clause; the gold the same way, plus what the suites' gold format needs
(docs/eval.md, "The gold format").

Model output is untrusted text: nothing here evaluates it (no eval/exec/sympify). math-verify parses LaTeX
with its own grammar and plain expressions only of digits and operators. Every call runs in a forked worker
of `rlbench.eval.pool.GradingPool` with a wall-clock limit, and math-verify's own (signal) limit inside.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.tasks import answer_equality
from reference_trainer.tasks.answer_context import (
    answers_another_quantity,
    named_matrix_reading,
    option_readings,
)
from reference_trainer.tasks.answer_extraction import MAX_RESPONSE_CHARS as MAX_RESPONSE_CHARS
from reference_trainer.tasks.answer_extraction import LocatedAnswer, locate_answer
from reference_trainer.tasks.answer_forms import CLOCK_24H, chain_end, clean_value, clock_24h, text_only
from reference_trainer.tasks.answer_forms import prose_start as prose_start
from reference_trainer.tasks.kk_answers import format_assignment, parse_free_form_assignment
from reference_trainer.tasks.user_grader import grade_with, is_user_grader

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
KK_INSTRUCTION = (
    "Think step by step about who is telling the truth. Then give your final answer after the line "
    '"CONCLUSION:", one person per line, in the form "(1) Name is a knight" or "(2) Name is a knave".'
)

VERIFY_TIMEOUT_S = 1  # math-verify's own (signal) limit per parse or comparison, in whole seconds
RETRY_VERIFY_TIMEOUT_S = 3  # the limit of the one retry after a timeout (a busy CPU, not the answer)
MATH_VERIFY_TIMED_OUT = "math-verify timed out"


class GradingTimeout(Exception):
    """math-verify gave up on a comparison within its limit: the result may be the timeout's, not the
    answers'. Raised where no result can say so (answer classes), so that the pool retries the item."""


# ----------------------------------------------------------------------------- math-verify's log


class _TimeoutCounter(logging.Handler):
    """math-verify logs each timeout as a warning holding the whole unparsed answer (kilobytes on stderr).
    Count them instead, so the grade can say "timed out" in one line that names the problem."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Timeout"):
            self.count += 1


_timeouts = _TimeoutCounter()
_mv_log = logging.getLogger("math_verify")
if _timeouts not in _mv_log.handlers:
    _mv_log.addHandler(_timeouts)
_mv_log.propagate = False  # nothing of math-verify's reaches the root logger (nor Python's last resort)


# ----------------------------------------------------------------------------- parsing


def _text_configs() -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _value_configs() -> tuple[Any, ...]:
    from math_verify import LatexExtractionConfig

    # The box only: a value that does not parse is not searched for a number to take instead.
    return (LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),)


def parse_value(value: str, timeout_s: int = VERIFY_TIMEOUT_S) -> list[Any]:
    """math-verify's parse of an answer's own LaTeX: [sympy object, (other readings,) normalised text], or
    [text] when it does not parse or is text only (`answer_forms.text_only`); [] when it contradicts itself
    (`contradicts_approximation`)."""
    from math_verify import parse

    if text_only(value):  # its own text, not math-verify's normalisation (which drops "\text{ hundred}")
        return [re.sub(r"\s+", "", value)]
    answer_equality.install_exact_comparison()
    value = chain_end(value)
    parsed = parse(f"\\boxed{{{value}}}", _value_configs(), parsing_timeout=timeout_s)
    if parsed and (as_set := answer_equality.relations_as_set(value, parsed[0])) is not None:
        parsed = [as_set, *parsed[1:]]
    if parsed and answer_equality.contradicts_approximation(value, parsed[0]):
        return []  # "x = 1/3 \\approx 11": no value a grader can sign
    more: list[Any] = []  # other readings of the same text, compared too (the matched text stays last)
    if m := CLOCK_24H.fullmatch(value):  # "20:34" is also the clock time 8:34 P.M. (a gold's time is text)
        more.append(f"\\text{{{clock_24h(int(m.group(1)), m.group(2))}}}")
    for reading in other_readings(value):
        more += parse(f"\\boxed{{{reading}}}", _value_configs(), parsing_timeout=timeout_s)[:1]
    if more and parsed and isinstance(parsed[-1], str):
        return [*parsed[:-1], *more, parsed[-1]]
    return [*parsed, *more]


_DECIMAL_COMMA = re.compile(r"-?\d+,\d{1,2}")  # "1,22": not thousands (3 digits after the comma)
# Groups of assignments: "p = 5, q = 2 \\quad \\text{and} \\quad p = 7, q = 2", "p=5,q=2;p=7,q=2"
_GROUP_SEPARATOR = re.compile(r"\s*(?:;|(?:\\q?quad\s*)?\\text\{\s*(?:and|or)\s*\}(?:\s*\\q?quad)?)\s*")


def other_readings(value: str) -> list[str]:
    """Other texts the same answer reads as: a decimal comma ("1,22" is also 1.22, as math-verify reads
    "0,111"), one \\pm ("f(x) = \\pm x" is the list f(x) = x, f(x) = -x) and groups of assignments (each a
    tuple: "p=5,q=2;p=7,q=2" is (p=5, q=2), (p=7, q=2))."""
    readings = []
    if _DECIMAL_COMMA.fullmatch(value.strip()):
        readings.append(value.replace(",", "."))
    if value.count("\\pm") == 1 and "," not in value:
        readings.append(f"{value.replace(chr(92) + 'pm', '+')}, {value.replace(chr(92) + 'pm', '-')}")
    groups = _GROUP_SEPARATOR.split(value)
    if len(groups) > 1 and all("," in g and "=" in g for g in groups):
        readings.append(", ".join(f"({g.strip()})" for g in groups))
    return readings


def parse_text(text: str, timeout_s: int = VERIFY_TIMEOUT_S) -> list[Any]:
    """math-verify's parse of a clause that states no answer: its rightmost expression."""
    from math_verify import parse

    answer_equality.install_exact_comparison()
    parsed = parse(text, _text_configs(), parsing_timeout=timeout_s)
    if len(parsed) == 2 and not isinstance(parsed[0], str) and isinstance(parsed[1], str):
        # math-verify keeps the text of the best match even when that text does not parse, and then takes
        # its value from a lower-ranked match: "... a power of 2. ... integers $x_1, x_2, \ldots$ ..." gave
        # [2, 'x_{1}, x_{2}, ...']. The answer is the matched text; it keeps a value only if it has one.
        alone = parse(f"${parsed[1]}$", _text_configs(), parsing_timeout=timeout_s)
        if not alone or isinstance(alone[0], str) or text_only(parsed[1]):
            return [parsed[1]]
    return parsed


def parse_answer(response: str, timeout_s: int = VERIFY_TIMEOUT_S, problem: str = "") -> list[Any]:
    """The response's answer (`answer_extraction.locate_answer`; `problem`, where known, is the problem
    statement) parsed: [sympy object, text], [text] when it does not parse, [] when the response gives no
    answer (or a hedge: different answers under conditions)."""
    return parse_located(locate_answer(response, problem), timeout_s)


def parse_located(located: LocatedAnswer | None, timeout_s: int = VERIFY_TIMEOUT_S) -> list[Any]:
    if located is None or located.hedged:
        return []
    if located.value is not None:
        return parse_value(located.value, timeout_s)
    return parse_text(located.text, timeout_s)


def answer_text(parsed: Sequence[Any]) -> str | None:
    """The extracted answer as text (the string math-verify matched, normalised), for rows and reports."""
    if not parsed:
        return None
    text = parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])
    return text.strip() or None


_LETTER_LHS = re.compile(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*=([^=]+)")
# A name for the value, not a formula: letters, subscripts, ratios of names, \angle ("S_{MBCN}:S", "AB").
_LABEL_LHS = re.compile(
    r"\s*((?:\\(?:angle|triangle|overline)\s*)?\{?[A-Za-z]+(?:_\{?\w+\}?)?\}?\s*[:/]?\s*)+=([^=]+)"
)
_PERCENT = re.compile(r"\s*\\?%\s*$")


@functools.lru_cache(maxsize=256)  # a problem's K samples share one gold, usually in one worker's chunk
def parse_gold(gold: str, timeout_s: int = VERIFY_TIMEOUT_S) -> tuple[Any, ...]:
    """The gold's candidates for math-verify's `verify` (a prediction matching any one is correct)."""
    text = gold.strip()
    cut = prose_start(text)
    formula = text[:cut].strip().rstrip(",;:").strip() if cut else ""
    if formula:  # the formula before the words, or the whole text verbatim (never its parse)
        whole = [s for s in parse_value(text, timeout_s) if isinstance(s, str)]
        return tuple(parse_value(clean_value(formula), timeout_s) + whole)
    labelled: list[Any] = []
    if m := _LETTER_LHS.fullmatch(text):
        letter = text.split("=", 1)[0].strip()[0].lower()
        if letter not in re.sub(r"\\[A-Za-z]+", "", m.group(1)).lower():  # "y=-2x+1" is also the line
            labelled = [v for v in parse_value(clean_value(text), timeout_s) if not isinstance(v, str)]
        text = m.group(1).strip()
    elif (m := _LABEL_LHS.fullmatch(text)) and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", m[2])):
        labelled = parse_value(clean_value(m[2]), timeout_s)  # "S_{MBCN}:S=7:32" is also its value, 7:32
    text = clean_value(text)
    candidates = parse_value(text, timeout_s) + labelled
    if _PERCENT.search(text):
        candidates += parse_value(_PERCENT.sub("", text), timeout_s)
    return tuple(candidates)


def equivalent(gold: Sequence[Any], pred: Sequence[Any], timeout_s: int = VERIFY_TIMEOUT_S) -> bool:
    return answer_equality.equivalent(gold, pred, timeout_s)


def grade_math(
    response: str, gold: str, timeout_s: int = VERIFY_TIMEOUT_S, problem: str = ""
) -> tuple[str | None, bool]:
    """(extracted answer text, correct) for one response against the gold; `problem` is the problem
    statement where known (a clause that only repeats it gives way to a result stated before it; an
    option's text reads as its letter)."""
    pred = parse_answer(response, timeout_s, problem)
    extracted = answer_text(pred)
    if extracted is None or answers_another_quantity(extracted, gold, problem):
        return extracted, False
    golds = parse_gold(gold, timeout_s)
    if equivalent(golds, pred, timeout_s):
        return extracted, True
    located = locate_answer(response, problem)
    own = (located.value if located else None) or extracted  # as written: math-verify's drops "\\mathbf{I}"
    readings = option_readings(own, problem)
    if (matrix := named_matrix_reading(own, gold)) is not None:
        readings.append(matrix)
    return extracted, any(equivalent(golds, parse_value(r, timeout_s), timeout_s) for r in readings)


# ----------------------------------------------------------------------------- knights and knaves


def kk_gold(answer: str, names: Sequence[str], solution: Sequence[bool] | None) -> dict[str, bool]:
    if solution is not None and len(solution) == len(names):
        return {n: bool(s) for n, s in zip(names, solution, strict=True)}
    parsed = parse_free_form_assignment(answer, names)
    if parsed is None:
        raise ValueError(f"cannot read the gold K&K assignment from {answer!r}")
    return parsed


def format_kk_assignment(assignment: dict[str, bool]) -> str:
    return format_assignment(list(assignment), list(assignment.values()))


# ----------------------------------------------------------------------------- items


@dataclass
class GradeItem:
    grader: str  # a name of GRADERS, or "python:module:function" (a suite's own, user_grader.py)
    response: str
    gold: str
    names: list[str] | None = None
    solution: list[bool] | None = None
    id: str = ""  # "problem-id#sample", named in the one line a failure logs
    verify_timeout_s: int = VERIFY_TIMEOUT_S  # longer on the one retry after a timeout
    problem: str = ""  # the problem statement (maths: a clause that only repeats it gives way, rule 5)
    second: bool = True  # the pool also grades it by the second grader (second_opinion.grade_both)


@dataclass
class GradeResult:
    extracted: str | None
    correct: bool
    error: str | None = None
    key: str | None = None  # the extracted answer as voted on (equal keys are one answer)
    extra: dict[str, Any] = field(default_factory=dict)
    retried: bool = False  # the first attempt timed out; this is the retry's verdict (GradingPool)
    # the second grader's reading and verdict (second_opinion.py; None: a suite's own grader has none)
    second_extracted: str | None = None
    second_correct: bool | None = None


def _grade_user(item: GradeItem) -> GradeResult:
    extracted, correct = grade_with(item.grader, item.response, item.gold)
    return GradeResult(extracted=extracted, correct=correct, key=extracted)


def _grade_kk(item: GradeItem) -> GradeResult:
    names = item.names or []
    pred = parse_free_form_assignment(item.response, names)
    if pred is None:
        return GradeResult(extracted=None, correct=False)
    text = format_kk_assignment(pred)
    return GradeResult(extracted=text, correct=pred == kk_gold(item.gold, names, item.solution), key=text)


def _grade_math(item: GradeItem) -> GradeResult:
    before = _timeouts.count
    extracted, correct = grade_math(item.response, item.gold, item.verify_timeout_s, item.problem)
    # A timeout inside math-verify makes parse/verify give up quietly: a wrong grade may be the timeout's.
    error = MATH_VERIFY_TIMED_OUT if _timeouts.count > before and not correct else None
    return GradeResult(extracted=extracted, correct=correct, error=error, key=extracted)


def grade_item(item: GradeItem) -> GradeResult:
    """Extract and grade one response; runs inside a pool worker (`second_opinion.grade_both` adds the
    second grader's verdict)."""
    return get_grader(item.grader).grade(item)


# ----------------------------------------------------------------------------- the graders


@dataclass(frozen=True)
class Grader:
    """What a grader's name (a suite's `grader:`, `prompt:`) stands for: how a response is graded, how a
    problem's answers are grouped for majority voting, the instruction of the prompt of the same name, and
    the problem fields it needs beyond id, problem and answer."""

    name: str
    title: str  # in a one-line error about a problem
    grade: Callable[[GradeItem], GradeResult]
    # True: answers that differ as text may still be equal (math-verify compares them, in the pool); False:
    # an answer's text is canonical, so equal texts are one answer.
    compares_answers: bool
    instruction: str | None = None  # what the prompt `name` asks after the problem; None: no such prompt
    needs: tuple[str, ...] = ()


GRADERS: dict[str, Grader] = {
    "math": Grader("math", "math", _grade_math, compares_answers=True, instruction=MATH_INSTRUCTION),
    "kk": Grader(
        "kk", "K&K", _grade_kk, compares_answers=False, instruction=KK_INSTRUCTION, needs=("names",)
    ),
}
# The prompts a suite may name (`prompt:`): the graders' instructions.
PROMPTS = {name: g.instruction for name, g in GRADERS.items() if g.instruction is not None}


def get_grader(name: str) -> Grader:
    """The grader `name` names: one of GRADERS, or a suite's own `python:module:function` (user_grader.py);
    any other name is one line."""
    if is_user_grader(name):
        return Grader(name, name, _grade_user, compares_answers=False)
    if name not in GRADERS:
        raise UserError(f"grader {name!r} is not {', '.join(GRADERS)} or python:module:function")
    return GRADERS[name]


# ----------------------------------------------------------------------------- majority voting


@dataclass
class VoteItem:
    """One problem's answers to group: `keys[i]` is sample i's extracted answer (None: no answer) and
    `responses[i]` its response, which is parsed again to compare answers that differ as text."""

    grader: str
    keys: list[str | None]
    responses: list[str]
    id: str = ""
    verify_timeout_s: int = VERIFY_TIMEOUT_S
    problem: str = ""


def answer_classes(item: VoteItem) -> list[int | None]:
    """Equivalence class of every sample's answer, numbered in order of first appearance (None: no
    answer). Equal texts are one class; a new text joins the first earlier class whose first answer
    math-verify finds equivalent to it (as gold), else opens a class, where the grader compares answers
    (`Grader.compares_answers`; K&K answers are canonical texts).
    Raises GradingTimeout when math-verify timed out, as a class may then be the timeout's."""
    before = _timeouts.count
    compares = get_grader(item.grader).compares_answers
    label: dict[str, int] = {}
    reps: list[list[Any]] = []  # parsed first answer of each class
    for key, response in zip(item.keys, item.responses, strict=True):
        if key is None or key in label:
            continue
        if not compares:
            label[key] = len(label)
            continue
        parsed = parse_answer(response, item.verify_timeout_s, item.problem)
        found = next(
            (c for c, rep in enumerate(reps) if equivalent(rep, parsed, item.verify_timeout_s)), None
        )
        if found is None:
            found = len(reps)
            reps.append(parsed)
        label[key] = found
    if _timeouts.count > before:
        raise GradingTimeout(MATH_VERIFY_TIMED_OUT)
    return [None if k is None else label[k] for k in item.keys]


def text_classes(keys: Sequence[str | None]) -> list[int | None]:
    """Classes by exact text: the fallback when comparing a problem's answers failed or timed out."""
    label: dict[str, int] = {}
    for k in keys:
        if k is not None:
            label.setdefault(k, len(label))
    return [None if k is None else label[k] for k in keys]
