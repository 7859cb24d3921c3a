"""The eval pipeline with a fake backend: results, resume after a crash, config checks, CLI and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cli

from reference_trainer.errors import UserError
from reference_trainer.tasks.grading import GradeItem, GradeResult, grade_item
from rlbench.eval.pool import GradingPool
from rlbench.eval.runner import EvalConfig, EvalPlan, plan_eval, run_eval
from rlbench.eval.suites import get_suite

REPO = Path(__file__).parents[1]
GOLDS = {"fx-01": "204", "fx-02": "\\frac{1}{2}", "fx-03": "25", "fx-04": "(1,2)", "fx-05": "7"}


def _write_suite(data_dir: Path) -> Path:
    """A 5-problem fixture under aime24's file name, so the real manifest loads it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": pid, "problem": f"Problem {pid}: compute it.", "answer": a, "source": "test"}
        for pid, a in GOLDS.items()
    ]
    (data_dir / "aime24.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


class FakeBackend:
    """Answers from the prompt's problem id: sample j of problem i is right unless (i + j) % 3 == 0."""

    name = "fake"
    model = "fake-model"
    tokenizer = None

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.generated_ids: list[str] = []
        self.calls = 0

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("simulated crash")
        out = []
        for idx, prompt in enumerate(prompts):
            pid = re.search(r"Problem (fx-\d+)", prompt).group(1)
            self.generated_ids.append(pid)
            i, j = int(pid[-2:]), idx % 2  # K=2 samples of a problem arrive consecutively
            ans = GOLDS[pid] if (i + j) % 3 else "999"
            out.append(f"Some reasoning about {pid}. The answer is $\\boxed{{{ans}}}$.")
        return out

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2) as p:
        yield p


def eval_plan(cfg: EvalConfig, data: Path | None = None) -> EvalPlan:
    """The plan `rlbench eval` makes of `cfg`: its suite read once, its problems from the data dir `data`."""
    return plan_eval(get_suite(cfg.suite), cfg, data)


def _cfg(**kw) -> EvalConfig:
    return EvalConfig(
        suite="aime24", model="fake-model", engine="reference", samples=2, temperature=0.7, **kw
    )


def test_pipeline_results(tmp_path: Path, pool: GradingPool) -> None:
    data = _write_suite(tmp_path / "data")
    backend = FakeBackend()
    res = run_eval(eval_plan(_cfg(), data), lambda: backend, tmp_path / "out", pool=pool, progress=False)
    # expected correctness per problem i (samples j=0,1): right unless (i+j) % 3 == 0
    expect = {pid: [(int(pid[-2:]) + j) % 3 != 0 for j in range(2)] for pid in GOLDS}
    rows = {r["id"]: r for r in res["problems"]}
    assert {pid: rows[pid]["correct"] for pid in GOLDS} == expect
    n_correct = sum(sum(v) for v in expect.values())
    assert res["accuracy"] == pytest.approx(n_correct / 10)
    assert res["pass_at_k"]["2"] == pytest.approx(1.0)  # every problem has at least one right sample
    assert set(res["pass_at_k"]) == {"1", "2"} and res["pass_at_k"]["1"] == pytest.approx(res["accuracy"])
    assert rows["fx-02"]["extracted"][0] == "\\frac{1}{2}"
    assert res["template"] == "math" and res["samples"] == 2 and res["grading_failures"] == 0
    assert sorted(backend.generated_ids) == sorted([p for p in GOLDS for _ in range(2)])


def slow_grade_item(item: GradeItem) -> GradeResult:
    """Module level so the pool can pickle it: the real grade, 0.2 s late."""
    time.sleep(0.2)
    return grade_item(item)


def test_grading_timeouts_are_retried_and_counted(tmp_path: Path) -> None:
    """A first limit shorter than grading (a busy CPU) gives the same verdicts as test_pipeline_results,
    and results.json counts the items graded again."""
    data = _write_suite(tmp_path / "data")
    with GradingPool(grade_fn=slow_grade_item, workers=2, timeout=0.05, retry_timeout=30) as hurried:
        res = run_eval(eval_plan(_cfg(), data), FakeBackend, tmp_path / "out", pool=hurried, progress=False)
    expect = {pid: [(int(pid[-2:]) + j) % 3 != 0 for j in range(2)] for pid in GOLDS}
    assert {r["id"]: r["correct"] for r in res["problems"]} == expect
    assert res["grading_retries"] == 10 and res["grading_failures"] == 0
    assert [r["grading_retries"] for r in res["problems"]] == [2] * 5


