"""Accuracy estimators over K samples per problem: avg@k, unbiased pass@k, maj@k."""

from __future__ import annotations

from collections import Counter
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


def majority_vote(classes: Sequence[int | None]) -> int | None:
    """maj@k for one problem: the index of the sample whose answer wins the vote (None: no sample answered).

    `classes[i]` is sample i's answer class: equivalent answers share one, right or wrong alike (see
    `reference_trainer.tasks.grading.answer_classes`); None is no answer, which does not vote. The largest
    class wins; a tie goes to the class that appeared first. The winner is represented by its first sample:
    the vote is correct when that sample is. This is Qwen2.5-Math's `group_pred(use_symbol=True)`
    (rm_maj_eval.py), except that it counts an empty answer as a vote; lighteval's `max(answers,
    key=answers.count)` breaks ties by first occurrence too.
    """
    votes = Counter(c for c in classes if c is not None)
    if not votes:
        return None
    # max keeps the first of equal counts, and a Counter holds its classes in the order they first appeared
    return list(classes).index(max(votes, key=votes.__getitem__))


def majority_correct(classes: Sequence[int | None], correct: Sequence[bool]) -> bool:
    """Is the majority answer (see `majority_vote`) correct?"""
    if len(classes) != len(correct):
        raise ValueError(f"{len(classes)} answer classes for {len(correct)} grades")
    winner = majority_vote(classes)
    return winner is not None and bool(correct[winner])


def pass_ks(n: int) -> list[int]:
    """The k values reported for n samples: powers of two up to n, and n itself."""
    ks = [1 << p for p in range(n.bit_length()) if (1 << p) <= n]
    return ks if n in ks else [*ks, n]
