"""Answer extraction (math-verify's, in priority order), grading, answer classes, K&K parsing, and the
bounded grading pool with its one-line failure logs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import grade_as_pool

from reference_trainer.tasks import grading
from reference_trainer.tasks.grading import (
    GradeItem,
    GradeResult,
    VoteItem,
    answer_classes,
    format_kk_assignment,
    grade_item,
    parse_free_form_assignment,
)
from rlbench.eval.estimators import majority_correct
from rlbench.eval.pool import GradingPool

DATA = Path(os.environ.get("RLBENCH_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
KK_SUITES = ["kk_logic.jsonl", "kk_logic_ood.jsonl"]


def _rows(name: str) -> list[dict]:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _grade(response: str, gold: str) -> GradeResult:
    return grade_as_pool(response, gold)


def test_unboxed_answers_are_read_whole() -> None:
    """Issue #18: unboxed answers were cut at the first "." (now: a statement's maths up to its prose)."""
    assert _grade("Final answer: 4.9", "4").extracted == "4.9"
    assert not _grade("Final answer: 4.9", "4").correct
    qwen = "The final answer is $2.5$. I hope it is correct."
    assert not _grade(qwen, "2").correct and _grade(qwen, "2.5").correct
    assert _grade("The final answer is 2.5. I hope it is correct.", "2.5").extracted == "2.5"
    # the golds that used to miss: 62.5% -> 62, 1.25 -> 1, 18.90 -> 18
    assert _grade("Final answer: 62.5%", "62.5%").correct and not _grade("Final answer: 62", "62.5%").correct
    assert _grade("Final answer: 1.25", "1.25").correct and not _grade("Final answer: 1", "1.25").correct
    assert _grade("Final answer: \\$18.90", "\\$18.90").correct
    assert not _grade("Final answer: 18", "\\$18.90").correct


def test_a_value_from_another_match_is_not_the_answer() -> None:
    """A real SmolLM2 response: math-verify matched the last formula (which does not parse) and took its
    value, 2, from "a power of 2" earlier on; graded against gold 2 that was a false positive."""
    response = (
        "This means that all integers $x_{1}, x_{2}, \\ldots, x_{k+1}$ are zeros of the polynomial "
        "$P(x_{1})+P(x_{2})+..+P(x_{k+1})$, but this only happens when $P(n+1)=n$, which is impossible for "
        "$n$ to be a power of 2.\n\nTherefore, there are only finitely many integers $x_{1}, x_{2}, \\ldots, "
        "x_{k+1}$ that satisfy this equation."
    )
    graded = _grade(response, "2")
    assert graded.extracted == "x_{1}, x_{2},  , x_{k+1}" and not graded.correct
    assert _grade("so $n$ is a power of 2.", "2").correct  # a value of the matched text itself still counts
    assert _grade("The answer is $\\frac{1}{2}$.", "0.5").correct


def test_extraction_priority() -> None:
    # the last answer statement wins: a later box, or a later "final answer" phrase that corrects a box
    first_try = "First I got \\boxed{\\frac{1}{2}} but that misses the second case entirely. Redone: "
    assert _grade(first_try + "\\boxed{x^{2}+1}", "x^2+1").extracted == "x^{2}+1"
    assert _grade("\\boxed{1}, \\boxed{3}", "1, 3").correct  # boxes side by side: one answer (a list)
    assert _grade("We get \\boxed{3}. The final answer is 4.", "4").correct
    assert _grade("**Final Answer**\n\\[\n\\boxed{5}\n\\]", "5").correct  # Qwen's markdown heading
    assert _grade("**Final Answer:** 7", "7").correct
    assert _grade("so $\\fbox{12}$", "12").correct
    assert _grade("blah\nAnswer: 42\n", "42").correct
    assert _grade("we get 3 apples, then 1,250 pears.", "1250").correct  # no statement: the last clause
    assert _grade("we get 3 apples, then 1,250 pears", "1250").extracted is None  # ... unless cut off
    assert _grade("So the final answer is 5 apples.", "5").correct
    assert _grade("no digits here", "1").extracted is None
    assert _grade("x" * 100_000 + "\\boxed{7}", "7").correct  # long responses: only the tail is read