def test_resume_after_interrupt(tmp_path: Path, pool: GradingPool) -> None:
    data = _write_suite(tmp_path / "data")
    out = tmp_path / "out"
    crashing = FakeBackend(fail_after=2)  # chunks of 1 problem (chunk_seqs=2, K=2): 2 finish, then a crash
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_eval(eval_plan(_cfg(), data), lambda: crashing, out, pool=pool, chunk_seqs=2, progress=False)
    saved = [json.loads(line) for line in (out / "problems.jsonl").read_text().splitlines()]
    assert [r["id"] for r in saved] == ["fx-01", "fx-02"]
    assert not (out / "results.json").exists()

    resumed = FakeBackend()
    res = run_eval(eval_plan(_cfg(), data), lambda: resumed, out, pool=pool, chunk_seqs=2, progress=False)
    assert sorted(set(resumed.generated_ids)) == ["fx-03", "fx-04", "fx-05"]  # only the missing ones
    assert [r["id"] for r in res["problems"]] == list(GOLDS)

    # everything done: a third run generates nothing and builds no backend
    res2 = run_eval(
        eval_plan(_cfg(), data),
        lambda: pytest.fail("backend must not be built"),
        out,
        pool=pool,
        progress=False,
    )
    assert res2["accuracy"] == res["accuracy"]

    with pytest.raises(UserError, match=r"other settings \(samples: 2 -> 3"):
        run_eval(
            eval_plan(EvalConfig(suite="aime24", model="fake-model", samples=3, temperature=0.7), data),
            FakeBackend,
            out,
            pool=pool,
            progress=False,
        )
    fresh = FakeBackend()
    res3 = run_eval(
        eval_plan(EvalConfig(suite="aime24", model="fake-model", samples=1, temperature=0.7), data),
        lambda: fresh,
        out,
        pool=pool,
        overwrite=True,
        progress=False,
    )
    assert res3["samples"] == 1 and len(fresh.generated_ids) == 5


def test_cli_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from rlbench.cli import app_
    from rlbench.eval import backends

    data = _write_suite(tmp_path / "data")
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setattr(backends, "make_backend", lambda *a, **kw: FakeBackend())
    out = tmp_path / "out"
    args = [
        "eval",
        "--suite",
        "aime24",
        "--model",
        str(model),
        "--samples",
        "2",
        "--out",
        str(out),
        "--data-dir",
        str(data),
        "--temperature",
        "0.7",
        "--limit",
        "4",
    ]
    result = CliRunner().invoke(app_, args)
    assert result.exit_code == 0, result.output
    assert "aime24: 4 problems" in result.output
    res = json.loads((out / "results.json").read_text())
    assert res["problems_evaluated"] == 4 and res["model"] == str(model.resolve())
    assert set(res) >= {
        "suite",
        "model",
        "engine",
        "samples",
        "template",
        "accuracy",
        "pass_at_k",
        "maj_at_k",
    }
    page = (out / "report.html").read_text()
    assert (
        "Per-problem results" in page and "Response length" in page and "pass@k" in page and "fx-04" in page
    )


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli(*args, env=env)


def _assert_one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_bad_input_errors(tmp_path: Path) -> None:
    data = _write_suite(tmp_path / "data")
    model = tmp_path / "model"
    model.mkdir()
    base = ["eval", "--model", str(model), "--out", str(tmp_path / "o")]
    _assert_one_line_error(
        _cli(*base, "--suite", "nope", "--data-dir", str(data)),
        r"unknown suite 'nope'; valid suites: .*aime24.*kk-ood.*math500",
    )
    _assert_one_line_error(
        _cli(*base, "--suite", "aime24", "--data-dir", str(tmp_path / "missing")),
        r"data dir not found: .*missing",
    )
    _assert_one_line_error(
        _cli(*base, "--suite", "math500", "--data-dir", str(data)), r"needs math500\.jsonl in the data dir"
    )
    _assert_one_line_error(
        _cli(
            "eval",
            "--suite",
            "aime24",
            "--model",
            str(tmp_path / "nomodel"),
            "--out",
            str(tmp_path / "o"),
            "--data-dir",
            str(data),
        ),
        r"model directory not found",
    )
    with open(data / "aime24.jsonl", "a") as fh:
        fh.write('{"id": "x", "problem": "p", "answer": \n{"id": "y"}\n')
    _assert_one_line_error(
        _cli(*base, "--suite", "aime24", "--data-dir", str(data)), r"aime24\.jsonl:6: malformed JSON row"
    )
    # no data dir and no network: one line pointing at --data-dir, at once
    proc = _cli(*base, "--suite", "aime24", env={"HF_HUB_OFFLINE": "1", "RLBENCH_DATA_DIR": ""})
    _assert_one_line_error(proc, r"cannot reach the HuggingFace hub.*--data-dir")


