"""Readings of an answer that need the problem or the gold: an option's text for its letter (when the
problem lists its options), a named matrix against a matrix gold, and an equation of a quantity the
problem does not ask for. The answer text itself is located and cleaned before (answer_extraction.py,
answer_forms.py); these only add readings, so a rule here can make a right answer right, and a reading
that is not an option, not a matrix, leaves the verdict to the answer's own text.
"""

from __future__ import annotations

import re

# "(A) Line (B) Point", "\\textbf{(C) } 27 \\qquad", "A. Line\nB. Point", "(C): Plane": a letter and its text,
# up to the next option or the end of the line.
_OPTION = re.compile(
    r"(?:\\textbf\{\s*)?(?:\(([A-E])\)|(?:^|(?<=\n))[ \t]*([A-E])[.):])\s*\}?\s*:?\s*"
    r"(.{1,120}?)(?=\s*(?:\\q?quad\s*)*(?:\\textbf\{\s*)?\([A-E]\)|\s*\n|\s*$)",
    re.MULTILINE,
)
_LETTER = re.compile(r"\s*(?:\\text(?:bf)?\s*\{\s*)?\(?([A-E])\)?\s*\}?\s*\.?\s*")
_WRAPPERS = re.compile(r"\\(?:text\w*|mathrm|mbox)\s*\{([^{}]*)\}|\\q?quad|\$|\\[,;! ]")


def _plain(text: str) -> str:
    """An option's text or an answer, compared as text: no wrappers, spacing, case or final stop."""
    while (unwrapped := _WRAPPERS.sub(lambda m: m.group(1) or " ", text)) != text:
        text = unwrapped
    return re.sub(r"\s+", " ", text).strip().rstrip(".").strip().lower()


def options(problem: str) -> dict[str, str]:
    """The problem's options, letter -> text as written ({} when it lists fewer than two)."""
    found: dict[str, str] = {}
    for m in _OPTION.finditer(problem):
        found.setdefault(m.group(1) or m.group(2), m.group(3).strip())
    return found if len(found) >= 2 else {}


def letter(answer: str) -> str | None:
    """The option letter an answer is, written alone ("(C)", "\\text{(C)}", "C")."""
    m = _LETTER.fullmatch(answer)
    return m.group(1) if m else None


def option_readings(answer: str, problem: str) -> list[str]:
    """Other readings of an answer to a problem that lists options: its option's letter when it is an
    option's text ("\\text{Plane}" for "(C) Plane" reads "(C)"), or its letter's text when it is a letter."""
    listed = options(problem)
    if not listed:
        return []
    if (own := letter(answer)) is not None:
        return [listed[own]] if own in listed else []
    plain = _plain(answer)
    return [f"({x})" for x, text in listed.items() if plain and _plain(text) == plain]


# A named matrix: the identity (\\mathbf{I}, I, I_2, I_{3}) or the zero matrix (\\mathbf{0}, \\mathbf{O}).
_IDENTITY = re.compile(r"\\mathbf\s*\{\s*I\s*\}(?:_\{?\d\}?)?|(?<![A-Za-z\\])I(?:_\{?\d\}?)?(?![A-Za-z])")
_ZERO = re.compile(r"\\mathbf\s*\{\s*[0O]\s*\}(?:_\{?\d\}?)?")
_MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix)\}(.*?)\\end\{\1\}", re.DOTALL)


def _square_size(gold: str) -> int | None:
    m = _MATRIX.fullmatch(gold.strip())
    if m is None:
        return None
    rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
    return len(rows) if all(r.count("&") == len(rows) - 1 for r in rows) else None


def _matrix(n: int, diagonal: str) -> str:
    rows = [" & ".join(diagonal if i == j else "0" for j in range(n)) for i in range(n)]
    return "\\begin{pmatrix}" + " \\\\ ".join(rows) + "\\end{pmatrix}"


def named_matrix_reading(answer: str, gold: str) -> str | None:
    """The answer with its named matrices written out at the gold's size ("-\\mathbf{I}" against a 2x2 gold
    is -[[1, 0], [0, 1]]); None when the gold is no square matrix or the answer names none."""
    n = _square_size(gold)
    if n is None or not (_IDENTITY.search(answer) or _ZERO.search(answer)):
        return None
    written = _IDENTITY.sub(lambda _m: _matrix(n, "1"), answer)
    return _ZERO.sub(lambda _m: _matrix(n, "0"), written)


_FUNCTION_OF = re.compile(
    r"\\(?:log|ln|lg|exp|sin|cos|tan|cot|sec|csc|arcsin|arccos|arctan)(?![A-Za-z])|[A-Za-z]\("
)


def answers_another_quantity(answer: str, gold: str, problem: str) -> bool:
    """Is the answer an equation giving the value of a function of something the problem does not ask for
    ("\\log a^b = 0" for "find a + b": math-verify compares its right side with a gold that is no equation)?
    A left side written in the problem ("f(2) = 5" for "find f(2)") or a variable is what was asked."""
    if not problem or "=" not in answer or "=" in gold:
        return False
    left = answer.split("=", 1)[0]
    if not _FUNCTION_OF.search(left):
        return False
    return _squeezed(left) not in _squeezed(problem)


def _squeezed(latex: str) -> str:
    return re.sub(r"\s+|\$|\\left|\\right", "", latex)
