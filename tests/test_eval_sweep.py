"""The gold sweep: every problem of every suite, its gold stated three ways, must grade correct, and a
wrong answer stated the same ways must not. Runs on the offline suite copies: $RLBENCH_DATA_DIR, else the
shared data folder that CI places beside the clone; skipped when neither holds the suite."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from reference_trainer.tasks.grading import GradeItem, prose_start
from rlbench.eval.pool import GradingPool
from rlbench.eval.suites import get_suite

DATA = Path(os.environ.get("RLBENCH_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
SUITES = ["aime24", "amc23", "math500", "olympiadbench", "kk", "kk-ood"]
FORMS: dict[str, Callable[[str], str]] = {
    "boxed": lambda g: f"Thus the answer is $\\boxed{{{g}}}$.",
    "final answer": lambda g: f"Final answer: {g}",
    "qwen": lambda g: f"The final answer is ${g}$. I hope it is correct.",
}


def _wrong(row: dict) -> str:
    """A wrong answer in the gold's own format."""
    if "names" in row:  # K&K: the last person's role flipped
        lines = row["answer"].splitlines()
        last = lines[-1]
        lines[-1] = last.replace("knight", "knave") if "knight" in last else last.replace("knave", "knight")
        return "\n".join(lines)
    gold = row["answer"]
    # comma lists are sets to math-verify ("1,3, 1" == {1, 3}): add a new element rather than a duplicate
    return f"{gold}+1" if "," not in gold and "=" not in gold else f"{gold}, 9999"


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2, chunk_size=32, timeout=30) as p:
        yield p


@pytest.mark.parametrize("name", SUITES)
def test_every_gold_grades_correct_in_every_form(name: str, pool: GradingPool) -> None:
    suite = get_suite(name)
    path = DATA / suite.data_file
    if not path.is_file():
        pytest.skip(f"no data dir with {suite.data_file} (set RLBENCH_DATA_DIR)")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def item(row: dict, response: str) -> GradeItem:
        names, solution = row.get("names"), row.get("solution")
        return GradeItem(suite.grader, response, row["answer"], names, solution, id=row["id"])

    # A gold with prose after its formula is graded by the formula: appending to its prose changes nothing.
    negative = [suite.grader == "kk" or prose_start(r["answer"]) is None for r in rows]
    # One row's items side by side: they land in one worker's chunk, which parses the gold once.
    items = [item(r, form(r["answer"])) for r in rows for form in FORMS.values()]
    # Wrong answers: boxed (the gold's parse is no catch-all) and bare (the "final answer" rewrite is not);
    # Qwen's sentence takes the boxed form's $...$ path.
    wrong_forms = ("boxed", "final answer")
    items += [
        item(r, FORMS[f](_wrong(r)))
        for r, neg in zip(rows, negative, strict=True)
        if neg
        for f in wrong_forms
    ]
    results = iter(pool.grade(items))
    ok = {(r["id"], f): next(results).correct for r in rows for f in FORMS}
    hit = {
        (r["id"], f): next(results).correct
        for r, neg in zip(rows, negative, strict=True)
        if neg
        for f in wrong_forms
    }
    misses = {form: [pid for (pid, f), c in ok.items() if f == form and not c] for form in FORMS}
    false_hits = {form: [pid for (pid, f), c in hit.items() if f == form and c] for form in wrong_forms}
    assert misses == {form: [] for form in FORMS}, f"golds graded wrong: {misses}"
    assert false_hits == {form: [] for form in wrong_forms}, f"wrong answers graded correct: {false_hits}"
    assert pool.failures == 0
