"""Which part of a response is its answer: the policy a careful human grader applies, the same in every suite.

math-verify's `parse` ranks its patterns by kind (a box first, then "final answer", "answer:", and the last
expression) and reads the whole text at once, so a box wins over a later correction ("\\boxed{204} ... I must
add 24 more: the answer is 228."), the boxes of a response are joined into one answer when anything with a
comma separates them ("So \\boxed{3}. Wait, recheck: \\boxed{5}" gives 3,5), and its last-number fallback
fires on a negated or cut-off sentence ("The answer is not 204; it is 210." gives 204). It has no option for
any of these, so the answer is located here and only the answer's own text is handed to math-verify to parse:

An answer statement is a box (`\\boxed{}`/`\\fbox{}`) or an answer phrase ("final answer: X", "the final
answer is X", "answer: X", "the answer is X", "Answer $X$"). The rules, numbered as in docs/eval.md:

1. The last statement in the response is its answer: a later statement corrects an earlier one. Boxes of
   one sentence joined by separators or labels ("\\boxed{1} papers and \\boxed{2} bins") are one answer,
   a list.
2. Different answers under conditions ("\\boxed{3} if unordered, and \\boxed{6} if ordered"), or a stated
   answer doubted in favour of another, are a hedge: no answer.
3. A phrase states the maths or the few words after it; followed by "not" it states nothing.
4. A response that is only an answer ("-5", "7,425,000", "$\\frac{10}{9}$", "28 %") is that answer.
5. Otherwise the last clause that holds maths is read (math-verify's rightmost expression, or the
   formulas it ends on), but not when the response stops mid-sentence (cut off at its token limit), when
   a negation bears on that clause's last maths ("would not be 204"; "is not 10 which is 1,000.99"
   answers 1,000.99), when it is a question or names a function of its number ("the inverse tangent of
   90"), or when a later sentence says there is no solution. With the problem statement: a clause whose
   numbers only repeat the problem gives way to an earlier clause with a number of its own ("So the total
   is 76. This is the sum of the proper divisors of 284." answers 76), and a clause that only copies a
   formula of the problem is no answer.

Text after a chat template's turn marker ("<|im_start|>") is another turn, not the response.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reference_trainer.tasks.answer_forms import changes_value, clean_value, number_from_words, prose_start

MAX_RESPONSE_CHARS = 20_000  # only the tail can hold the final answer; bounds regex and parser work


@dataclass(frozen=True)
class LocatedAnswer:
    """Where the answer is. `value` is the answer's own LaTeX (a box's content, a statement's maths or
    words), parsed as if boxed; a fallback clause has no value and is parsed as text (`text`)."""

    start: int
    value: str | None = None
    text: str = ""
    hedged: bool = False  # different answers under conditions ("3 if unordered, and 6 if ordered"): none


# ----------------------------------------------------------------------------- math environments

# Bounded lengths keep a response of unclosed delimiters ("\\(" * 10_000) linear.
_MATH_ENV = re.compile(
    r"\$\$.{1,5000}?\$\$|(?<!\\)\$(?:\\.|[^$\\]){1,2000}?\$|\\\[.{1,5000}?\\\]|\\\(.{1,2000}?\\\)",
    re.DOTALL,
)


def mask_math(text: str) -> str:
    """`text` with the inside of every math environment blanked (same length), so that a search for
    sentence ends or words does not look into formulas ("4.9", "\\not")."""
    return _MATH_ENV.sub(lambda m: m.group(0)[:1] + "M" * (len(m.group(0)) - 2) + m.group(0)[-1:], text)


def _strip_delimiters(env: str) -> str:
    for left, right in (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if env.startswith(left) and env.endswith(right) and len(env) >= len(left) + len(right):
            return env[len(left) : len(env) - len(right)]
    return env


# ----------------------------------------------------------------------------- boxes

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
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
    for m in _BOX.finditer(text):
        end = closing.get(m.end() - 1)
        if end is not None and (not found or m.start() >= found[-1][1]):
            found.append((m.start(), end + 1, text[m.end() : end].strip()))
    return found


# Between boxes of one sentence: labels joined by a comma or "and" list parts of one answer ("\\boxed{1}
# papers and \\boxed{2} bins"); a condition makes them a hedge ("\\boxed{3} if unordered, and \\boxed{6} if
# ordered"); a correction or a consequence makes the later box a statement of its own.
_JOINING_WORDS = re.compile(r",|\band\b", re.IGNORECASE)
_CONDITION = re.compile(
    r"\b(?:if|when|whenever|unless|otherwise|depending|assuming|provided|suppose|case)\b", re.IGNORECASE
)
_CORRECTION = re.compile(
    r"\b(?:wait|actually|but|however|instead|rather|re-?check\w*|check\w*|mistake|oops|sorry|wrong|"
    r"incorrect|correct\w*|redo|again|error)\b",
    re.IGNORECASE,
)
_CONSEQUENCE_OR_NEGATION = re.compile(
    r"\b(?:so|thus|hence|therefore|gives?|giving|then|let|final|no|not)\b|n't\b|=", re.IGNORECASE
)
_MAX_LABEL_GAP_CHARS = 80
_MAX_HEDGE_SPAN_CHARS = 200  # two answers further apart than this are not one hedged sentence pair


def _gap_joins(gap: str, words: str) -> bool:
    """Do the words between two boxes (`gap`, and `words`: the gap with its maths masked) make them parts
    of one answer (or of one hedge)?"""
    if _LIST_SEPARATOR.fullmatch(gap):
        return True
    return (
        len(gap) <= _MAX_LABEL_GAP_CHARS
        and _SENTENCE_END.search(words) is None
        and _CORRECTION.search(words) is None
        and _CONSEQUENCE_OR_NEGATION.search(words) is None
        and _JOINING_WORDS.search(words) is not None
    )


_TEXT_WORDS = re.compile(r"\\text\s*\{([^{}]*)\}")


def _gap_words(text: str, masked: str, a: int, b: int) -> str:
    """The words between two boxes: the gap with its maths masked, and the words of its `\\text{}` (boxes
    inside one display: "$$\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}$$")."""
    return masked[a:b] + " " + " ".join(_TEXT_WORDS.findall(text, a, b))


def _box_answers(text: str) -> list[LocatedAnswer]:
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
        first = list(_PART_LINE.finditer(text, max(0, before[0] - _MAX_SENTENCE_CHARS), before[0]))
        return not first or _follows(_label(first[-1]), _label(m))
    first = list(_PART_LINE.finditer(text, max(0, before[0] - _MAX_SENTENCE_CHARS), before[0]))
    second = list(_PART_LINE.finditer(text, before[1], box[0]))
    return bool(first and second) and _follows(_label(first[-1]), _label(second[-1]))


def _join(run: list[tuple[int, int, str]], masked: str) -> LocatedAnswer:
    contents = list(dict.fromkeys(clean_value(content) for _, _, content in run))  # a repeated box once
    if len(contents) > 1 and _CONDITION.search(masked[run[0][1] : run[-1][0]]):
        return LocatedAnswer(run[0][0], hedged=True)
    return LocatedAnswer(run[0][0], ", ".join(c for c in contents if c))


# ----------------------------------------------------------------------------- answer phrases

_PHRASE = re.compile(
    r"(?P<final>\bfinal\s+answer\b(?:\s+(?:to|for)\b[^.\n:$]{0,60}?)?(?:\s*[*_]{1,2})?\s*(?:is\b|:|=)?)"
    r"|(?P<colon>\banswer\s*[*_]{0,2}\s*[:=])"
    r"|(?P<is>\banswer\s+is\b(?:\s+(?:therefore|thus|then|indeed|clearly|simply|just))?)"
    r"|(?P<heading>(?:^|(?<=\n))[ \t#*_]*answer[*_]{0,2}(?=[ \t]*(?:\$|\\M)))",  # "Answer \\( 9 \\)", masked
    re.IGNORECASE,
)
# A stated value under a condition, then another value: "The answer is 3 if unordered, and 6 if ordered."
_HEDGED_VALUE = re.compile(
    r"\s*(?:\$M*\$|\\M*[)\]]|-?[\d.,/]+)\s*(?:[A-Za-z]+\s+){0,3}?"  # masked maths (`mask_math`)
    r"(?:if|when|unless|assuming|provided)\b[^.!?\n]{0,200}?(?:,|\band\b|\bor\b|\botherwise\b|\bwhile\b)"
    r"[^.!?\n]{0,200}?(?:\d|\$|\\M)",  # bounded: one sentence, and linear on hostile text
    re.IGNORECASE,
)
# Two values offered as alternatives: "either 6 or 12", "6 or 12, depending on the interpretation" (a list
# of answers is written without "either" and without a condition: "3 or 6" is a list).
# (a number's span is bounded and must end there: a 3,000-digit run would otherwise be retried from every
# position, quadratic in its length)
_VALUE_SPAN = r"(?:\$M{0,5000}\$|\\M{0,5000}[)\]]|(?<![\d.,/])-?\d[\d.,/]{0,40}(?![\d.,/]))"
_ALTERNATIVES = re.compile(
    rf"[^.!?\n]{{0,60}}?(?:\beither\s+{_VALUE_SPAN}[^.!?\n]{{0,80}}?\bor\b\s+(?:\w+\s+){{0,2}}?{_VALUE_SPAN}"
    rf"|{_VALUE_SPAN}\s+or\s+{_VALUE_SPAN}[^.!?\n]{{0,40}}?\b(?:depending|depends)\b)",
    re.IGNORECASE,
)
# A phrase followed by "not" states nothing ("The answer is not 204"); "Answer: no" is an answer.
_STATEMENT_NEGATION = re.compile(r"(?:not|never)\b", re.IGNORECASE)
_CLAUSE_NEGATION = re.compile(
    r"\b(?:not|no|never|cannot|neither|nor|without|incorrect|wrong|impossible)\b|n't\b", re.IGNORECASE
)
_LEAD = re.compile(r"[\s*_:]*")
_SENTENCE_END = re.compile(r"(?<!\\)[.;!?](?=\s|$)|\n")  # not LaTeX spacing: "11,\! 111"
_ENV_SEPARATOR = re.compile(r"\s*(?:,|;|,?\s*\band\b|,?\s*\bor\b)\s*")
_WORDS = re.compile(r"[A-Za-z][A-Za-z\-]*(?:\s+[A-Za-z][A-Za-z\-]*){0,2}\.?")  # up to three words
_MAX_SENTENCE_CHARS = 500  # an answer sentence is short; longer is prose (and bounds hostile text)
_EMPHASIS = re.compile(r"\*\*|__")  # markdown bold around an answer: "The answer is: **42**."
# Words that make a sentence about the answer (or prose) rather than an answer in words.
_JUDGEMENTS = {
    "correct", "incorrect", "right", "wrong", "reasonable", "plausible", "valid", "invalid", "consistent",
    "confirmed", "verified", "clear", "obvious", "simple", "straightforward", "complete", "done", "below",
    "above", "same", "unique", "unchanged", "not", "that", "this", "as", "still", "indeed", "the", "a",
    "an", "is", "are", "it", "we", "so", "see", "shown", "given", "follows",
}  # fmt: skip


# An answer tag (R1-style prompts): "<answer> 48480 </answer>" states its content when that is only an answer.
_ANSWER_TAG = re.compile(r"<answer>(.{0,500}?)</answer>", re.IGNORECASE | re.DOTALL)
# "\\[Answer: 009\\]", "$\\text{Answer: } 9$": the phrase written inside the maths, moved before it.
_PHRASE_IN_MATHS = re.compile(
    r"(\\\[|\$\$?|\\\()\s*(?:\\text(?:bf)?\s*\{\s*)?((?:final\s+)?answer)\s*:\s*(?:\}\s*)?", re.IGNORECASE
)


def _tag_answers(text: str) -> list[LocatedAnswer]:
    answers = []
    for m in _ANSWER_TAG.finditer(text):
        if not _BOX.search(m.group(1)) and (whole := whole_answer(m.group(1))) is not None:
            answers.append(LocatedAnswer(m.start(), whole.value))
    return answers


def _statement_answers(text: str) -> list[LocatedAnswer]:
    masked = mask_math(text)
    answers = _tag_answers(text)
    for m in _PHRASE.finditer(masked):
        value = _statement_value(text, masked, m.end(), loose=m.lastgroup == "is")
        at = _LEAD.match(text, m.end()).end()  # type: ignore[union-attr]
        if _ALTERNATIVES.match(masked, at):
            answers.append(LocatedAnswer(m.start(), hedged=True))  # "either 6 or 12, depending on ..."
        elif value is not None and _HEDGED_VALUE.match(masked, at):
            answers.append(LocatedAnswer(m.start(), hedged=True))
        elif value is not None:
            answers.append(LocatedAnswer(m.start(), value))
    return answers


def _statement_value(text: str, masked: str, at: int, loose: bool) -> str | None:
    """The answer a phrase states, from position `at`: the math environments right after it (joined by
    commas or "and"), or its bare maths up to any prose, or a few words that are the whole sentence
    ("Final answer: odd"; after the `loose` "the answer is", one or two words that do not judge the
    answer: "The answer is even." but not "The answer is correct."). None when it states nothing."""
    at = _LEAD.match(text, at).end()  # type: ignore[union-attr]  # may cross to the next line
    if at >= len(text) or _STATEMENT_NEGATION.match(masked, at):
        return None
    if text.startswith(("\\boxed", "\\fbox"), at):
        return None  # the box is a statement of its own
    envs = []
    pos = at
    while (env := _MATH_ENV.match(text, pos)) is not None:
        envs.append(_strip_delimiters(env.group(0)).strip())
        sep = _ENV_SEPARATOR.match(text, env.end())
        if sep is None or _MATH_ENV.match(text, sep.end()) is None:
            break
        pos = sep.end()
    if envs and envs[0].startswith(("\\boxed", "\\fbox")):
        return None  # "The answer is $\\boxed{7}$": the box is the statement
    if envs:
        return ", ".join(clean_value(e) for e in envs if e) or None
    end = _SENTENCE_END.search(masked, at, at + _MAX_SENTENCE_CHARS)
    sentence = _EMPHASIS.sub("", text[at : end.start() if end else at + _MAX_SENTENCE_CHARS]).strip()
    cut = prose_start(sentence)
    maths = sentence if cut is None else sentence[:cut].rstrip(" ,;:([")
    if cut is not None and changes_value(sentence[cut:].split()[0]):
        maths = sentence  # "3 dozen" is not 3: kept whole, it parses to no number
    # Maths is a number or a formula; a lone letter ("x", "(B)") only when it is the whole sentence, not
    # the "a" of "the answer is a multiple of 3".
    if maths and (re.search(r"[\d\\=+*/^<>]", maths) or maths == sentence.rstrip(".")):
        return clean_value(maths) or None
    words = [w.lower() for w in sentence.rstrip(".").split()]
    if not _WORDS.fullmatch(sentence) or any(w in _JUDGEMENTS for w in words):
        return None  # prose, or a sentence about the answer ("The answer is correct.", "The knight is ...")
    if not loose or len(words) <= 2:
        number = number_from_words(sentence)
        return str(number) if number is not None else f"\\text{{{sentence.rstrip('.')}}}"
    return None


# ---------------------------------------------------------------------- a response that is only an answer

_MAX_WHOLE_ANSWER_CHARS = 80
_DELIMITERS = re.compile(r"\\?\$|\\[()\[\]]")  # math delimiters, and "\\$" of a price ("\\$18.90")
_CURRENCY = re.compile(r"[€£¥]")
_WHOLE_ANSWER_MATHS = re.compile(r"\d|\\[A-Za-z]|[=+\-*/^<>]")
_CHOICE = re.compile(r"\([A-E]\)")


def whole_answer(text: str) -> LocatedAnswer | None:
    """The response when it is only an answer, maths without prose ("-5", "1 000", "$\\frac{10}{9}$",
    "28 %"): it is that answer, though it ends no sentence."""
    bare = text.strip()
    if len(bare) > _MAX_WHOLE_ANSWER_CHARS or "\n" in bare:
        return None
    bare = _CURRENCY.sub("", _DELIMITERS.sub(" ", _EMPHASIS.sub("", bare))).strip().rstrip(".").strip()
    if not (_WHOLE_ANSWER_MATHS.search(bare) or _CHOICE.fullmatch(bare)):  # not a lone word or variable
        return None
    value = clean_value(bare)
    if not value or prose_start(value) is not None:
        return None
    return LocatedAnswer(0, value)


# ----------------------------------------------------------------------------- fallback: the last clause

_CLAUSE_END = re.compile(r"(?<!\\)[.;!?:](?=\s|$)|(?<!\\),\s|\n")
_HAS_MATHS = re.compile(r"\d|[$]|\\\(|\\\[")
# Maths in masked text (`mask_math`): an environment, or a number outside one.
_MATHS_SPAN = re.compile(r"\$M*\$|\\M*[)\]]|\d(?:[\d,.]*\d)?")
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


def _affirms(masked_clause: str) -> bool:
    """Does the clause state its maths: no question ("So is it 204?"), no negation bearing on it?"""
    return not masked_clause.strip().endswith("?") and not _negated(masked_clause)


def _negated(masked_clause: str) -> bool:
    """Does a negation bear on the clause's last maths: anywhere after the maths before it ("would not be
    204", "204, but that is wrong"), not before it ("is not 10 which is 1,000.99")?"""
    spans = list(_MATHS_SPAN.finditer(masked_clause))
    since = spans[-2].end() if len(spans) > 1 else 0
    return _CLAUSE_NEGATION.search(masked_clause, since) is not None


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
                and _affirms(masked[x:y])
            ),
            None,
        )
        a, b = result or (a, b)
    if problem:
        b = _without_restated_condition(text, masked, a, b, problem)
    b = _without_quantifier(masked, a, b)
    if not _affirms(masked[a:b]) or _ALTERNATIVES.search(masked[_sentence_start(masked, a) : b]):
        return None  # negated, a question, or two values offered as alternatives (a hedge)
    maths = list(_MATHS_SPAN.finditer(masked, a, b))
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
    return LocatedAnswer(a, None, text[a:b])