def test_grade_math_equivalences() -> None:
    def ok(response: str, gold: str) -> bool:
        return _grade(response, gold).correct

    assert ok("\\boxed{0.5}", "\\frac{1}{2}")
    assert ok("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")
    assert ok("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert ok("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}")
    # math-verify folds case: gold "N=n" would parse as Eq(n, n) and match N=n+1 too; its right side counts
    assert ok("so N = \\boxed{N=n}", "N=n") and ok("\\boxed{n}", "N=n") and not ok("\\boxed{N=n+1}", "N=n")
    assert ok("\\boxed{62.5}", "62.5\\%") and ok("\\boxed{0.625}", "62.5\\%")  # a percentage, or its number
    prose = "f(x)=a x+b, where b is an arbitrary integer, and a is a positive integer with \\mho(a)=0"
    assert ok("\\boxed{f(x)=ax+b}", prose) and not ok("\\boxed{0}", prose)  # not the parse of "\mho(a)=0"
    assert not ok("\\boxed{205}", "204")
    assert not ok("I don't know", "204")
    # untrusted text is parsed, never executed
    assert not ok("\\boxed{__import__('os').system('echo pwned')}", "0")


def _votes(answers: list[str]) -> list[int | None]:
    responses = [f"\\boxed{{{a}}}" for a in answers]
    keys = [grade_item(GradeItem("math", r, "0")).key for r in responses]
    return answer_classes(VoteItem("math", keys, responses))


def test_majority_vote_groups_wrong_answers_by_equivalence_too() -> None:
    """Issue #18: correct answers were merged by equivalence and wrong ones only by text."""
    answers = ["7", "0.5", "1/2", "\\frac{1}{2}"]
    classes = _votes(answers)
    assert classes == [0, 1, 1, 1]
    correct = [_grade(f"\\boxed{{{a}}}", "7").correct for a in answers]
    assert correct == [True, False, False, False]
    assert majority_correct(classes, correct) is False  # three votes for 1/2 beat one for 7
    assert _votes(["0.5", "3", "1/2", "3.0"]) == [0, 1, 0, 1]  # a tie; the first class (0.5) wins
    assert majority_correct([0, 1, 0, 1], [True, False, True, False]) is True
    assert majority_correct([0, 1, 0, 1], [False, True, False, True]) is False
    kk = answer_classes(VoteItem("kk", ["(1) A is a knight", None, "(1) A is a knight"], ["", "", ""]))
    assert kk == [0, None, 0]


@pytest.mark.parametrize("name", KK_SUITES)
def test_kk_golds(name: str) -> None:
    for r in _rows(name):
        gold = {n: a == "knight" for n, a in r["assignment"].items()}
        assert parse_free_form_assignment(r["answer"], r["names"]) == gold  # the gold text itself parses
        stated = f"Let me reason... Zoey might lie.\nCONCLUSION:\n{format_kk_assignment(gold)}"
        item = GradeItem("kk", stated, r["answer"], r["names"], r["solution"])
        assert grade_item(item).correct, r["id"]
        flipped = dict(gold)
        flipped[r["names"][-1]] = not flipped[r["names"][-1]]
        item.response = f"CONCLUSION:\n{format_kk_assignment(flipped)}"
        assert not grade_item(item).correct, r["id"]
        item.response = f"CONCLUSION: {r['names'][0]} is a knight."  # incomplete: not every person named
        assert len(r["names"]) == 1 or grade_item(item).extracted is None
        # the benchmark's own demonstration: trial roles ("Assume X is a knave"), then the conclusion
        steps = " ".join([r["cot_head"], *r["cot_repeat_steps"], r["cot_foot"]])
        item.response = f"{steps}\nCONCLUSION:\n{r['answer']}"
        assert grade_item(item).correct, r["id"]


def test_kk_parser_formats() -> None:
    names = ["Zoey", "Oliver"]
    block = "<answer>(1) Zoey is a knave\n(2) Oliver is a knight</answer>"
    assert parse_free_form_assignment(block, names) == {"Zoey": False, "Oliver": True}
    # reasoning before the conclusion mentions the wrong roles; the conclusion wins
    text = (
        "Assume Zoey is a knight... Oliver is a knave? No.\nCONCLUSION: Zoey is a knave, Oliver is a knight."
    )
    assert parse_free_form_assignment(text, names) == {"Zoey": False, "Oliver": True}
    colons = "Zoey: knave. Oliver: **knight**"
    assert parse_free_form_assignment(colons, names) == {"Zoey": False, "Oliver": True}
    assert parse_free_form_assignment("Zoey is a knave", names) is None


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
    with GradingPool(grade_fn=hanging_grader, workers=2, timeout=1.0, chunk_size=3) as pool:
        results = pool.grade(items)
        # the pool was replaced and still works afterwards
        assert [r.correct for r in pool.grade([GradeItem("math", "ok", "ok")] * 3)] == [True] * 3
    assert [r.correct for r in results] == [True, False, True, False, False, True, False, True]
    assert "timed out" in (results[1].error or "")
    assert "crashed" in (results[4].error or "")
    assert "grader bug" in (results[6].error or "")
    assert results[3].error is None  # an ordinary wrong answer is not a failure
    assert pool.failures == 3
    # bounded: the hanging item was cut off at the limit, graded once more alone with the longer one and
    # then given up (a 600 s sleep let run would have ended with no error). Others may be retried too where a
    # loaded machine is slow to start the workers; their verdicts stand.
    assert results[1].retried and pool.retries >= 1


