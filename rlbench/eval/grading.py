"""Grading one response: math with math-verify's own extraction and equivalence, Knights-and-Knaves by the
stated assignment; and the equivalence classes of a problem's answers for majority voting.

Math extraction is math-verify's `parse` with explicit configurations. It tries its patterns in priority
order (lower first; within one priority the rightmost match wins):

    0    the last \\boxed{...}, or Qwen's "The final answer is $X$. I hope it is correct."
    50   "final answer ... is X"
    100  "answer: X" (200: "answer ... X")
    300  the last LaTeX or plain expression in the text

What is kept here is only what the project's data needs on top of it (each with a test):
  * a "final answer" sentence that states bare LaTeX ("Final answer: \\frac{3}{4}") is put in $...$ first,
    since math-verify reads LaTeX only inside math delimiters and would otherwise take the "3" alone;
  * the suite's gold format: golds are bare LaTeX (read as if boxed); a single-letter "N=" prefix is
    dropped (math-verify folds case, so "N=n" would parse as Eq(n, n)); a percentage also matches its bare
    number (62.5% = 62.5, as the Qwen harness grades); a gold with prose after its formula
    ("f(x)=ax+b, where b is ...") is graded by that formula, or by the whole text verbatim.

Model output is untrusted text: nothing here evaluates it (no eval/exec/sympify). math-verify parses LaTeX
with its own grammar and plain expressions only of digits and operators. Every call runs in a forked worker
of `rlbench.eval.pool.GradingPool` with a wall-clock limit.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.tasks.kk import format_assignment

MAX_RESPONSE_CHARS = 20_000  # only the tail can hold the final answer; bounds regex and parser work
_VERIFY_TIMEOUT_S = 1  # math-verify's own (signal) timeouts, inside the worker


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


# ----------------------------------------------------------------------------- extraction


def _configs() -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # boxed_match_priority=0: a boxed answer outranks every "answer:" phrase, as the prompt asks for one.
    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


# "Final answer: X" / "The final answer is X." / "... is X. I hope it is correct." up to the end of a line.
_FINAL_LINE = re.compile(
    r"(?P<lead>final answer(?:\s+is)?\s*:?\s*)(?P<ans>[^\n]*?)"
    r"(?P<tail>\s*(?:\.\s*(?:I hope it is correct\.?)?)?\s*)$",
    re.IGNORECASE | re.MULTILINE,
)
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")  # a \$ is a dollar sign
# LaTeX whose braces hold words, not maths: \text{even}, \begin{pmatrix}, \operatorname{lcm}.
_WORDY_COMMANDS = re.compile(
    r"\\(?:text\w*|math(?:rm|bf|it|sf|tt)|mbox|operatorname|begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+"
)
_PROSE_WORD = re.compile(r"(?<![A-Za-z])(?!and(?![A-Za-z]))[A-Za-z]{3,}(?![A-Za-z])")  # "1 and 2" is maths


def prose_start(text: str) -> int | None:
    """Where prose begins in a LaTeX answer: the first run of 3+ letters (but "and") outside LaTeX commands
    and their word arguments (single letters and pairs are variables: "2k+2", "mn"). None when none."""
    blanked = _WORDY_COMMANDS.sub(lambda m: " " * len(m.group(0)), text)
    m = _PROSE_WORD.search(blanked)
    return m.start() if m else None


def delimit_final_answer(text: str) -> str:
    """Put the answer of the last "final answer" sentence in $...$ when it has no math delimiters: the
    maths up to any prose ("5 apples" -> "$5$ apples"; "the answer is 5" is left to math-verify). The
    sentence's full stop is not part of it, so "4.9." stays 4.9."""
    found = list(_FINAL_LINE.finditer(text))
    if not found:
        return text
    m = found[-1]
    ans = m.group("ans")
    if _DELIMITED.search(ans):
        return text
    start = m.start("ans") + len(ans) - len(ans.lstrip(" *"))  # markdown bold around "Final answer:"
    cut = prose_start(text[start : m.end("ans")])
    end = m.end("ans") if cut is None else start + cut
    math = text[start:end].rstrip(" *,;:")
    if not re.search(r"[\w\\]", math):
        return text
    end = start + len(math)
    return f"{text[:start]}${math}${text[end:]}"


