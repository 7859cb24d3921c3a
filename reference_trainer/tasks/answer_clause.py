"""Without any answer statement: the last clause that holds maths (rule 5 of docs/eval.md), with its
problem-aware part and a last sentence that states its number in words."""

from __future__ import annotations

import re

from reference_trainer.tasks.answer_forms import clean_value
from reference_trainer.tasks.answer_text import (
    ALTERNATIVES,
    ENV_SEPARATOR,
    JUDGEMENTS,
    MATHS_SPAN,
    MAX_SENTENCE_CHARS,
    LocatedAnswer,
    affirms,
    mask_math,
    sentence_start,
    strip_delimiters,
)

_CLAUSE_END = re.compile(r"(?<!\\)[.;!?:](?=\s|$)|(?<!\\),\s|\n")
_HAS_MATHS = re.compile(r"\d|[$]|\\\(|\\\[")
# Maths in masked text (`mask_math`): an environment, or a number outside one.
_CONCLUSION_WORD = re.compile(
    r"\W*(?:so|therefore|thus|hence|consequently|finally|overall|altogether|in\s+total)\b", re.IGNORECASE
)
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_CONCLUSION_BEFORE = re.compile(r"\b(?:so|therefore|thus|hence|consequently|finally)\s*,\s*$", re.IGNORECASE)
_MAX_RESULT_LOOKBACK_CLAUSES = 6  # a result further back than this is not what the ending restates
_CLOSING = re.compile(r"[\s.,;:!*_]*")
_SUBORDINATE = re.compile(r"\b(?:when|if|since|because|where|given|for|after|as)\b", re.IGNORECASE)
# A conclusion, in words, that there is no answer: the maths before it was ruled out.
_NO_SOLUTION = re.compile(
    r"\bno\s+(?:real\s+|integer\s+|such\s+|possible\s+)?(?:solutions?|answers?|values?)\b"
    r"|\bdoes\s+not\s+exist\b|\bimpossible\b",
    re.IGNORECASE,
)
# A named function of the clause's last number: the clause states its value, not the number.
_FUNCTION_OF = re.compile(
    r"\b(?:tangent|sine|cosine|arc\w+|root|logarithm|log|sum|product|square|cube|reciprocal|half|twice|double|"
    r"factorial|divisors?|inverse)\s+of\s+(?:the\s+number\s+)?$",
    re.IGNORECASE,
)
_MAX_ANSWER_LINE_CHARS = 100
_ENDS_ON_NUMBER = re.compile(r"\d\s*(?:[€£¥$%]|m²|m³|cm²)?$")
# A line that states its number ("it's 1,000.99"), not a heading ("Step 1").
_STATES = re.compile(r"\b(?:is|are|was|equals?|gives?|get|got|makes?)\b|=|'s\b", re.IGNORECASE)


def ends_complete(text: str) -> bool:
    """Does the response end a sentence or a formula (rather than stop mid-sentence, or trail off)? One
    short line that states a number and ends on it (with its unit sign) is a whole answer line: "so the
    number is 10 which is 1,000.99m²"; a response cut at its token limit is longer than that."""
    tail = text.rstrip().rstrip("*_`").rstrip()
    if tail.endswith(("...", "…")):
        return False
    # (an unclosed brace is a formula cut off: "\\boxed{20")
    one_line = len(tail) <= _MAX_ANSWER_LINE_CHARS and "\n" not in tail and tail.count("{") == tail.count("}")
    if one_line and _ENDS_ON_NUMBER.search(tail) and _STATES.search(tail):
        return True
    return tail.endswith((".", "!", "?", "$", "\\]", "\\)")) or bool(re.search(r"\\end\{[a-z*]+\}$", tail))


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


def repeats_problem(clause: str, problem: str) -> bool:
    """Are the clause's numbers all numbers of the problem statement ("This is the sum of the proper
    divisors of 284." after a problem about 284)?"""
    numbers = _numbers(clause)
    return bool(numbers) and numbers <= _numbers(problem)