@pytest.mark.e2e
def test_a_math_verify_timeout_is_one_quiet_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """math-verify logs a timeout with the whole unparsed answer; the run logs one line naming the item."""
    answer = "\\frac{" * 700  # ~4 KB

    def timing_out_parse(response: str, timeout_s: int, problem: str = "") -> list:
        logging.getLogger("math_verify.parser").warning(f"Timeout during parsing: {response}")
        return []

    monkeypatch.setattr(grading, "parse_answer", timing_out_parse)  # inherited by the forked workers
    caplog.set_level(logging.WARNING, logger="rlbench.eval")
    with GradingPool(workers=1) as pool:
        results = pool.grade([GradeItem("math", answer, "1", id="olympiadbench-1606#3")])
    assert results[0].error == "math-verify timed out" and not results[0].correct and results[0].retried
    lines = [r.getMessage() for r in caplog.records if r.name == "rlbench.eval"]
    assert lines == ["olympiadbench-1606#3: math-verify timed out (also on the retry); counted wrong"]
    # math-verify's own warning reaches no stderr (pytest hooks every logger, so look from a fresh process)
    code = (
        "import logging, reference_trainer.tasks.grading as g; "
        f"logging.getLogger('math_verify.parser').warning('Timeout during parsing: ' + {answer!r}); "
        "print(g._timeouts.count)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "1" and proc.stderr == "", proc.stderr[-500:]


def test_answer_classes_fall_back_to_exact_text(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Comparing a problem's answers that hangs ends at the pool's limit: that problem votes by exact text."""

    def hanging_parse(response: str, timeout_s: int, problem: str = "") -> list:
        time.sleep(600)
        return []

    monkeypatch.setattr(grading, "parse_answer", hanging_parse)  # inherited by the forked workers
    caplog.set_level(logging.WARNING, logger="rlbench.eval")
    votes = [VoteItem("math", ["0.5", "\\frac{1}{2}", "0.5"], ["", "", ""], id="math500-algebra/1")]
    with GradingPool(workers=1, timeout=0.5, retry_timeout=1.0) as pool:
        assert pool.classes(votes) == [[0, 1, 0]]
        assert pool.retries == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "rlbench.eval"]
    assert lines == ["math500-algebra/1: grading timed out after 1s; majority vote by exact answer text"]


def slow_grader(item: GradeItem) -> GradeResult:
    """Module level so the pool can pickle it: a grade that takes 0.3 s however it is asked."""
    time.sleep(0.3)
    return GradeResult(extracted=item.response, correct=item.response == item.gold)


def test_a_timeout_is_retried_once_with_a_longer_limit() -> None:
    """Issue 39 item 10: the verdict must not depend on load. A first limit (0.1 s) shorter than the
    grading (0.3 s) stands in for a busy CPU: every item times out, is graded again with the retry's
    limit, and gets the verdict an unhurried pool gives, with the retry recorded."""
    items = [GradeItem("math", r, "ok", id=f"p#{i}") for i, r in enumerate(["ok", "no", "ok"])]
    with GradingPool(grade_fn=slow_grader, workers=2, timeout=0.1, retry_timeout=10) as hurried:
        first = hurried.grade(items)
    with GradingPool(grade_fn=slow_grader, workers=2, timeout=10) as unhurried:
        second = unhurried.grade(items)
    assert [r.correct for r in first] == [r.correct for r in second] == [True, False, True]
    assert [r.retried for r in first] == [True] * 3 and hurried.retries == 3 and hurried.failures == 0
    assert [r.retried for r in second] == [False] * 3 and unhurried.retries == 0
    assert all(r.error is None for r in first + second)


def test_a_math_verify_timeout_is_retried_with_its_longer_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's own limit (whole seconds, a signal) is the other timeout: the retry raises it to
    RETRY_VERIFY_TIMEOUT_S and its verdict is the item's."""
    real_parse = grading.parse_answer

    def parse_slowly(response: str, timeout_s: int, problem: str = "") -> list:
        if timeout_s < grading.RETRY_VERIFY_TIMEOUT_S:  # the first attempt: "too slow for 1 s"
            logging.getLogger("math_verify.parser").warning("Timeout during parsing: ...")
            return []
        return real_parse(response, timeout_s, problem)

    monkeypatch.setattr(grading, "parse_answer", parse_slowly)  # inherited by the forked workers
    with GradingPool(workers=1) as pool:
        results = pool.grade([GradeItem("math", "\\boxed{204}", "204", id="aime24-I-01#0")])
    assert results[0].correct and results[0].retried and results[0].error is None and pool.retries == 1
