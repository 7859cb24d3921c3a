"""Every eval's second opinion: each sample graded by rlbench's grader and by plain math-verify (K&K: the
strict reader), the score under each with both versions, and the disagreements by answer type with
examples, in results.json and on the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_eval_runner import GOLDS, _cfg, _write_suite, eval_plan

from reference_trainer.tasks.grading import GradeItem
from reference_trainer.tasks.second_opinion import RULES_VERSION, answer_type, grade_both, grader_versions
from rlbench.eval.disagreements import compare_graders
from rlbench.eval.pool import GradingPool
from rlbench.eval.runner import run_eval
from rlbench.report.eval_report import write_eval_report


def test_each_sample_is_graded_by_both() -> None:
    # math-verify takes the box before any later phrase; rlbench reads the correction after it
    item = GradeItem(
        "math", r"We get $\boxed{204}$. I must add 24 more: the answer is $228$.", "228", id="x#0"
    )
    result = grade_both(item)
    assert (result.correct, result.second_correct) == (True, False)
    assert grade_both(GradeItem("math", r"\boxed{5}", "5")).second_correct is True
    conclusion = "Zoey: knight, Oliver is a knave."  # the strict reader reads "Name is a knight|knave" only
    kk = grade_both(GradeItem("kk", conclusion, "", ["Zoey", "Oliver"], [True, False]))
    assert (kk.correct, kk.second_correct) == (True, False)
    assert grade_both(GradeItem("math", r"\boxed{5}", "5", second=False)).second_correct is None


def test_the_versions_are_pinned() -> None:
    versions = grader_versions()
    assert versions["rlbench"] == RULES_VERSION
    assert re.fullmatch(r"\d+\.\d+(?:\.\d+)?", versions["math-verify"])


@pytest.mark.parametrize(
    ("gold", "kind"),
    [("204", "integer"), ("1{,}000", "integer"), ("0.25", "decimal"), ("\\frac{1}{2}", "fraction"),
     ("2\\sqrt{3}", "radical or constant"), ("(1, 2)", "tuple or list"), ("[2, \\infty)", "interval"),
     ("y = 2x", "equation"), ("\\text{east}", "text"), ("x^2 + 1", "expression")],
)  # fmt: skip
def test_answer_types(gold: str, kind: str) -> None:
    assert answer_type(gold, "math") == kind


def test_disagreements_by_answer_type() -> None:
    rows = [
        {"id": "a", "gold": "7", "avg": 1.0, "correct": [True, True], "second_correct": [False, True],
         "extracted": ["7", "7"], "second_extracted": ["3, 7", "7"]},
        {"id": "b", "gold": "(1, 2)", "avg": 0.0, "correct": [False, False], "second_correct": [True, False],
         "extracted": [None, "(1, 3)"], "second_extracted": ["(1, 2)", "(1, 3)"]},
    ]  # fmt: skip
    found = compare_graders(rows, "math")
    assert found is not None
    assert found["graders"]["rlbench"]["accuracy"] == 0.5
    assert found["graders"]["math-verify"]["accuracy"] == 0.5
    d = found["disagreements"]
    assert (d["samples"], d["rlbench_only"], d["second_only"]) == (4, 1, 1)
    assert d["by_type"]["integer"]["examples"][0]["id"] == "a#0"
    assert d["by_type"]["tuple or list"]["examples"][0]["second"] == {"answer": "(1, 2)", "correct": True}
    assert compare_graders(rows, "python:mine:grade") is None  # a suite's own grader has no second
    assert compare_graders([{**r, "second_correct": None} for r in rows], "math") is None  # an older run


class TwoReadingsBackend:
    """Sample 0 corrects its box in a later phrase (rlbench reads the correction, math-verify the box);
    sample 1 is one plain box."""

    name, model, tokenizer = "fake", "fake-model", None

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        out = []
        for idx, prompt in enumerate(prompts):
            gold = GOLDS[re.search(r"Problem (fx-\d+)", prompt).group(1)]
            first = f"We get $\\boxed{{999}}$. I must add more: the answer is ${gold}$."
            out.append(first if idx % 2 == 0 else f"The answer is $\\boxed{{{gold}}}$.")
        return out

    def close(self) -> None:
        pass


def test_results_and_page_report_both_graders(tmp_path: Path) -> None:
    data = _write_suite(tmp_path / "data")
    with GradingPool(workers=1) as pool:
        res = run_eval(
            eval_plan(_cfg(), data), TwoReadingsBackend, tmp_path / "out", pool=pool, progress=False
        )
    assert res["accuracy"] == 1.0
    assert res["graders"]["math-verify"]["accuracy"] == 0.5
    assert res["graders"]["math-verify"]["version"] == grader_versions()["math-verify"]
    d = res["disagreements"]
    assert (d["samples"], d["rlbench_only"], d["second_only"]) == (10, 5, 0)
    page = write_eval_report(tmp_path / "report.html", res).read_text(encoding="utf-8")
    assert "Second grader" in page and "right for math-verify only" in page and RULES_VERSION in page
