"""Generated grading cases (`benchmarks/generated_cases.py`, seed 0): every gold of every suite in many
equivalent surface forms must grade right, and wrong answers made from right ones by one small change must
grade wrong. Targets: no false positive, at most 1% false negatives, over at least 10,000 cases when the
suites' data is present (the built-in golds alone otherwise)."""

from __future__ import annotations

import pytest

from benchmarks import generated_cases

MIN_CASES_WITH_DATA = 10_000
FN_SHARE_TARGET = 0.01


def test_the_generator_is_deterministic_and_makes_both_verdicts() -> None:
    first = generated_cases.all_cases(seed=0)
    assert first == generated_cases.all_cases(seed=0)
    kinds = {(c.grader, c.correct) for c in first}
    assert {("math", True), ("math", False)} <= kinds
    assert generated_cases.words(204) == "two hundred four" and generated_cases.words(55) == "fifty-five"
    if (generated_cases.DATA / "kk_logic.jsonl").is_file():
        assert len(first) >= MIN_CASES_WITH_DATA and {("kk", True), ("kk", False)} <= kinds


@pytest.mark.e2e
def test_generated_cases_meet_the_targets() -> None:
    cases = generated_cases.all_cases(seed=0)
    verdicts = generated_cases.grade(cases, workers=2)
    false_positives = [
        (c.kind, c.gold, c.response) for c, v in zip(cases, verdicts, strict=True) if v and not c.correct
    ]
    false_negatives = [
        (c.kind, c.gold, c.response) for c, v in zip(cases, verdicts, strict=True) if c.correct and not v
    ]
    assert false_positives == []
    assert len(false_negatives) <= FN_SHARE_TARGET * sum(c.correct for c in cases), false_negatives[:20]