def parse_answer(response: str) -> list[Any]:
    """math-verify's parse of a response: [sympy object, extracted text] (or [text] when the text did
    not parse), [] when nothing answer-like is found."""
    from math_verify import parse

    text = delimit_final_answer(response[-MAX_RESPONSE_CHARS:])
    parsed = parse(text, _configs(), parsing_timeout=_VERIFY_TIMEOUT_S)
    if len(parsed) == 2 and not isinstance(parsed[0], str) and isinstance(parsed[1], str):
        # math-verify keeps the text of the best match even when that text does not parse, and then takes
        # its value from a lower-ranked match: "... a power of 2. ... integers $x_1, x_2, \ldots$ ..." gave
        # [2, 'x_{1}, x_{2}, ...']. The answer is the matched text; it keeps a value only if it has one.
        alone = parse(f"${parsed[1]}$", _configs(), parsing_timeout=_VERIFY_TIMEOUT_S)
        if not alone or isinstance(alone[0], str):
            return [parsed[1]]
    return parsed


def answer_text(parsed: Sequence[Any]) -> str | None:
    """The extracted answer as text (the string math-verify matched, normalised), for rows and reports."""
    if not parsed:
        return None
    text = parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])
    return text.strip() or None


_LETTER_LHS = re.compile(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*=([^=]+)")
_PERCENT = re.compile(r"\s*\\?%\s*$")


@functools.lru_cache(maxsize=256)  # a problem's K samples share one gold, usually in one worker's chunk
def parse_gold(gold: str) -> tuple[Any, ...]:
    """The gold's candidates for math-verify's `verify` (a prediction matching any one is correct)."""
    from math_verify import parse

    def boxed(s: str) -> list[Any]:
        return parse(f"\\boxed{{{s}}}", _configs(), parsing_timeout=_VERIFY_TIMEOUT_S)

    text = gold.strip()
    cut = prose_start(text)
    formula = text[:cut].strip().rstrip(",;:").strip() if cut else ""
    if formula:  # the formula before the words, or the whole text verbatim (never its parse)
        whole = [s for s in boxed(text) if isinstance(s, str)]
        return tuple(boxed(formula) + whole)
    if m := _LETTER_LHS.fullmatch(text):
        text = m.group(1).strip()
    candidates = boxed(text)
    if _PERCENT.search(text):
        candidates += boxed(_PERCENT.sub("", text))
    return tuple(candidates)


def equivalent(gold: Sequence[Any], pred: Sequence[Any]) -> bool:
    from math_verify import verify

    return bool(gold) and bool(pred) and verify(list(gold), list(pred), timeout_seconds=_VERIFY_TIMEOUT_S)


def grade_math(response: str, gold: str) -> tuple[str | None, bool]:
    """(extracted answer text, correct) for one response against the gold."""
    pred = parse_answer(response)
    extracted = answer_text(pred)
    return extracted, extracted is not None and equivalent(parse_gold(gold), pred)


# ----------------------------------------------------------------------------- knights and knaves


def _kk_region(text: str) -> str:
    """The part of the response that states the answer: the last <answer> block or what follows the
    last CONCLUSION: marker, else the whole response (where later statements win)."""
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1]
    idx = text.upper().rfind("CONCLUSION")
    return text[idx:] if idx >= 0 else text