def last_clause(text: str, problem: str = "") -> LocatedAnswer | None:
    """The last clause with maths in a response that states no answer; None when the response is cut
    off, or that clause is negated or asks a question. A clause whose numbers only repeat the problem
    gives way to a conclusion stated before it ("So the total is 76. This is the sum of the proper
    divisors of 284.")."""
    if not ends_complete(text):
        return None
    masked = mask_math(text)
    if (in_words := _number_in_words(text, masked)) is not None:
        return in_words
    ends = [0] + [m.end() for m in _CLAUSE_END.finditer(masked)] + [len(text)]
    spans = [
        (a, b)
        for a, b in zip(reversed(ends[:-1]), reversed(ends[1:]), strict=True)
        if _HAS_MATHS.search(masked[a:b])
    ]
    while len(spans) > 1 and _SUBSTITUTION.match(masked, spans[0][0]):
        spans = spans[1:]  # the check after the result
    if not spans:
        return None
    if _NO_SOLUTION.search(masked, spans[0][0]):
        return None  # "We find $x=3$. However, $x=3$ makes the denominator zero, so there is no solution."
    a, b = spans[0]
    if problem and repeats_problem(text[a:b], problem) and not _opens_conclusion(masked, a):
        # a result stated shortly before it is the answer: a conclusion ("So the total is 76.", "so ... is
        # $x=3$") or a number of its own ("She needs 15 more dollars.")
        earlier = spans[1 : 1 + _MAX_RESULT_LOOKBACK_CLAUSES]
        result = next(
            (
                (x, y)
                for x, y in earlier
                if (_states_result(text, masked, x, y) or _numbers(text[x:y]) - _numbers(problem))
                and affirms(masked[x:y])
            ),
            None,
        )
        a, b = result or (a, b)
    if problem:
        b = _without_restated_condition(text, masked, a, b, problem)
    b = _without_quantifier(masked, a, b)
    if not affirms(masked[a:b]) or ALTERNATIVES.search(masked[sentence_start(masked, a) : b]):
        return None  # negated, a question, or two values offered as alternatives (a hedge)
    maths = list(MATHS_SPAN.finditer(masked, a, b))
    if not maths:
        return None  # a lone "$", no formula or number
    if _FUNCTION_OF.search(masked, a, maths[-1].start()):
        return None  # "the angle is the inverse tangent of 90 degrees" states arctan(90), not 90
    if clock := _CLOCK_AT_END.search(text, a, b):  # "The time is 20:34.": a clock time, not 20 or 20/34
        return LocatedAnswer(a, clean_value(clock.group(1)), text[a:b])
    formulas = _closing_formulas(text, masked, a, b)
    restates = formulas and problem and copies_problem(formulas, problem)
    if restates and not _states_result(text, masked, a, b) and not _STATES.search(masked, a, b):
        return None  # "We need to compute $2^{10}$." restates the problem ("It is $2^{10}$." answers)
    if formulas:
        # the clause ends on formulas ("... the value is $10 \\text{ hundred}$.", "are $1$, $2$ and $3$."):
        # their own text is the answer, read as a statement's maths is (the answer forms apply)
        return LocatedAnswer(a, ", ".join(clean_value(f) for f in formulas) or None, text[a:b])
    return LocatedAnswer(a, None, _CURRENCY_BEFORE.sub("", text[a:b]))  # "is R28.": 28


# A clause that substitutes a value is working, not an answer: "Substituting $y = 1$ confirms it."
_SUBSTITUTION = re.compile(
    r"[\s*_]*(?:(?:and|then|now|again)\s+)?(?:substitut\w*|plugg?(?:ing|ed)?(?:\s+in)?|setting|letting|"
    r"putting|taking|checking|using)\b",
    re.IGNORECASE,
)

# A currency sign before an amount in prose ("The total is R28."): math-verify would read R times 28.
_CURRENCY_BEFORE = re.compile(r"(?<![A-Za-z\\])(?:R|Rs\.?|[€£¥₹])\s?(?=\d)")

# A quantifier after the answer's formula: "$f(x) = \\frac{1}{x}$ for all $x \\in \\mathbb{Q}^+$" answers
# f(x) = 1/x.
_QUANTIFIER = re.compile(
    r"\s*,?\s*\b(?:for\s+(?:all|every|each|any)|whenever|where)\b[^.!?\n]*[.!]?\s*$", re.IGNORECASE
)
_CLOCK_AT_END = re.compile(r"(\d{1,2}:[0-5]\d(?:\s*[AaPp]\.?\s*[Mm]\b\.?)?)[\s.!]*$")


def _without_quantifier(masked: str, a: int, b: int) -> int:
    """Where the clause ends once a trailing quantifier over the answer's variable is cut."""
    m = _QUANTIFIER.search(masked[a:b])
    if m is None or not MATHS_SPAN.search(masked, a, a + m.start()):
        return b
    return a + m.start()


