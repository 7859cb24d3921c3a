"""`rlbench eval` checks every input before a model is resolved; `rlbench report DIR` renders eval runs,
finished or killed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_eval_runner import GOLDS, FakeBackend, eval_plan
from test_report import CHROMIUM, check_all_figures_drew
from typer.testing import CliRunner

from reference_trainer.errors import UserError
from rlbench.cli import app_
from rlbench.eval.pool import GradingPool
from rlbench.eval.runner import EvalConfig, run_eval
from rlbench.report.eval_report import write_eval_report

SUBJECTS = {
    "fx-01": "Algebra",
    "fx-02": "Algebra",
    "fx-03": "Geometry",
    "fx-04": "Geometry",
    "fx-05": "Algebra",
}


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Model resolution (loading and checking a model) made to fail if reached. Patched where `evaluate`
    calls it: a patch of rlbench.models alone would be bound for good by an import of rlbench.evaluate made
    while it holds, and fail every later eval in the process."""
    import rlbench.evaluate
    import rlbench.models

    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append(f"model resolved: {args}")
        raise AssertionError("the model was resolved before the input was checked")

    monkeypatch.setattr(rlbench.evaluate, "resolve_model", refuse)
    monkeypatch.setattr(rlbench.models, "default_model_dir", refuse)
    monkeypatch.delenv("RLBENCH_DATA_DIR", raising=False)
    return calls


def _eval(*args: str) -> object:
    return CliRunner().invoke(app_, ["eval", "--out", "unused-out", *args])


def test_input_errors_come_before_the_model_is_resolved(tmp_path: Path, no_model: list[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "aime24.jsonl").write_text('{"id": "a", "problem": "p", "answer": "1"}\n')
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "aime24.jsonl").write_text('{"id": "a", "problem": "p", "answer": "1"}\n{"id": "b", "probl\n')
    no_rows = tmp_path / "no-rows"
    no_rows.mkdir()
    (no_rows / "aime24.jsonl").write_text("\n")
    ok = ["--suite", "aime24", "--data-dir", str(data)]
    cases = [
        (["--suite", "aime2024", "--data-dir", str(data)], r"unknown suite 'aime2024'"),
        ([*ok, "-k", "0"], r"--samples must be in 1\.\."),
        ([*ok, "--max-tokens", "0"], r"--max-tokens must be in 1\.\."),
        ([*ok, "--limit", "0"], r"--limit must be in 1\.\."),
        ([*ok, "--top-p", "1.5"], r"--top-p must be >= 1e-06 and <= 1, got 1\.5"),
        ([*ok, "--temperature", "nan"], r"--temperature must be a finite number, got nan"),
        ([*ok, "--template", "fancy"], r"unknown template 'fancy'"),
        (["--suite", "aime24", "--data-dir", str(empty_dir)], r"needs aime24\.jsonl in the data dir"),
        (["--suite", "aime24", "--data-dir", str(tmp_path / "missing")], r"data dir not found"),
        (["--suite", "aime24", "--data-dir", str(bad)], r"aime24\.jsonl:2: malformed JSON row"),
        (["--suite", "aime24", "--data-dir", str(no_rows)], r"no problems in .*aime24\.jsonl"),
    ]
    for args, message in cases:
        result = _eval(*args)
        assert isinstance(result.exception, UserError), (args, result.output, result.exception)
        assert re.search(message, str(result.exception)), (args, str(result.exception))
    usage = _eval(*ok, "--max-tokens", "lots")  # not a number: click says so, before anything runs
    assert usage.exit_code == 2 and "Invalid value for '--max-tokens'" in usage.output
    assert no_model == []


def _suite(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": pid,
            "problem": f"Problem {pid}: compute it.",
            "answer": a,
            "subject": SUBJECTS[pid],
            "level": i % 3,
        }
        for i, (pid, a) in enumerate(GOLDS.items())
    ]
    (data_dir / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2) as p:
        yield p


def _cfg() -> EvalConfig:
    return EvalConfig(suite="math500", model="fake-model", samples=2, temperature=0.7)


def test_report_renders_an_eval_dir(tmp_path: Path, pool: GradingPool) -> None:
    data = _suite(tmp_path / "data")
    out = tmp_path / "out"
    res = run_eval(eval_plan(_cfg(), data), FakeBackend, out, pool=pool, progress=False)
    write_eval_report(out / "report.html", res)
    written = (out / "report.html").read_text()
    (out / "report.html").unlink()
    result = CliRunner().invoke(app_, ["report", str(out)])  # used to exit 2: "no metrics.json ..."
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert page == written  # the run's own page and the re-rendered one are the same
    for heading in ("pass@k", "Accuracy by subject", "Accuracy by level", "Response length", "Per-problem"):
        assert f"<h2>{heading}" in page, heading
    for pid in GOLDS:
        assert f"<td>{pid}</td>" in page
    assert f"{res['maj_at_k']['2']:.1%}" in page
    if CHROMIUM is not None:
        assert check_all_figures_drew(out / "report.html", tmp_path) == 4  # pass@k, subject, level, lengths


def test_report_renders_a_killed_eval(tmp_path: Path, pool: GradingPool) -> None:
    data = _suite(tmp_path / "data")
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_eval(
            eval_plan(_cfg(), data),
            lambda: FakeBackend(fail_after=2),
            out,
            pool=pool,
            chunk_seqs=2,
            progress=False,
        )
    assert not (out / "results.json").exists()
    result = CliRunner().invoke(app_, ["report", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "partial run" in page and "<td>fx-02</td>" in page and "<td>fx-03</td>" not in page
