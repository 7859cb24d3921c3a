"""Estimators against hand-computed values and brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import pytest

from rlbench.eval.estimators import avg_at_k, majority_correct, majority_vote, pass_at_k, pass_ks


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n samples (c of them correct) that hold at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_hand_values_and_stability() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    # n = 2000 overflows float binomials; the product form stays exact enough
    assert pass_at_k(2000, 3, 100) == pytest.approx(1 - math.comb(1997, 100) / math.comb(2000, 100), rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)


def test_avg_and_ks() -> None:
    assert avg_at_k([True, False, False, True]) == 0.5
    assert avg_at_k([]) == 0.0
    assert pass_ks(1) == [1] and pass_ks(8) == [1, 2, 4, 8] and pass_ks(6) == [1, 2, 4, 6]


def test_majority_vote() -> None:
    """Votes are over answer classes, right or wrong alike; ties go to the class seen first."""
    # classes [7], [0.5, 1/2, \frac12]: the three wrong answers outvote the right one
    assert (
        majority_vote([0, 1, 1, 1]) == 1
        and majority_correct([0, 1, 1, 1], [True, False, False, False]) is False
    )
    assert majority_vote([0, 1, 0, 1]) == 0  # tie: the class seen first, represented by its first sample
    assert majority_correct([0, 1, 0, 1], [True, False, True, False]) is True
    assert majority_correct([1, 0, 1, 0], [False, True, False, True]) is False  # labels need not be ordered
    assert majority_vote([5, 3, 4, 2]) == 0  # all different: the first answer
    assert majority_vote([None, None, 0]) == 2 and majority_correct([None, None, 0], [False, False, True])
    assert majority_vote([None, None]) is None and majority_correct([None, None], [False, False]) is False
    with pytest.raises(ValueError):
        majority_correct([0], [True, False])
