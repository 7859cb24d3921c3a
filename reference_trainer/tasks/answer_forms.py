"""An answer's own text made ready for math-verify's parser, the same for golds and responses: each rewrite
here is of a form math-verify (its LaTeX normalisation, then latex2sympy) reads wrongly and that no option
of math-verify covers. The rewrites, each with what math-verify made of the form, are docs/eval.md's
"Answer forms"; text that no rewrite makes a single value is compared as text only (`text_only`).
"""

from __future__ import annotations

import re

# LaTeX whose braces hold words, not maths: \text{even}, \begin{pmatrix}, \operatorname{lcm}.
_WORDY_COMMANDS = re.compile(
    r"\\(?:text\w*|math(?:rm|bf|it|sf|tt)|mbox|operatorname|begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+"
    r"|_\{[^{}]*\}"  # a subscript names something: S_{MBCN}
)
# "1 and 2" is maths; two-letter words that are English, not a product of variables, are prose
# ("$100x - x = 36$, so $x = 4/11$" is an equation chain, not an answer)
_PROSE_WORD = re.compile(
    r"(?<![A-Za-z])(?:(?!and(?![A-Za-z]))[A-Za-z]{3,}|(?i:so|is|as|we|if|it|be|to|of|by))(?![A-Za-z])"
)


def prose_start(text: str) -> int | None:
    """Where prose begins in a LaTeX answer: the first run of 3+ letters (but "and"), or an English word of
    two ("so", "is", "if", ...), outside LaTeX commands and their word arguments (other single letters and
    pairs are variables: "2k+2", "mn"). None when none."""
    blanked = _WORDY_COMMANDS.sub(lambda m: " " * len(m.group(0)), text)
    m = _PROSE_WORD.search(blanked)
    return m.start() if m else None


# ----------------------------------------------------------------------------- rewrites

_QUOTES = re.compile(r'^(?:\\?")+|(?:\\?")+$')  # an answer written in quotes: "$12$ and $13$"
_GLUED_OR = re.compile(r"(?<=[\d)}])or(?=[A-Za-z(\\-])")  # "W(x)=1orW(x)=-1"
_SQRT_PARENS = re.compile(r"\\sqrt\s*\(([^()]*)\)")
_CHOICE_LABEL = re.compile(
    r"\s*(?:\\(?:textbf|text|mathrm|mathbf)\s*\{\s*\(?([A-E])\)?\s*\}|\(([A-E])\))"
    r"(?:\s|~|\\[ ,;:!]|\\q?quad)*(?P<value>[-\d\\(].*)",
    re.DOTALL,
)
_TEXT_NUMBER = re.compile(r"\\(?:text|textrm|mbox|mathrm)\s*\{\s*(-?\d[^{}]*)\}")
# Short units (1-2 letters would otherwise be variables: "10 m" vs "10m"); longer words are units unless
# they change the value.
_SHORT_UNITS = "cm|mm|km|m|kg|mg|g|ml|mL|L|l|ft|in|yd|mi|oz|lb|lbs|hr|h|min|s|sec|ms|kW|W|V|A|J|N|Pa|Hz"
# Words after a number that change its value: never dropped as units (math-verify drops any trailing
# \text{...}, so "10 \text{ hundred}" would be 10).
_VALUE_WORDS = {
    "hundred", "hundreds", "thousand", "thousands", "million", "millions", "billion", "billions",
    "trillion", "dozen", "dozens", "times", "pi", "sin", "cos", "tan", "log", "ln", "exp", "sqrt",
    "squared", "cubed", "half", "halves", "third", "thirds", "quarter", "quarters",
}  # fmt: skip
_NOT_UNITS = _VALUE_WORDS | {"and", "or", "percent"}


def changes_value(word: str) -> bool:
    """Is this word after a number part of its value ("3 dozen", "10 hundred", "2 pi")?"""
    return word.strip(".,;:").lower() in _VALUE_WORDS


