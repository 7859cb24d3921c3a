"""When two parsed answers are equal: math-verify's `verify`, exact where both sides are exact.

math-verify compares values that are not plain numbers with an absolute tolerance (1/2006! equalled 1/2004!)
and rounds a decimal to 6 places, and no option of `verify` changes either, so rlbench replaces the one
function that does both, `math_verify.grader.sympy_numeric_eq`, which math-verify calls for every pair it
compares (inside tuples, sets, intervals, matrices and relations too), and gives a second form to what it
parses but does not compare. The rules are docs/eval.md's "When two answers are equal".
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
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
    from math_verify.grader import safe_sympy_doit
    from sympy.core.evalf import PrecisionExhausted

    try:
        # latex2sympy builds unevaluated trees: two parses of the same nested radical need not cancel until
        # they are rebuilt (else evalf cannot tell the exact 0, and simplify ran past its limit)
        diff = safe_sympy_doit(a) - safe_sympy_doit(b)
        if diff == 0:
            return True
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


def _both_numbers(a: Any, b: Any) -> bool:
    return bool(getattr(a, "is_number", False) and getattr(b, "is_number", False))


def _rounded_equal(a: Any, b: Any, float_rounding: int) -> bool:
    """math-verify's rounding of a decimal, applied to the values of two numbers."""
    from sympy import N

    try:
        x, y = complex(N(a, 30)), complex(N(b, 30))
    except (TypeError, ValueError):
        return False
    return round(x.real, float_rounding) == round(y.real, float_rounding) and round(
        x.imag, float_rounding
    ) == round(y.imag, float_rounding)


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
        if math_verify_numeric_eq(a, b, float_rounding, numeric_precision):
            return _relatively_close(a, b)
        # math-verify rounds only a bare decimal: "2.314814814815 \\times 10^{-3}" is a product, compared
        # with 1/432 exactly. A number holding a decimal is an approximation wherever the decimal sits.
        return _both_numbers(a, b) and _rounded_equal(a, b, float_rounding) and _relatively_close(a, b)

    numeric_eq.rlbench_exact = True  # type: ignore[attr-defined]
    numeric_eq.as_released = math_verify_numeric_eq  # type: ignore[attr-defined]  # the second opinion's
    return numeric_eq


def install_exact_comparison() -> None:
    """Put the comparison above in math-verify's place (once per process; forked workers inherit it)."""
    import math_verify.grader as grader

    current = getattr(grader, "sympy_numeric_eq", None)
    if current is None:  # a math-verify release that renamed it: fail loudly rather than grade loosely
        raise ImportError("math_verify.grader.sympy_numeric_eq is gone; rlbench's exact comparison needs it")
    if not getattr(current, "rlbench_exact", False):
        grader.sympy_numeric_eq = _make_numeric_eq(current)


@contextlib.contextmanager
def math_verify_as_released() -> Iterator[None]:
    """math-verify's own comparison in place of the one above, for the length of the block: the second
    grader (`second_opinion`) is plain math-verify. A worker grades one item at a time, so the swap is
    never seen by another grading."""
    import math_verify.grader as grader

    current = grader.sympy_numeric_eq
    grader.sympy_numeric_eq = getattr(current, "as_released", current)
    try:
        yield
    finally:
        grader.sympy_numeric_eq = current


# ----------------------------------------------------------------------------- second forms

_OR_WORD = re.compile(r"\bor\b")
_AND_WORD = re.compile(r"\band\b")


def relations_as_set(latex: str, value: Any) -> Any:
    """`x < 2 or x > 3` (math-verify: the set {x < 2, x > 3}) as the union of intervals it describes, and
    `x > 1 and x < 3` as the intersection; None when `value` is not such a list or the joining word is
    not one "or" or "and" (a comma alone says neither)."""
    from sympy import And, Eq, FiniteSet, Intersection, Union
    from sympy.core.relational import Relational

    if not isinstance(value, FiniteSet) or len(value.args) < 2:
        return None

    def inequality(r: Any) -> bool:  # x < 2, or a chain: -\\sqrt{11} < x < -2
        if isinstance(r, And):
            return all(inequality(a) for a in r.args)
        return isinstance(r, Relational) and not isinstance(r, Eq)

    if not all(inequality(r) for r in value.args):
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


_APPROX = re.compile(r"\\approx\s*(-?\d+(?:\.(\d+))?)\s*$")