def test_suites_command_lists_sizes(tmp_path: Path) -> None:
    data = _write_suite(tmp_path / "data")
    proc = _cli("suites", "--data-dir", str(data))
    assert proc.returncode == 0, proc.stderr
    cells = [line.split("│") for line in proc.stdout.splitlines() if line.count("│") > 3]
    lines = {c[1].strip(): "│".join(c) for c in cells if c[1].strip()}  # wrapped continuation rows have none
    assert set(lines) == {
        "aime24",
        "amc23",
        "olympiadbench",
        "math500",
        "kk",
        "kk-ood",
        "math",
    }  # math: a group
    assert " 5 " in lines["aime24"] and "500" in lines["math500"] and "not in data dir" in lines["math500"]


def test_template_choice() -> None:
    from reference_trainer.tasks.grading import MATH_INSTRUCTION
    from reference_trainer.tasks.prompts import build_prompt, resolve_template

    class ChatTok:
        has_chat_template = True

        def apply_chat_template(self, messages: list, add_generation_prompt: bool = True) -> str:
            return f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"

    assert resolve_template("auto", "kk", ChatTok()) == "chat"
    assert resolve_template("auto", "kk", None) == "kk"
    assert resolve_template("math", "kk", ChatTok()) == "math"
    with pytest.raises(UserError, match="no chat template"):
        resolve_template("chat", "math", None)
    with pytest.raises(UserError, match="unknown template"):
        resolve_template("fancy", "math", None)
    chat = build_prompt("What is 1+1?", "chat", "math", ChatTok())
    assert chat.startswith("<|im_start|>user\nWhat is 1+1?") and MATH_INSTRUCTION in chat
    assert "CONCLUSION:" in build_prompt("Who is a knight?", "kk", "kk", None)


