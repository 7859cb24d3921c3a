"""The judged case set (`benchmarks/judged_cases.py`), the grader against it, and `benchmarks/regrade.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.judged_cases import all_cases

ROOT = Path(__file__).resolve().parents[1]
FP_PER_1000_TARGET = 0
FN_PER_1000_TARGET = 15


def test_no_case_is_judged_both_ways() -> None:
    verdicts: dict[tuple[str, str, str], bool] = {}
    for case in all_cases():
        key = (case.response, case.gold, case.problem)
        assert verdicts.setdefault(key, case.correct) == case.correct, key
    assert len(verdicts) > 1000


@pytest.mark.e2e
def test_the_grader_meets_its_targets_on_the_judged_cases() -> None:
    """Issue 44: no false positive, at most 15 false negatives per thousand."""
    from benchmarks.grader_cases import grade_cases

    cases = all_cases()
    results = grade_cases(cases, workers=2)
    wrong_passed = [c.response for c, r in zip(cases, results, strict=True) if r.correct and not c.correct]
    right_failed = [c.response for c, r in zip(cases, results, strict=True) if c.correct and not r.correct]
    assert wrong_passed == []
    assert 1000 * len(right_failed) / len(cases) <= FN_PER_1000_TARGET, right_failed


def test_regrade_refuses_a_folder_that_is_no_run_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.regrade", "--data-dir", str(tmp_path), str(tmp_path / "nothing")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"{tmp_path / 'nothing'}: not an eval run directory (no "
                                                "problems.jsonl or run_config.json)"]  # fmt: skip