def contradicts_approximation(latex: str, value: Any) -> bool:
    """Does an answer that ends on an approximation ("x = \\frac{1}{3} \\approx 0.33") give one its exact
    value does not round to ("x = 5+5+1 = 1/3 \\approx 11", "x=1/3\\approx1.3")? Such an answer states no
    value a grader can sign. The approximation may be off by half its last place, or 1%."""
    from sympy import And, N

    m = _APPROX.search(latex)
    exact = value
    while isinstance(exact, And) or getattr(exact, "is_Relational", False):  # a chain "x = a = b": its last
        exact = exact.args[-1] if isinstance(exact, And) else exact.rhs
    if m is None or not getattr(exact, "is_number", False):
        return False
    try:
        x = float(N(exact))
    except (TypeError, ValueError):
        return False
    approx = float(m.group(1))
    tolerance = max(0.5 * 10 ** -len(m.group(2) or ""), 0.01 * abs(approx))
    return abs(x - approx) > tolerance


def _any_argument(value: Any) -> Any:
    """A function's definition with its argument renamed to one shared symbol ("W(x) = 1" and "W(n) = 1"
    define the same W), also inside a set of them; None when `value` defines no function of one variable."""
    from sympy import Eq, FiniteSet, Symbol
    from sympy.core.function import AppliedUndef

    argument = Symbol("argument")  # one name for every definition, so that two sides compare

    def renamed(eq: Any) -> Any:
        if not isinstance(eq, Eq) or not isinstance(eq.lhs, AppliedUndef) or len(eq.lhs.args) != 1:
            return None
        variable = eq.lhs.args[0]
        if not getattr(variable, "is_Symbol", False):
            return None
        return Eq(eq.lhs.func(argument), eq.rhs.subs(variable, argument), evaluate=False)

    try:
        if isinstance(value, FiniteSet):
            forms = [renamed(e) for e in value.args]
            return None if any(f is None for f in forms) else FiniteSet(*forms)
        return renamed(value)
    except Exception:  # a form sympy cannot rebuild: no second form
        return None


def second_forms(parsed: Sequence[Any]) -> list[Any]:
    """`parsed` plus the tuple form of any row or column vector in it, a function's definition with its
    argument renamed (`_any_argument`), and the form with `i` the imaginary unit of any value holding the
    symbol i (latex2sympy reads `i(2-i)` as a product of a variable i)."""
    from sympy import I, Tuple

    extra = [Tuple(*x) for x in parsed if _is_matrix(x) and 1 in getattr(x, "shape", ()) and len(x) > 1]
    extra += [named for x in parsed if (named := _any_argument(x)) is not None]
    for x in [*parsed, *extra]:
        # (latex2sympy's symbols may carry assumptions: the symbol is found by its name)
        found = [v for v in getattr(x, "free_symbols", ()) if getattr(v, "name", None) == "i"]
        if found and not isinstance(x, str):
            try:
                extra.append(x.subs(found[0], I))
            except Exception:  # a form sympy cannot substitute into: no second form
                continue
    return [*parsed, *extra]


def equivalent(gold: Sequence[Any], pred: Sequence[Any], timeout_s: int) -> bool:
    """Does any form of the prediction equal any form of the gold (math-verify's `verify`), or describe the
    same curve (`same_curve`)?"""
    from math_verify import verify

    if not gold or not pred:
        return False
    install_exact_comparison()
    found = verify(
        second_forms(gold), second_forms(pred), timeout_seconds=timeout_s, allow_set_relation_comp=True
    )
    return bool(found) or any(same_curve(g, p) for g in gold for p in pred)


def same_curve(a: Any, b: Any) -> bool:
    """Are two equations in two or more variables the same curve or surface, one a nonzero constant times the
    other (`2x+y-1=0` and `y=-2x+1`; math-verify compares them side by side)? An equation in one variable
    is an assignment, left to math-verify (`3k = 9` is no final `k = 3`)."""
    from sympy import Eq, cancel

    if not (isinstance(a, Eq) and isinstance(b, Eq)) or len(a.free_symbols | b.free_symbols) < 2:
        return False
    try:
        ratio = cancel((a.lhs - a.rhs) / (b.lhs - b.rhs))
    except Exception:  # an expression sympy cannot divide: not shown equal
        return False
    return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