_UNIT_WORD = rf"(?:[A-Za-z]{{3,}}|(?:{_SHORT_UNITS})(?![A-Za-z]))"
# Units written against the number ("10weeks", "5cm"): only these, so that "2abc" stays a product.
_GLUED_UNITS = (
    "cm|mm|km|kg|mg|ml|ft|yd|oz|lbs?|hrs?|mins?|secs?|days?|weeks?|months?|years?|hours?|minutes?|seconds?|"
    "meters?|metres?|inch(?:es)?|feet|foot|miles?|dollars?|cents?|euros?|pounds?|units?|degrees?"
)
_TRAILING_UNITS = re.compile(
    rf"(?P<value>.*?[\d}})])(?P<unit>(?:(?:(?:\s|~|\\[ ,;:!])+{_UNIT_WORD}"
    rf"|(?<=\d)(?:{_GLUED_UNITS})(?![A-Za-z]))(?:\^\{{?\d\}}?)?)+)\s*\.?\s*$",
    re.DOTALL,
)
_REPEATING = re.compile(r"(-?)(\d*)\.(\d*)\\overline\s*\{(\d+)\}")
_MIXED = re.compile(r"\s*(-?)(\d+)\s+(\d+)\s*/\s*(\d+)\s*")
_OR_SYMBOLS = re.compile(r"\\(?:lor|vee)(?![A-Za-z])")
_EMPTY_SET = re.compile(r"\\varnothing(?![A-Za-z])|\\\{\s*\\\}")  # math-verify parses only \emptyset
# Thousands separators math-verify does not know (it reads "7,425,000" and "1{,}000" already); "0,111" is
# a decimal comma (math-verify: 0.111), never a grouped number.
_GROUPED_NUMBER = re.compile(r"-?[1-9]\d{0,2}(?:(?:\s|~|\\[ ,;:!]|,|\{,\})\d{3})+(?:\.\d+)?")
_GROUP_SEPARATOR = re.compile(r"\s|~|\\[ ,;:!]|,|\{,\}")
_PERCENT_WORD = re.compile(r"(?<=[\d}])\s*(?:\\?%|percent(?:age)?|pct)\s*\.?\s*$", re.IGNORECASE)


def _without_units(value: str) -> str:
    m = _TRAILING_UNITS.fullmatch(value)
    if m is None:
        return value
    words = re.findall(r"[A-Za-z]+", m.group("unit"))
    kept = m.group("value")
    if any(w.lower() in _NOT_UNITS for w in words) or not re.search(r"\d", kept) or prose_start(kept):
        return value
    return kept


def _repeating_to_fraction(m: re.Match[str]) -> str:
    sign, whole, fixed, period = m.groups()
    # x = whole.fixed(period)...: x * 10^len(fixed) * (10^len(period) - 1) is an integer
    denominator = 10 ** len(fixed) * (10 ** len(period) - 1)
    numerator = int(f"{whole or 0}{fixed}{period}") - int(f"{whole or 0}{fixed}" or 0)
    return f"{sign}\\frac{{{numerator}}}{{{denominator}}}"


def clean_value(value: str) -> str:
    """The answer text rewritten as described above (the text stays LaTeX)."""
    text = _QUOTES.sub("", value.strip()).strip().strip("$").strip()
    text = _GLUED_OR.sub(r" \\text{ or } ", text)
    text = _SQRT_PARENS.sub(r"\\sqrt{\1}", text)
    if m := _CHOICE_LABEL.fullmatch(text):
        text = m.group("value").strip()
    text = _TEXT_NUMBER.sub(r"\1", text)
    text = _CURRENCY_SIGN.sub("", _INFINITY_SIGN.sub(r"\\infty", text))
    text = _CLOCK_SECONDS.sub(r"\1", text)
    text = _PERCENT_WORD.sub(r"\\%", text)
    text = _without_units(text)
    if _GROUPED_NUMBER.fullmatch(text):
        text = _GROUP_SEPARATOR.sub("", text)
    text = _REPEATING.sub(_repeating_to_fraction, text)
    if m := _MIXED.fullmatch(text):
        sign, whole, num, den = m.groups()
        text = f"{sign}\\frac{{{int(whole) * int(den) + int(num)}}}{{{den}}}"
    text = _OR_SYMBOLS.sub(r"\\text{ or }", text)
    text = _EMPTY_SET.sub(r"\\emptyset", text)
    if _TRIG.search(text):  # math-verify drops "^\\circ": sin(90^\\circ - x) would be sin(90 - x) radians
        text = _DEGREES.sub(r"\\left(\\frac{\1\\pi}{180}\\right)", text)
    if m := _INFINITY_WORD.fullmatch(text):
        text = "-\\infty" if m.group(1) else "\\infty"
    elif m := _CLOCK_12H.fullmatch(text):
        hour = int(m.group(1)) % 12 + (12 if m.group(3).lower() == "p" else 0)
        text = f"\\text{{{clock_24h(hour, m.group(2))}}}"
    words = _TEXT_WORDS.fullmatch(text)  # "\\text{thirty-seven}" is 37, as "thirty-seven" is
    if (number := number_from_words(words.group(1) if words else text)) is not None:
        text = str(number)
    return text.strip()


