"""Answer phrases, answer tags and a response that is only an answer (rules 3 and 4, answer_extraction.py)."""

from __future__ import annotations

import re

from reference_trainer.tasks.answer_forms import changes_value, clean_value, number_from_words, prose_start
from reference_trainer.tasks.answer_text import (
    ALTERNATIVES,
    BOX,
    CHOICE,
    EMPHASIS,
    ENV_SEPARATOR,
    JUDGEMENTS,
    LEAD,
    MATH_ENV,
    MAX_SENTENCE_CHARS,
    SENTENCE_END,
    LocatedAnswer,
    mask_math,
    strip_delimiters,
)

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
# A phrase followed by "not" states nothing ("The answer is not 204"); "Answer: no" is an answer.
_STATEMENT_NEGATION = re.compile(r"(?:not|never)\b", re.IGNORECASE)
_WORDS = re.compile(r"[A-Za-z][A-Za-z\-]*(?:\s+[A-Za-z][A-Za-z\-]*){0,2}\.?")  # up to three words
# Words that make a sentence about the answer (or prose) rather than an answer in words.

# An answer tag (R1-style prompts): "<answer> 48480 </answer>" states its content when that is only an answer.
_ANSWER_TAG = re.compile(r"<answer>(.{0,500}?)</answer>", re.IGNORECASE | re.DOTALL)
# "\\[Answer: 009\\]", "$\\text{Answer: } 9$": the phrase written inside the maths, moved before it.
PHRASE_IN_MATHS = re.compile(
    r"(\\\[|\$\$?|\\\()\s*(?:\\text(?:bf)?\s*\{\s*)?((?:final\s+)?answer)\s*:\s*(?:\}\s*)?", re.IGNORECASE
)


def _tag_answers(text: str) -> list[LocatedAnswer]:
    answers = []
    for m in _ANSWER_TAG.finditer(text):
        if not BOX.search(m.group(1)) and (whole := whole_answer(m.group(1))) is not None:
            answers.append(LocatedAnswer(m.start(), whole.value))
    return answers


def statement_answers(text: str) -> list[LocatedAnswer]:
    masked = mask_math(text)
    answers = _tag_answers(text)
    for m in _PHRASE.finditer(masked):
        value = _statement_value(text, masked, m.end(), loose=m.lastgroup == "is")
        at = LEAD.match(text, m.end()).end()  # type: ignore[union-attr]
        # "either 6 or 12, depending on ...", or a value under a condition then another
        if ALTERNATIVES.match(masked, at) or (value is not None and _HEDGED_VALUE.match(masked, at)):
            answers.append(LocatedAnswer(m.start(), hedged=True))
        elif value is not None:
            answers.append(LocatedAnswer(m.start(), value))
    return answers


def _statement_value(text: str, masked: str, at: int, loose: bool) -> str | None:
    """The answer a phrase states, from position `at`: the math environments right after it (joined by
    commas or "and"), or its bare maths up to any prose, or a few words that are the whole sentence
    ("Final answer: odd"; after the `loose` "the answer is", one or two words that do not judge the
    answer: "The answer is even." but not "The answer is correct."). None when it states nothing."""
    at = LEAD.match(text, at).end()  # type: ignore[union-attr]  # may cross to the next line
    if at >= len(text) or _STATEMENT_NEGATION.match(masked, at):
        return None
    if text.startswith(("\\boxed", "\\fbox"), at):
        return None  # the box is a statement of its own
    envs = []
    pos = at
    while (env := MATH_ENV.match(text, pos)) is not None:
        envs.append(strip_delimiters(env.group(0)).strip())
        sep = ENV_SEPARATOR.match(text, env.end())
        if sep is None or MATH_ENV.match(text, sep.end()) is None:
            break
        pos = sep.end()
    if envs and envs[0].startswith(("\\boxed", "\\fbox")):
        return None  # "The answer is $\\boxed{7}$": the box is the statement
    if envs:
        return ", ".join(clean_value(e) for e in envs if e) or None
    end = SENTENCE_END.search(masked, at, at + MAX_SENTENCE_CHARS)
    sentence = EMPHASIS.sub("", text[at : end.start() if end else at + MAX_SENTENCE_CHARS]).strip()
    cut = prose_start(sentence)
    maths = sentence if cut is None else sentence[:cut].rstrip(" ,;:([")
    if cut is not None and changes_value(sentence[cut:].split()[0]):
        maths = sentence  # "3 dozen" is not 3: kept whole, it parses to no number
    # Maths is a number or a formula; a lone letter ("x", "(B)") only when it is the whole sentence, not
    # the "a" of "the answer is a multiple of 3".
    if maths and (re.search(r"[\d\\=+*/^<>]", maths) or maths == sentence.rstrip(".")):
        return clean_value(maths) or None
    words = [w.lower() for w in sentence.rstrip(".").split()]
    if not _WORDS.fullmatch(sentence) or any(w in JUDGEMENTS for w in words):
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


def whole_answer(text: str) -> LocatedAnswer | None:
    """The response when it is only an answer, maths without prose ("-5", "1 000", "$\\frac{10}{9}$",
    "28 %"): it is that answer, though it ends no sentence."""
    bare = text.strip()
    if len(bare) > _MAX_WHOLE_ANSWER_CHARS or "\n" in bare:
        return None
    bare = _CURRENCY.sub("", _DELIMITERS.sub(" ", EMPHASIS.sub("", bare))).strip().rstrip(".").strip()
    if not (_WHOLE_ANSWER_MATHS.search(bare) or CHOICE.fullmatch(bare)):  # not a lone word or variable
        return None
    value = clean_value(bare)
    if not value or prose_start(value) is not None:
        return None
    return LocatedAnswer(0, value)