def parse_kk_assignment(text: str, names: Sequence[str]) -> dict[str, bool] | None:
    """{name: is_knight} from statements like "(1) Zoey is a knave" / "Oliver is a knight"; the last
    statement about each name wins. None unless every name gets a role.

    Deliberately more lenient than the training reward's parser (reference_trainer/tasks/kk.py): it grades
    arbitrary models' free-form answers ("Zoey must be a knight", "Zoey: knave", <answer> blocks), where
    the training reward only reads the embedded format and rejects hedged answers outright.
    """
    region = _kk_region(text[-MAX_RESPONSE_CHARS:])
    result: dict[str, bool] = {}
    for name in names:
        pattern = rf"\b{re.escape(name)}\b\W{{0,3}}\s*(?:is|was|must be|:)\s*(?:a|an)?\s*\**\s*(knight|knave)"
        found = re.findall(pattern, region, re.IGNORECASE)
        if not found:
            return None
        result[name] = found[-1].lower() == "knight"
    return result


def kk_gold(answer: str, names: Sequence[str], solution: Sequence[bool] | None) -> dict[str, bool]:
    if solution is not None and len(solution) == len(names):
        return {n: bool(s) for n, s in zip(names, solution, strict=True)}
    parsed = parse_kk_assignment(answer, names)
    if parsed is None:
        raise ValueError(f"cannot read the gold K&K assignment from {answer!r}")
    return parsed


def format_kk_assignment(assignment: dict[str, bool]) -> str:
    return format_assignment(list(assignment), list(assignment.values()))


# ----------------------------------------------------------------------------- items


@dataclass
class GradeItem:
    grader: str  # "math" | "kk"
    response: str
    gold: str
    names: list[str] | None = None
    solution: list[bool] | None = None
    id: str = ""  # "problem-id#sample", named in the one line a failure logs


@dataclass
class GradeResult:
    extracted: str | None
    correct: bool
    error: str | None = None
    key: str | None = None  # the extracted answer as voted on (equal keys are one answer)
    extra: dict[str, Any] = field(default_factory=dict)


def grade_item(item: GradeItem) -> GradeResult:
    """Extract and grade one response; runs inside a pool worker."""
    if item.grader == "kk":
        names = item.names or []
        pred = parse_kk_assignment(item.response, names)
        if pred is None:
            return GradeResult(extracted=None, correct=False)
        text = format_kk_assignment(pred)
        gold = kk_gold(item.gold, names, item.solution)
        return GradeResult(extracted=text, correct=pred == gold, key=text)
    before = _timeouts.count
    extracted, correct = grade_math(item.response, item.gold)
    # A timeout inside math-verify makes parse/verify give up quietly: a wrong grade may be the timeout's.
    error = "math-verify timed out" if _timeouts.count > before and not correct else None
    return GradeResult(extracted=extracted, correct=correct, error=error, key=extracted)


# ----------------------------------------------------------------------------- majority voting


@dataclass
class VoteItem:
    """One problem's answers to group: `keys[i]` is sample i's extracted answer (None: no answer) and
    `responses[i]` its response, which is parsed again to compare answers that differ as text."""

    grader: str
    keys: list[str | None]
    responses: list[str]
    id: str = ""


def answer_classes(item: VoteItem) -> list[int | None]:
    """Equivalence class of every sample's answer, numbered in order of first appearance (None: no
    answer). Equal texts are one class; a new text joins the first earlier class whose first answer
    math-verify finds equivalent to it (as gold), else opens a class. K&K answers are canonical texts."""
    label: dict[str, int] = {}
    reps: list[list[Any]] = []  # parsed first answer of each class
    for key, response in zip(item.keys, item.responses, strict=True):
        if key is None or key in label:
            continue
        if item.grader == "kk":
            label[key] = len(label)
            continue
        parsed = parse_answer(response)
        found = next((c for c, rep in enumerate(reps) if equivalent(rep, parsed)), None)
        if found is None:
            found = len(reps)
            reps.append(parsed)
        label[key] = found
    return [None if k is None else label[k] for k in item.keys]


def text_classes(keys: Sequence[str | None]) -> list[int | None]:
    """Classes by exact text: the fallback when comparing a problem's answers failed or timed out."""
    label: dict[str, int] = {}
    for k in keys:
        if k is not None:
            label.setdefault(k, len(label))
    return [None if k is None else label[k] for k in keys]