# A currency sign before its amount ("R28", "\\$18", "€5", "Rs. 40", "US$ 3"): the amount is the value.
_CURRENCY_SIGN = re.compile(r"^(?:\\\$|US\$|[€£¥₹]|Rs\.?|R(?=\d))\s*(?=-?\d)")
_INFINITY_SIGN = re.compile("∞")
# A clock time's zero seconds ("20:34:00" is 20:34); other seconds stay ("20:34:15" is another time).
_CLOCK_SECONDS = re.compile(r"(?<![\d:])(\d{1,2}:[0-5]\d):00(?![\d:])")
_TEXT_WORDS = re.compile(r"\\(?:text|textrm|mbox|mathrm)\s*\{([A-Za-z \-]+)\}")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![A-Za-z])")
_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°)")
_INFINITY_WORD = re.compile(r"\s*(?:(?:\+|positive|plus)\s*|(-|negative\s+|minus\s+))?infinity\s*", re.I)
# A clock time with A.M./P.M. ("08:34 P.M.") is compared as its 24-hour text ("20:34"), never as a ratio.
_CLOCK_12H = re.compile(
    r"\s*(\d{1,2})\s*:\s*([0-5]\d)\s*(?:\\(?:text|mathrm)\s*\{\s*)?([AaPp])\.?\s*[Mm]\.?\s*\}?\s*\.?\s*"
)
CLOCK_24H = re.compile(r"\s*([01]?\d|2[0-3])\s*:\s*([0-5]\d)\s*")


def clock_24h(hour: int, minute: str) -> str:
    return f"{hour:02d}:{minute}"


_ELLIPSIS = re.compile(r"\\[lc]?dots[bcmio]?(?![A-Za-z])|\.\.\.|…")
_LINE_BREAK = re.compile(r"\\\\")
_MATRIX_ENV = re.compile(r"\\begin\{(?:[pbvBV]?matrix|array|smallmatrix|cases)\}", re.IGNORECASE)


_CLOCK_TEXT = re.compile(r"\\text\{\d\d:\d\d\}")
_TEXT_ARGUMENT = re.compile(r"\\(?:text\w*|mbox|math(?:rm|bf|it))\s*\{([^{}]*)\}")


def text_only(latex: str) -> bool:
    """Is this answer a pattern, several lines, a clock time or a number with words that change it, rather
    than one value? Such an answer is compared as text only."""
    if _ELLIPSIS.search(latex) or _CLOCK_TEXT.fullmatch(latex):
        return True
    for words in _TEXT_ARGUMENT.findall(latex):
        if any(w.lower() in _VALUE_WORDS for w in re.findall(r"[A-Za-z]+", words)):
            return True
    return bool(_LINE_BREAK.search(latex)) and not _MATRIX_ENV.search(latex)


# ----------------------------------------------------------------------------- number words

_UNITS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]  # fmt: skip
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def number_from_words(text: str) -> int | None:
    """ "two hundred four" -> 204, "minus twelve" -> -12; None unless the whole text is an English
    cardinal (hand-written: a dozen lines, where a dependency such as word2number would be one more
    package to vet for a parser this small)."""
    words = re.sub(r"[-,]", " ", text.strip().rstrip(".").lower()).split()
    sign = -1 if words[:1] in (["minus"], ["negative"]) else 1
    words = words[1:] if sign < 0 else words
    if not words:
        return None
    total = current = 0
    for w in words:
        if w == "and" and current:
            continue
        if w in _UNITS:
            current += _UNITS.index(w)
        elif w in _TENS:
            current += 10 * (_TENS.index(w) + 2)
        elif w == "hundred" and current:
            current *= 100
        elif w in _SCALES and current:
            total += current * _SCALES[w]
            current = 0
        else:
            return None
    return sign * (total + current)


# ----------------------------------------------------------------------------- an equality chain

_INDEX = re.compile(r"_\{?\w+\}?")
# A list of equations ("x = 2, x = 1"; a comma that groups digits is none: "26{,}000"), a system (a line
# break, "\\quad") or an approximation is no chain.
_NOT_ONE_CHAIN = re.compile(
    r"(?<!\{),(?!\}|\d{3}(?!\d))|;|\\text|\\q?quad|\\\\|\\approx|\\(?:lor|land|vee|wedge)\b|\b(?:and|or)\b"
)


def _top_level_equals(latex: str) -> list[int]:
    """Positions of the `=` signs outside braces and brackets."""
    depth, found = 0, []
    for i, ch in enumerate(latex):
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif depth == 0 and ch == "=" and latex[i - 1 : i] not in "<>!\\=" and latex[i + 1 : i + 2] != "=":
            found.append(i)
    return found


def chain_end(latex: str) -> str:
    """An equality chain's last value: "(513 - 487)(513 + 487) = 26 \\cdot 1000 = 26,000" is 26,000 and
    "x = 5+5+1 = 1/3" is x = 1/3 (the name it opens with is kept: a variable or a label, no digits outside
    its indices). The steps between are working, not the answer (math-verify reads the chain as a
    conjunction of equations, true only where every step is). A single equation, a list or a system of
    equations stays as it is."""
    at = _top_level_equals(latex)
    if len(at) < 2 or _NOT_ONE_CHAIN.search(latex):
        return latex
    first, last = latex[: at[0]].strip(), latex[at[-1] + 1 :].strip()
    if not last:
        return latex
    named = re.search(r"[A-Za-z]", first) and not re.search(r"\d", _INDEX.sub("", first))
    return f"{first} = {last}" if named else last