def _tear_last_line(path: Path) -> str:
    """Cut the last row in half, as a kill mid-append leaves it; returns the torn row's id."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    torn_id = json.loads(data[start:])["id"]
    path.write_bytes(data[: start + (len(data) - start) // 2])
    return torn_id


def test_resume_over_a_torn_progress_line_repeatedly(
    tmp_path: Path, pool: GradingPool, capsys: pytest.CaptureFixture
) -> None:
    """Each rerun drops the torn row with a note, regenerates only it and the missing problems, and
    rewrites it whole: repeated kills never corrupt problems.jsonl nor regenerate a finished problem."""
    data = _write_suite(tmp_path / "data")
    out = tmp_path / "out"
    progress = out / "problems.jsonl"

    def run(backend: FakeBackend) -> dict:
        return run_eval(
            eval_plan(_cfg(), data), lambda: backend, out, pool=pool, chunk_seqs=2, progress=False
        )

    with pytest.raises(RuntimeError, match="simulated crash"):
        run(FakeBackend(fail_after=2))  # fx-01, fx-02 finished
    for done_before in (["fx-01"], ["fx-01", "fx-02"]):
        torn = _tear_last_line(progress)
        assert torn not in done_before
        crashing = FakeBackend(fail_after=2)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(crashing)
        assert sorted(set(crashing.generated_ids))[0] == torn  # the torn row is redone first ...
        assert not set(crashing.generated_ids) & set(done_before)  # ... finished ones never are
        assert f"note: {progress}: cut a torn last line" in capsys.readouterr().err
    final = FakeBackend()
    res = run(final)
    assert set(final.generated_ids) == {"fx-05"}
    lines = progress.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every row whole and newline-terminated
    assert [json.loads(x)["id"] for x in lines[:-1]] == list(GOLDS)
    assert [r["id"] for r in res["problems"]] == list(GOLDS)


class VotingBackend(FakeBackend):
    """Four samples per problem: the gold 7, then 1/2 written three ways."""

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        answers = ["7", "0.5", "1/2", "\\frac{1}{2}"]
        return [f"So the answer is $\\boxed{{{answers[i % 4]}}}$." for i in range(len(prompts))]


def test_majority_vote_runs_over_equivalence_classes(tmp_path: Path, pool: GradingPool) -> None:
    data = _write_suite(tmp_path / "data")
    cfg = EvalConfig(suite="aime24", model="fake-model", samples=4, temperature=0.7)
    res = run_eval(eval_plan(cfg, data), VotingBackend, tmp_path / "out", pool=pool, progress=False)
    row = {r["id"]: r for r in res["problems"]}["fx-05"]  # gold 7
    assert row["correct"] == [True, False, False, False] and row["answer_classes"] == [0, 1, 1, 1]
    # three votes for 1/2 beat one for 7 (the answer as math-verify normalises it: 0.5 -> \frac{1}{2})
    assert row["maj_correct"] is False and row["maj_answer"] == "\\frac{1}{2}"
    half = {r["id"]: r for r in res["problems"]}["fx-02"]  # gold 1/2: the same vote is right there
    assert half["maj_correct"] is True and half["n_correct"] == 3
    assert res["maj_at_k"]["4"] == pytest.approx(1 / 5)


def test_answers_that_differ_as_text_are_classed_by_math_verify(pool: GradingPool, caplog) -> None:
    """Keys that differ as text go to the pool, with the problem statement as the problem (it had been
    passed where the timeout goes: every such vote failed and fell back to exact text, with a warning)."""
    from rlbench.eval.runner import _answer_classes
    from rlbench.eval.suites import Problem

    texts = ["The answer is $\\boxed{0.5}$.", "So $\\boxed{\\frac{2}{4}}$.", "Thus $\\boxed{3}$."]
    graded = [GradeResult(None, False, key=k) for k in ("0.5", "\\frac{2}{4}", "3")]
    with caplog.at_level("WARNING"):
        classes = _answer_classes("math", [Problem("p", "What is 1/2?", "1/2")], texts, graded, 3, pool)
    assert classes == [[0, 0, 1]]
    assert "majority vote by exact answer text" not in caplog.text


def test_graders_are_forked_before_the_engine_and_ignore_ctrl_c(tmp_path: Path, monkeypatch) -> None:
    """Forked before any engine or progress-bar thread exists (a fork copies a lock another thread holds:
    Ctrl-C once hung the run), and deaf to the process group's SIGINT, which the parent answers alone."""
    import os
    import signal

    order = []
    started = GradingPool.start

    def start(self) -> None:  # type: ignore[no-untyped-def]
        started(self)
        order.append(("pool", self.worker_pids()))

    monkeypatch.setattr(GradingPool, "start", start)

    def backend() -> FakeBackend:
        order.append(("backend", []))
        return FakeBackend()

    data = _write_suite(tmp_path / "data")
    res = run_eval(eval_plan(_cfg(), data), backend, tmp_path / "out", progress=False)
    assert [name for name, _ in order] == ["pool", "backend"] and order[0][1]
    assert res["problems_evaluated"] == 5
    with GradingPool(workers=1) as pool:
        pool.start()
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGINT)
        time.sleep(0.3)
        assert pool.worker_pids() == [pid]  # still alive, and still grading
        assert pool.grade([GradeItem("math", "The answer is $\\boxed{2}$.", "2")])[0].correct


def test_the_bar_keeps_the_finished_count_when_interrupted(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C after two problems: the bar's last frame says 2/5 (it once reset to 0/5 just before the
    message that every finished problem was kept), and a resumed run's bar starts from 2."""
    import rich.progress

    from rlbench.eval import runner

    frames: list[tuple[float, float]] = []
    starts: list[float] = []

    class RecordingProgress(rich.progress.Progress):
        def add_task(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            starts.append(kwargs.get("completed", 0))
            return super().add_task(*args, **kwargs)

        def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
            frames.extend((t.completed, t.total or 0) for t in self.tasks)  # what the last frame shows
            super().__exit__(*exc)

    class InterruptedBackend(FakeBackend):
        def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
            if self.calls == 2:
                raise KeyboardInterrupt
            return super().generate(prompts, params, on_text)

    monkeypatch.setattr(runner, "Progress", RecordingProgress)
    data = _write_suite(tmp_path / "data")
    with pytest.raises(KeyboardInterrupt):  # chunks of one problem (chunk_seqs=2, K=2)
        run_eval(eval_plan(_cfg(), data), InterruptedBackend, tmp_path / "out", chunk_seqs=2)
    assert frames == [(2, 5)]
    assert len((tmp_path / "out" / "problems.jsonl").read_text().splitlines()) == 2
    frames.clear()
    run_eval(eval_plan(_cfg(), data), FakeBackend, tmp_path / "out", chunk_seqs=2)
    assert starts == [0, 2] and frames == [(5, 5)]
