"""Answer extraction, math-verify grading of every suite's golds, K&K parsing, and bounded grading."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from rlbench.eval.grading import (
    GradeItem,
    GradeResult,
    GradingPool,
    extract_answer,
    format_kk_assignment,
    grade_item,
    last_boxed,
    parse_kk_assignment,
)

DATA = Path(__file__).parents[1].parent / "shared" / "data"
MATH_SUITES = ["aime24.jsonl", "amc23.jsonl", "math500.jsonl", "olympiadbench.jsonl"]
KK_SUITES = ["kk_logic.jsonl", "kk_logic_ood.jsonl"]
# Grading every gold of MATH-500 and OlympiadBench (twice) takes ~20 s on 2 cores; sample unless asked.
FULL = os.environ.get("RLBENCH_FULL_GOLD") == "1"
SAMPLE = 120


def _rows(name: str) -> list[dict]:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_extraction_fallbacks() -> None:
    assert last_boxed("a \\boxed{\\frac{1}{2}} then \\boxed{x^{2}+1}") == "x^{2}+1"
    assert last_boxed("\\boxed{1} and an unclosed \\boxed{2") == "1"
    assert extract_answer("so $\\fbox{12}$") == "12"
    assert extract_answer("The final answer is $\\frac{3}{4}$. I hope it is correct.") == "\\frac{3}{4}"
    assert extract_answer("blah\nAnswer: 42\n") == "42"
    assert extract_answer("we get 3 apples, then 1,250 pears") == "1250"
    assert extract_answer("no digits here") is None
    assert extract_answer("x" * 100_000 + "\\boxed{7}") == "7"  # long responses: only the tail is read


def test_grade_math_equivalences() -> None:
    def ok(response: str, gold: str) -> bool:
        return grade_item(GradeItem("math", response, gold)).correct

    assert ok("\\boxed{0.5}", "\\frac{1}{2}")
    assert ok("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")
    assert ok("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert ok("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}")
    assert ok("so N = \\boxed{N=n}", "N=n") and not ok("\\boxed{N=n+1}", "N=n")  # case-folded Eq(n, n) trap
    assert not ok("\\boxed{205}", "204")
    assert not ok("I don't know", "204")
    # untrusted text is parsed, never executed
    assert not ok("\\boxed{__import__('os').system('echo pwned')}", "0")


def _perturb(gold: str) -> str:
    # comma lists are sets to math-verify ("1,3, 1" == {1, 3}): add a new element rather than a duplicate
    return f"{gold}+1" if "," not in gold and "=" not in gold else f"{gold}, 9999"


@pytest.mark.parametrize("name", MATH_SUITES)
def test_math_golds_self_verify(name: str) -> None:
    rows = _rows(name)
    if not FULL and len(rows) > SAMPLE:
        rows = random.Random(0).sample(rows, SAMPLE)
    right = [GradeItem("math", f"Thus the answer is $\\boxed{{{r['answer']}}}$.", r["answer"]) for r in rows]
    wrong = [
        GradeItem("math", f"Thus the answer is $\\boxed{{{_perturb(r['answer'])}}}$.", r["answer"])
        for r in rows
    ]
    with GradingPool(workers=2, chunk_size=16, timeout=20) as pool:
        results = pool.grade(right + wrong)
    n = len(rows)
    not_self = [(rows[i]["id"], rows[i]["answer"]) for i in range(n) if not results[i].correct]
    perturbed_ok = [(rows[i]["id"], rows[i]["answer"]) for i in range(n) if results[n + i].correct]
    assert not_self == [], f"golds that do not verify against themselves: {not_self}"
    assert perturbed_ok == [], f"perturbed answers graded correct: {perturbed_ok}"
    assert pool.failures == 0


@pytest.mark.parametrize("name", KK_SUITES)
def test_kk_golds(name: str) -> None:
    for r in _rows(name):
        gold = {n: a == "knight" for n, a in r["assignment"].items()}
        assert parse_kk_assignment(r["answer"], r["names"]) == gold  # the gold text itself parses
        stated = f"Let me reason... Zoey might lie.\nCONCLUSION:\n{format_kk_assignment(gold)}"
        item = GradeItem("kk", stated, r["answer"], r["names"], r["solution"])
        assert grade_item(item).correct, r["id"]
        flipped = dict(gold)
        flipped[r["names"][-1]] = not flipped[r["names"][-1]]
        item.response = f"CONCLUSION:\n{format_kk_assignment(flipped)}"
        assert not grade_item(item).correct, r["id"]
        item.response = f"CONCLUSION: {r['names'][0]} is a knight."  # incomplete: not every person named
        assert len(r["names"]) == 1 or grade_item(item).extracted is None


def test_kk_parser_formats() -> None:
    names = ["Zoey", "Oliver"]
    assert parse_kk_assignment("<answer>(1) Zoey is a knave\n(2) Oliver is a knight</answer>", names) == {
        "Zoey": False,
        "Oliver": True,
    }
    # reasoning before the conclusion mentions the wrong roles; the conclusion wins
    text = (
        "Assume Zoey is a knight... Oliver is a knave? No.\nCONCLUSION: Zoey is a knave, Oliver is a knight."
    )
    assert parse_kk_assignment(text, names) == {"Zoey": False, "Oliver": True}
    assert parse_kk_assignment("Zoey: knave. Oliver: **knight**", names) == {"Zoey": False, "Oliver": True}
    assert parse_kk_assignment("Zoey is a knave", names) is None


def hanging_grader(item: GradeItem) -> GradeResult:
    """Module level so the pool can pickle it; sleeps 'forever' on responses that ask for it."""
    if "HANG" in item.response:
        time.sleep(600)
    if "CRASH" in item.response:
        os._exit(3)
    if "RAISE" in item.response:
        raise RuntimeError("grader bug")
    return GradeResult(extracted=item.response, correct=item.response == item.gold)


def test_hanging_and_crashing_graders_are_bounded() -> None:
    items = [GradeItem("math", r, "ok") for r in ["ok", "HANG", "ok", "no", "CRASH", "ok", "RAISE", "ok"]]
    t0 = time.monotonic()
    with GradingPool(grade_fn=hanging_grader, workers=2, timeout=1.0, chunk_size=3) as pool:
        results = pool.grade(items)
        # the pool was replaced and still works afterwards
        assert [r.correct for r in pool.grade([GradeItem("math", "ok", "ok")] * 3)] == [True] * 3
    elapsed = time.monotonic() - t0
    assert [r.correct for r in results] == [True, False, True, False, False, True, False, True]
    assert "timed out" in (results[1].error or "")
    assert "crashed" in (results[4].error or "")
    assert "grader bug" in (results[6].error or "")
    assert results[3].error is None  # an ordinary wrong answer is not a failure
    assert pool.failures == 3
    assert elapsed < 15, elapsed  # bounded: chunk limit + one solo retry per item of the bad chunks