# A quantifier after the answer's formula: "$f(x) = \\frac{1}{x}$ for all $x \\in \\mathbb{Q}^+$" answers
# f(x) = 1/x.
_QUANTIFIER = re.compile(
    r"\s*,?\s*\b(?:for\s+(?:all|every|each|any)|whenever|where)\b[^.!?\n]*[.!]?\s*$", re.IGNORECASE
)
_CLOCK_AT_END = re.compile(r"(\d{1,2}:[0-5]\d(?:\s*[AaPp]\.?\s*[Mm]\b\.?)?)[\s.!]*$")


def _without_quantifier(masked: str, a: int, b: int) -> int:
    """Where the clause ends once a trailing quantifier over the answer's variable is cut."""
    m = _QUANTIFIER.search(masked[a:b])
    if m is None or not _MATHS_SPAN.search(masked, a, a + m.start()):
        return b
    return a + m.start()


def _sentence_start(masked: str, at: int) -> int:
    ends = [m.end() for m in _SENTENCE_END.finditer(masked, max(0, at - _MAX_SENTENCE_CHARS), at)]
    return ends[-1] if ends else max(0, at - _MAX_SENTENCE_CHARS)


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
    start = _sentence_start(masked, len(body))
    sentence = text[start : len(body)]
    if _HAS_MATHS.search(masked[start : len(body)]) or not _affirms(masked[start : len(body)] + "."):
        return None
    found = []
    for m in _NUMBER_IN_WORDS.finditer(sentence):
        if m.group(0).lower() == "one" and (
            not _ONE_COUNTED.search(sentence[: m.start()]) or _ONE_NOT_COUNTED.match(sentence, m.end())
        ):
            continue
        found.append(clean_value(m.group(0)))
    if not found and (word := _WORD_STATED.search(sentence)) and word.group(1).lower() not in _JUDGEMENTS:
        return LocatedAnswer(start, f"\\text{{{word.group(1)}}}", sentence)  # "... final spin is east."
    if len(set(found)) != 1 or _ALTERNATIVES.search(masked[start:]):
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
    found = list(_MATHS_SPAN.finditer(masked, max(0, a - _MAX_SENTENCE_CHARS), b))
    if not found or found[-1].start() < a or not _CLOSING.fullmatch(masked, found[-1].end(), b):
        return []
    run: list[re.Match[str]] = []
    for m in reversed(found):
        if m.group(0)[0] not in "$\\" or (
            run and not _ENV_SEPARATOR.fullmatch(masked, m.end(), run[0].start())
        ):
            break
        run.insert(0, m)
    return [_strip_delimiters(text[m.start() : m.end()]).strip() for m in run]


