"""Bad suite data is refused when the suite loads (one line naming file:line, before any model is resolved),
and `rlbench report` on wrongly typed eval rows or results.json is one line too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

ROW = {"id": "a", "problem": "What is 1 + 1?", "answer": "2"}


@pytest.fixture
def no_model(monkeypatch) -> list[str]:
    """Records any attempt to resolve a model (where `evaluate` calls it): a data error must come first."""
    import rlbench.evaluate

    seen: list[str] = []
    monkeypatch.setattr(rlbench.evaluate, "resolve_model", lambda *a, **k: seen.append("model") or Path("."))
    return seen


def _data(tmp_path: Path, name: str, content: bytes) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / name).write_bytes(content)
    return data


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({**ROW, "subject": ["algebra", "geometry"]}, "subject is ['algebra', 'geometry'], not a string or"),
        ({**ROW, "level": {"n": 3}}, "level is {'n': 3}, not a string or a number"),
        ({**ROW, "problem": None}, "problem is missing or null"),
        ({**ROW, "answer": None}, "answer is missing or null"),
        ({**ROW, "id": None}, "id is missing or null"),
        ({**ROW, "answer": [1, 2]}, "answer is [1, 2], not a string or a number"),
        ({**ROW, "problem": ""}, "problem is '', not a non-empty string"),
        ({**ROW, "answer": True}, "answer is True, not a string or a number"),
    ],
)
def test_wrongly_typed_suite_rows_are_one_line_before_the_model(tmp_path, no_model, row, message):
    data = _data(
        tmp_path,
        "math500.jsonl",
        (json.dumps(ROW | {"id": "first"}) + "\n" + json.dumps(row) + "\n").encode(),
    )
    res = cli("eval", "--suite", "math500", "--data-dir", str(data), "--out", "ev", tmp=tmp_path)
    assert_one_line_error(res, f"math500.jsonl:2: {message}")
    assert no_model == [] and not (tmp_path / "ev").exists()


def test_lone_surrogates_non_utf8_and_kk_rows_without_names(tmp_path, no_model):
    surrogate = b'{"id": "a", "problem": "What is \\ud800?", "answer": "2"}\n'
    data = _data(tmp_path, "aime24.jsonl", surrogate)
    res = cli("eval", "--suite", "aime24", "--data-dir", str(data), "--out", "ev", tmp=tmp_path)
    assert_one_line_error(res, "aime24.jsonl:1: problem holds a lone surrogate")
    _data(
        tmp_path,
        "amc23.jsonl",
        json.dumps(ROW).encode() + b"\n" + b'{"id": "b", "problem": "\xff\xfe", "answer": "1"}\n',
    )
    res = cli("eval", "--suite", "amc23", "--data-dir", str(data), "--out", "ev", tmp=tmp_path)
    assert_one_line_error(res, "amc23.jsonl:2: not UTF-8 text")
    listing = cli("suites", "--data-dir", str(data), tmp=tmp_path)  # sizes need no decoding
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    _data(tmp_path, "kk_logic.jsonl", json.dumps(ROW).encode() + b"\n")
    res = cli("eval", "--suite", "kk", "--data-dir", str(data), "--out", "ev", tmp=tmp_path)
    assert_one_line_error(res, "kk_logic.jsonl:1: a K&K problem needs its names")
    assert no_model == []


def _eval_run(tmp_path: Path) -> Path:
    """A finished eval run's files, as runner.py writes them (one problem, two samples)."""
    from rlbench.eval.runner import EvalConfig, summarize
    from rlbench.eval.suites import get_suite

    run = tmp_path / "ev"
    run.mkdir()
    row = {"id": "a", "gold": "2", "extracted": ["2", "3"], "correct": [True, False], "n_correct": 1,
           "avg": 0.5, "answer_classes": [0, 1], "maj_answer": "2", "maj_correct": True,
           "response_chars": [5, 6], "response_tokens": None, "truncated_prompts": 0,
           "grade_errors": [None, None], "responses": ["2", "3"]}  # fmt: skip
    cfg = EvalConfig(suite="math500", model="m", samples=2)
    (run / "problems.jsonl").write_text(json.dumps(row) + "\n")
    (run / "run_config.json").write_text(json.dumps({"config": cfg.__dict__, "template": "math"}))
    (run / "results.json").write_text(json.dumps(summarize(get_suite("math500"), cfg, "math", [row])))
    return run


def test_report_on_wrongly_typed_results_is_one_line(tmp_path):
    run = _eval_run(tmp_path)
    assert cli("report", str(run), tmp=tmp_path).returncode == 0
    good = json.loads((run / "results.json").read_text())
    for change, message in (
        ({"samples": "2"}, "samples is '2', not a positive integer"),
        ({"pass_at_k": {"1": 0.5}}, "pass_at_k is {'1': 0.5}, not a {k: value} table with k = 2"),
        ({"accuracy": None}, "accuracy is None, not a share between 0 and 1"),
        ({"accuracy": 45.0}, "accuracy is 45.0, not a share between 0 and 1"),  # was shown as 4500%
        (
            {"pass_at_k": {"2": float("inf")}},
            "pass_at_k is {'2': inf}, not a {k: share between 0 and 1} table",
        ),
        ({"sampling": None}, "sampling is None, not the sampling settings"),
        ({"problems": [{"id": "a"}]}, "problem 1: lacks gold"),
        (
            {"problems": [{**good["problems"][0], "correct": "yes"}]},
            "problem 1: correct is 'yes', not a list",
        ),
        ({"problems": [{**good["problems"][0], "gold": "\ud800"}]}, "problem 1: gold is '\\ud800', not text"),
        ({"by_group": {"subject": [{"subject": ["x"]}]}}, "by_group is not a {field: [groups]} table"),
    ):
        (run / "results.json").write_text(json.dumps({**good, **change}))
        assert_one_line_error(cli("report", str(run), tmp=tmp_path), f"results.json: {message}")
    (run / "results.json").write_text("[1, 2]")
    assert_one_line_error(cli("report", str(run), tmp=tmp_path), "results.json: not an eval's results")


def test_report_and_resume_on_wrongly_typed_rows_are_one_line(tmp_path):
    run = _eval_run(tmp_path)
    (run / "results.json").unlink()  # a killed run: the report is rebuilt from the rows
    row = json.loads((run / "problems.jsonl").read_text())
    (run / "problems.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "n_correct": "1"}) + "\n")
    assert_one_line_error(
        cli("report", str(run), tmp=tmp_path), "problems.jsonl:2: n_correct is '1', not a count"
    )
    (run / "problems.jsonl").write_text(json.dumps({**row, "subject": ["a"]}) + "\n")
    assert_one_line_error(
        cli("report", str(run), tmp=tmp_path), "problems.jsonl:1: subject is ['a'], not text"
    )
    (run / "run_config.json").write_text(
        json.dumps({"config": {"suite": "math500", "model": "m", "samples": "2"}})
    )
    assert_one_line_error(cli("report", str(run), tmp=tmp_path), "run_config.json: not an eval run config")
