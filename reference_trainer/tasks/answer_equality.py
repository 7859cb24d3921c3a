"""When two parsed answers are equal: math-verify's `verify`, exact where both sides are exact.

math-verify compares two values that are not plain numbers by `(a - b).evalf(chop=True, n=15) == 0`, an
absolute tolerance under which 1/2006! equals 1/2004! and 1/2^98 equals 1/2^99; and it rounds a decimal and
the value it is compared with to 6 places, so 0.0000001 equals 1/2^99. No option of `verify` changes either
(`numeric_precision` only moves the threshold), so rlbench replaces the one function that does both,
`math_verify.grader.sympy_numeric_eq`, which math-verify calls for every pair it compares, inside tuples,
sets, intervals, matrices and relations too:

* both sides exact (no decimal in either): equal only if sympy evaluates their difference to exactly 0, or
  math-verify's next step, `simplify(a - b)`, proves it 0; a difference sympy can tell from 0 at any
  precision (1/2006! - 1/2004! is about 1.9e-5749) is a difference;
* a decimal on either side (a genuine approximation): math-verify's 6-place rounding, and also agreement
  within 1e-4 of the larger magnitude, so that a tiny value is not rounded to the same 0.

Forms math-verify parses but does not compare are given a second form: a row or column vector also as a
tuple (`(1, 2, 3)` vs a `pmatrix`), and relations joined by "or"/"and" in one variable as the set they
describe (`x < 2 \\text{ or } x > 3` vs `(-\\infty, 2) \\cup (3, \\infty)`). A relation against a set
(`m \\geq \\sqrt2` vs `[\\sqrt2, \\infty)`) is math-verify's own `allow_set_relation_comp`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_REL_TOLERANCE = 1e-4
_EXACT_DIGITS = 30
_MAX_DIGITS = 1000  # sympy raises PrecisionExhausted past this; the difference is then left to simplify


def _is_matrix(x: Any) -> bool:
    from sympy import MatrixBase
    from sympy.matrices.expressions import MatrixExpr

    return isinstance(x, (MatrixBase, MatrixExpr))


def _has_decimal(x: Any) -> bool:
    from sympy import Basic, Float

    return isinstance(x, Basic) and x.has(Float)


def _difference_is_zero(a: Any, b: Any) -> bool:
    """Exact equality of two exact numbers: their difference evaluated with sympy's adaptive precision,
    which finds a nonzero difference however small. Symbolic expressions are left to simplify."""
    from sympy.core.evalf import PrecisionExhausted

    try:
        diff = a - b
        if not getattr(diff, "is_number", False):
            return False
        return diff.evalf(_EXACT_DIGITS, strict=True, maxn=_MAX_DIGITS) == 0
    except PrecisionExhausted:
        return False  # indistinguishable from 0 at 1,000 digits: simplify (math-verify's next step) decides
    except Exception:
        return False


def _relatively_close(a: Any, b: Any) -> bool:
    from math_verify.grader import safe_sympy_doit
    from sympy import N

    try:
        x, y = complex(N(safe_sympy_doit(a), 30)), complex(N(safe_sympy_doit(b), 30))
    except (TypeError, ValueError):
        return True  # not numbers (a symbol times a decimal): math-verify's verdict stands
    return abs(x - y) <= _REL_TOLERANCE * max(abs(x), abs(y))


def _make_numeric_eq(math_verify_numeric_eq: Any) -> Any:
    from math_verify.grader import is_atomic_or_pct_atomic
    from sympy import Number

    def numeric_eq(a: Any, b: Any, float_rounding: int, numeric_precision: int) -> bool:
        if _is_matrix(a) or _is_matrix(b):
            return math_verify_numeric_eq(a, b, float_rounding, numeric_precision)  # elementwise, via here
        if not (_has_decimal(a) or _has_decimal(b)):
            if is_atomic_or_pct_atomic(a, Number) or is_atomic_or_pct_atomic(b, Number):
                return math_verify_numeric_eq(a, b, float_rounding, numeric_precision)  # exact already
            return _difference_is_zero(a, b)
        return math_verify_numeric_eq(a, b, float_rounding, numeric_precision) and _relatively_close(a, b)

    numeric_eq.rlbench_exact = True  # type: ignore[attr-defined]
    return numeric_eq


def install_exact_comparison() -> None:
    """Put the comparison above in math-verify's place (once per process; forked workers inherit it)."""
    import math_verify.grader as grader

    current = getattr(grader, "sympy_numeric_eq", None)
    if current is None:  # a math-verify release that renamed it: fail loudly rather than grade loosely
        raise ImportError("math_verify.grader.sympy_numeric_eq is gone; rlbench's exact comparison needs it")
    if not getattr(current, "rlbench_exact", False):
        grader.sympy_numeric_eq = _make_numeric_eq(current)


# ----------------------------------------------------------------------------- second forms

_OR_WORD = re.compile(r"\bor\b")
_AND_WORD = re.compile(r"\band\b")


def relations_as_set(latex: str, value: Any) -> Any:
    """`x < 2 or x > 3` (math-verify: the set {x < 2, x > 3}) as the union of intervals it describes, and
    `x > 1 and x < 3` as the intersection; None when `value` is not such a list or the joining word is
    not one "or" or "and" (a comma alone says neither)."""
    from sympy import Eq, FiniteSet, Intersection, Union
    from sympy.core.relational import Relational

    if not isinstance(value, FiniteSet) or len(value.args) < 2:
        return None
    if not all(isinstance(r, Relational) and not isinstance(r, Eq) for r in value.args):
        return None  # equations joined by "and" are a list of solutions ("p = -1 and p = 15/8"), not a set
    symbols = {frozenset(r.free_symbols) for r in value.args}
    if len(symbols) != 1 or len(next(iter(symbols))) != 1:
        return None
    has_or, has_and = bool(_OR_WORD.search(latex)), bool(_AND_WORD.search(latex))
    if has_or == has_and:
        return None
    try:
        sets = [r.as_set() for r in value.args]
    except Exception:
        return None
    return Union(*sets) if has_or else Intersection(*sets)


def second_forms(parsed: Sequence[Any]) -> list[Any]:
    """`parsed` plus the tuple form of any row or column vector in it."""
    from sympy import Tuple

    extra = [Tuple(*x) for x in parsed if _is_matrix(x) and 1 in getattr(x, "shape", ()) and len(x) > 1]
    return [*parsed, *extra]


def equivalent(gold: Sequence[Any], pred: Sequence[Any], timeout_s: int) -> bool:
    """Does any form of the prediction equal any form of the gold (math-verify's `verify`)?"""
    from math_verify import verify

    if not gold or not pred:
        return False
    install_exact_comparison()
    return bool(
        verify(
            second_forms(gold),
            second_forms(pred),
            timeout_seconds=timeout_s,
            allow_set_relation_comp=True,
        )
    )