def _hedges(masked: str, before: LocatedAnswer, last: LocatedAnswer) -> bool:
    """Are the last two statements different answers under conditions, with no correction between them
    ("If order matters the answer is \\boxed{6}; if not, it is \\boxed{3}.")?"""
    if before.hedged or last.hedged or before.value == last.value:
        return False
    too_far = last.start - before.start > _MAX_HEDGE_SPAN_CHARS
    if too_far or _CORRECTION.search(masked, before.start, last.start):
        return False
    sentence_end = _SENTENCE_END.search(masked, last.start)
    end = sentence_end.start() if sentence_end else len(masked)
    return _CONDITION.search(masked, max(0, before.start - _MAX_LABEL_GAP_CHARS), end) is not None


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
    sentence_end = _SENTENCE_END.search(masked, doubt.end())
    return (
        _MATHS_SPAN.search(masked, doubt.end(), sentence_end.start() if sentence_end else len(masked))
        is not None
    )


def own_turn(response: str) -> str:
    """The response up to the first turn marker that follows some text of its own."""
    for marker in _TURN_MARKER.finditer(response):
        if response[: marker.start()].strip():
            return response[: marker.start()]
    return response


def locate_answer(response: str, problem: str = "") -> LocatedAnswer | None:
    """The response's answer under the policy above; None when it gives none. `problem` is the problem
    statement, where known (rule 5)."""
    text = _PHRASE_IN_MATHS.sub(r"\2: \1 ", own_turn(response[-MAX_RESPONSE_CHARS:]))
    stated = sorted(_box_answers(text) + _statement_answers(text), key=lambda a: a.start)
    masked = mask_math(text) if stated else ""
    if stated and (
        len(stated) > 1 and _hedges(masked, stated[-2], stated[-1]) or _doubted(masked, stated[-1])
    ):
        return LocatedAnswer(stated[-1].start, hedged=True)
    if stated:
        return stated[-1]
    return whole_answer(text) or last_clause(text, problem)