# Number words in the last sentence: "So there are seven such complex numbers."
_CARDINAL = (
    r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
    r"thousand|million|billion"
)
_NUMBER_IN_WORDS = re.compile(
    rf"\b(?:(?:minus|negative)\s+)?(?:(?:{_CARDINAL})(?:(?:[\s-]+|\s+and\s+)(?:{_CARDINAL}))*|infinity)\b",
    re.IGNORECASE,
)
# "one" alone is a number only where something is counted or equated: "there is one", "exactly one".
_ONE_COUNTED = re.compile(r"\b(?:is|are|be|exactly|only|just|equals?)\s+$", re.IGNORECASE)
_ONE_NOT_COUNTED = re.compile(r"\s+(?:of|another|that|who|which|way|more|by|at)\b", re.IGNORECASE)


# A last sentence that ends by stating one word: "So, the figure skater's final spin is east."
_WORD_STATED = re.compile(r"\b(?:is|are)\s+([A-Za-z]+)\s*$", re.IGNORECASE)


def _number_in_words(text: str, masked: str) -> LocatedAnswer | None:
    """The number a last sentence without maths states in words, or the one word it ends by stating; None
    unless it states exactly one."""
    body = masked.rstrip().rstrip(".!")
    start = sentence_start(masked, len(body))
    sentence = text[start : len(body)]
    if _HAS_MATHS.search(masked[start : len(body)]) or not affirms(masked[start : len(body)] + "."):
        return None
    found = []
    for m in _NUMBER_IN_WORDS.finditer(sentence):
        if m.group(0).lower() == "one" and (
            not _ONE_COUNTED.search(sentence[: m.start()]) or _ONE_NOT_COUNTED.match(sentence, m.end())
        ):
            continue
        found.append(clean_value(m.group(0)))
    if not found and (word := _WORD_STATED.search(sentence)) and word.group(1).lower() not in JUDGEMENTS:
        return LocatedAnswer(start, f"\\text{{{word.group(1)}}}", sentence)  # "... final spin is east."
    if len(set(found)) != 1 or ALTERNATIVES.search(masked[start:]):
        return None
    return LocatedAnswer(start, found[0], sentence)


def _without_restated_condition(text: str, masked: str, a: int, b: int, problem: str) -> int:
    """Where the clause ends once a trailing condition that only repeats the problem is cut ("The
    remainder is 2 | when 17 is divided by 5."): the end of the result it states before it."""
    for word in _SUBORDINATE.finditer(masked, a, b):
        before, after = text[a : word.start()], text[word.start() : b]
        if repeats_problem(after, problem) and _numbers(before) - _numbers(problem):
            return word.start()
    return b


def copies_problem(formulas: list[str], problem: str) -> bool:
    """Is every formula written, as it stands, in the problem statement?"""
    statement = re.sub(r"\s+", "", problem)
    return all(re.sub(r"\s+", "", f) in statement for f in formulas)


def _states_result(text: str, masked: str, a: int, b: int) -> bool:
    """Is the clause a conclusion: opened by "so", "therefore", ... (its own first word, or its sentence's:
    "So, the solution is $x=3$."), or an equation?"""
    return _opens_conclusion(masked, a) or "=" in text[a:b]


def _opens_conclusion(masked: str, a: int) -> bool:
    return bool(_CONCLUSION_WORD.match(masked, a) or _CONCLUSION_BEFORE.search(masked, max(0, a - 20), a))


def _closing_formulas(text: str, masked: str, a: int, b: int) -> list[str]:
    """The formulas a clause ends on: its last math environment, with the ones before it that separators
    join ("$1$, $2$, and $3$", "$x = 2$ or $x = 1$", across the commas that end clauses); [] when the
    clause ends on a bare number or words."""
    found = list(MATHS_SPAN.finditer(masked, max(0, a - MAX_SENTENCE_CHARS), b))
    if not found or found[-1].start() < a or not _CLOSING.fullmatch(masked, found[-1].end(), b):
        return []
    run: list[re.Match[str]] = []
    for m in reversed(found):
        if m.group(0)[0] not in "$\\" or (
            run and not ENV_SEPARATOR.fullmatch(masked, m.end(), run[0].start())
        ):
            break
        run.insert(0, m)
    return [strip_delimiters(text[m.start() : m.end()]).strip() for m in run]
