"""What every answer reader shares: the located answer, math environments masked out of the words, sentence
ends, and the words that correct, condition, negate or judge (docs/eval.md states the policy)."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RESPONSE_CHARS = 20_000  # only the tail can hold the final answer; bounds regex and parser work


@dataclass(frozen=True)
class LocatedAnswer:
    """Where the answer is. `value` is the answer's own LaTeX (a box's content, a statement's maths or
    words), parsed as if boxed; a fallback clause has no value and is parsed as text (`text`)."""

    start: int
    value: str | None = None
    text: str = ""
    hedged: bool = False  # different answers under conditions ("3 if unordered, and 6 if ordered"): none
    end: int = 0  # where a box's run of boxes ends (0: unknown, the statement's sentence ends it)


# ----------------------------------------------------------------------------- math environments

# Bounded lengths keep a response of unclosed delimiters ("\\(" * 10_000) linear.
MATH_ENV = re.compile(
    r"\$\$.{1,5000}?\$\$|(?<!\\)\$(?:\\.|[^$\\]){1,2000}?\$|\\\[.{1,5000}?\\\]|\\\(.{1,2000}?\\\)",
    re.DOTALL,
)


def mask_math(text: str) -> str:
    """`text` with the inside of every math environment blanked (same length), so that a search for
    sentence ends or words does not look into formulas ("4.9", "\\not")."""
    return MATH_ENV.sub(lambda m: m.group(0)[:1] + "M" * (len(m.group(0)) - 2) + m.group(0)[-1:], text)


def strip_delimiters(env: str) -> str:
    for left, right in (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if env.startswith(left) and env.endswith(right) and len(env) >= len(left) + len(right):
            return env[len(left) : len(env) - len(right)]
    return env


# ----------------------------------------------------------------------------- words and sentences

BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
CONDITION = re.compile(
    r"\b(?:if|when|whenever|unless|otherwise|depending|assuming|provided|suppose|case)\b", re.IGNORECASE
)
CORRECTION = re.compile(
    r"\b(?:wait|actually|but|however|instead|rather|re-?check\w*|check\w*|mistake|oops|sorry|wrong|"
    r"incorrect|correct\w*|redo|again|error)\b",
    re.IGNORECASE,
)
MAX_LABEL_GAP_CHARS = 80
VALUE_SPAN = r"(?:\$M{0,5000}\$|\\M{0,5000}[)\]]|(?<![\d.,/])-?\d[\d.,/]{0,40}(?![\d.,/]))"
ALTERNATIVES = re.compile(
    rf"[^.!?\n]{{0,60}}?(?:\beither\s+{VALUE_SPAN}[^.!?\n]{{0,80}}?\bor\b\s+(?:\w+\s+){{0,2}}?{VALUE_SPAN}"
    rf"|{VALUE_SPAN}\s+or\s+{VALUE_SPAN}[^.!?\n]{{0,40}}?\b(?:depending|depends)\b)",
    re.IGNORECASE,
)
CLAUSE_NEGATION = re.compile(
    r"\b(?:not|no|never|cannot|neither|nor|without|incorrect|wrong|impossible)\b|n't\b", re.IGNORECASE
)
LEAD = re.compile(r"[\s*_:]*")
SENTENCE_END = re.compile(r"(?<!\\)[.;!?](?=\s|$)|\n")  # not LaTeX spacing: "11,\! 111"
ENV_SEPARATOR = re.compile(r"\s*(?:,|;|,?\s*\band\b|,?\s*\bor\b)\s*")
MAX_SENTENCE_CHARS = 500  # an answer sentence is short; longer is prose (and bounds hostile text)
EMPHASIS = re.compile(r"\*\*|__")  # markdown bold around an answer: "The answer is: **42**."
JUDGEMENTS = {
    "correct", "incorrect", "right", "wrong", "reasonable", "plausible", "valid", "invalid", "consistent",
    "confirmed", "verified", "clear", "obvious", "simple", "straightforward", "complete", "done", "below",
    "above", "same", "unique", "unchanged", "not", "that", "this", "as", "still", "indeed", "the", "a",
    "an", "is", "are", "it", "we", "so", "see", "shown", "given", "follows",
}  # fmt: skip

CHOICE = re.compile(r"\([A-E]\)")
MATHS_SPAN = re.compile(r"\$M*\$|\\M*[)\]]|\d(?:[\d,.]*\d)?")


def affirms(masked_clause: str) -> bool:
    """Does the clause state its maths: no question ("So is it 204?"), no negation bearing on it?"""
    return not masked_clause.strip().endswith("?") and not negated(masked_clause)


def negated(masked_clause: str) -> bool:
    """Does a negation bear on the clause's last maths: anywhere after the maths before it ("would not be
    204", "204, but that is wrong"), not before it ("is not 10 which is 1,000.99")?"""
    spans = list(MATHS_SPAN.finditer(masked_clause))
    since = spans[-2].end() if len(spans) > 1 else 0
    return CLAUSE_NEGATION.search(masked_clause, since) is not None


def sentence_start(masked: str, at: int) -> int:
    ends = [m.end() for m in SENTENCE_END.finditer(masked, max(0, at - MAX_SENTENCE_CHARS), at)]
    return ends[-1] if ends else max(0, at - MAX_SENTENCE_CHARS)
