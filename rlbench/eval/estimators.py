"""Accuracy estimators over K samples per problem: avg@k, unbiased pass@k, maj@k."""

from __future__ import annotations

from collections.abc import Sequence


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean accuracy over the samples of one problem."""
    return sum(bool(c) for c in correct) / len(correct) if correct else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as the stable product
    1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_correct(keys: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k for one problem: does the most common answer grade correct?

    Equivalence-aware where cheap: every correct sample is equivalent to the gold, hence to each other,
    so they vote as one answer even when written differently (1/2 vs 0.5); wrong answers vote by their
    normalised string. Samples with no answer do not vote. Ties go to the answer seen first.
    """
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, (key, ok) in enumerate(zip(keys, correct, strict=True)):
        if ok:
            key = "\0correct"
        elif key is None:
            continue
        votes[key] = votes.get(key, 0) + 1
        first.setdefault(key, i)
    if not votes:
        return False
    winner = min(votes, key=lambda k: (-votes[k], first[k]))
    return winner == "\0correct"


def pass_ks(n: int) -> list[int]:
    """The k values reported for n samples: powers of two up to n, and n itself."""
    ks = [1 << p for p in range(n.bit_length()) if (1 << p) <= n]
    return ks if n in ks else [*ks, n]
