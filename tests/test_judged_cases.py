"""The judged case sets (`benchmarks/judged_cases.py`, and `benchmarks/fresh_cases.py` from other graders'
tests and real model outputs), the grader against them, and `benchmarks/regrade.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import fresh_cases
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


def test_every_fresh_case_names_its_source_and_no_case_is_judged_both_ways() -> None:
    cases = fresh_cases.all_cases(say=lambda _line: None)
    verdicts: dict[tuple[str, str, str], bool] = {}
    for case in cases:
        assert case.source and case.ref and case.kind, case
        assert case.grader != "kk" or (case.names and case.solution is not None), case
        key = (case.response, case.gold, case.problem)
        assert verdicts.setdefault(key, case.correct) == case.correct, key
    assert sum(c.correct for c in cases) > 200


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["old", "fresh", "rules"])
def test_the_grader_meets_its_targets_on_the_judged_cases(name: str) -> None:
    """Issues 44 and 56: no false positive, at most 15 false negatives per thousand right answers."""
    from benchmarks.grader_cases import SETS, grade_cases

    load, _ = SETS[name]
    cases = load()
    results = grade_cases(cases, workers=2)
    wrong_passed = [c.response for c, r in zip(cases, results, strict=True) if r.correct and not c.correct]
    right_failed = [c.response for c, r in zip(cases, results, strict=True) if c.correct and not r.correct]
    assert wrong_passed == []
    right = sum(c.correct for c in cases)
    assert 1000 * len(right_failed) / right <= FN_PER_1000_TARGET, right_failed


def test_regrade_refuses_a_folder_that_is_no_run_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.regrade", "--data-dir", str(tmp_path), str(tmp_path / "nothing")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"{tmp_path / 'nothing'}: not an eval run directory (no "
                                                "problems.jsonl or run_config.json)"]  # fmt: skip
