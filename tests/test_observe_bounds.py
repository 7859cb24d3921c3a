"""What a hostile server or file can claim, bounded: a success counter that jumps by 1e9 per scrape, counters
that go backwards on every scrape (one URL in front of several servers), 300 servers in one report, and
saved files of the wrong shape read back by observe, eval and report."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, cli

from rlbench.observe.derive import MAX_FINISHED_PER_SCRAPE, to_trace


def scrapes(counter, n=20, server=0):
    return [{"t": 0.1 * k, "server": server, "running": 2, "waiting": 0, "finished": counter(k),
             "generation_tokens": 10 * k} for k in range(n)]  # fmt: skip


def test_a_counter_that_jumps_by_a_billion_is_not_a_billion_requests():
    events, notes = to_trace(scrapes(lambda k: k * 10**9), capacity=[4])
    assert sum(e["kind"] == "sequence" for e in events) == 0
    assert any(f"grew by more than {MAX_FINISHED_PER_SCRAPE:,}" in n for n in notes)
    events, notes = to_trace(scrapes(lambda k: 3 * k), capacity=[4])  # a real server: every request kept
    assert sum(e["kind"] == "sequence" for e in events) == 3 * 19 and not notes


def test_counters_that_go_backwards_on_every_scrape_are_named_a_load_balancer():
    rows = scrapes(lambda k: 1000 * (k % 2) + k)  # two backends behind one URL, answered in turn
    for a, b in zip(rows, rows[1:], strict=False):
        b["restarted"] = b["finished"] < a["finished"]  # as the sampler marks them
    _, notes = to_trace(rows, capacity=[4])
    assert any("one URL in front of several servers" in n for n in notes), notes
    _, notes = to_trace(scrapes(lambda k: k), capacity=[4])
    assert not any("load balancer" in n for n in notes)


def test_a_report_of_300_servers_draws_the_busiest_few():
    """Drawing every server took 66 s; the bound is what is drawn (faults/fault_drill.py times it)."""
    from rlbench.report.observe_report import MAX_DRAWN, occupancy_figure

    rows = [row for s in range(300) for row in scrapes(lambda k: k, n=30, server=s)]
    events = [{"kind": "rollout", "t_start": 0.1 * k, "t_end": 0.1 * k + 0.05} for k in range(200)]
    fig = occupancy_figure(
        rows, {"run": {"servers": [], "capacity": {str(s): 4 for s in range(300)}}}, events
    )
    assert (
        len(fig.data) == 2 * MAX_DRAWN and f"the {MAX_DRAWN} busiest of 300 servers" in fig.layout.title.text
    )
    assert sum(s.type == "rect" for s in fig.layout.shapes) == 200


def test_saved_files_of_the_wrong_shape_are_one_line(tiny_model_dir, tmp_path):
    obs = tmp_path / "obs"
    obs.mkdir()
    (obs / "samples.jsonl").write_text(json.dumps({"t": 0.1, "server": 0, "running": 1, "waiting": 0}) + "\n")
    for metrics, why in (
        ([1], "not an observation's metrics"),
        ({"run": {"interval_s": -1}}, "run.interval_s"),
    ):
        (obs / "metrics.json").write_text(json.dumps(metrics))
        assert_one_line_error(
            cli("observe", "--from-samples", str(obs), tmp=tmp_path), f"metrics.json: {why}"
        )
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "run_config.json").write_text("[1, 2]")
    args = ("--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir), "--out", "ev")
    res = cli("eval", *args, tmp=tmp_path)
    assert_one_line_error(res, "run_config.json: not an evaluation's settings")


@pytest.mark.parametrize(("change", "why"), [
    ({"tokens": float("inf")}, "tokens is inf, not a time or count a run makes"),
    ({"t_end": 1e308}, "t_end is 1e+308, not a time or count a run makes"),
    ({"t_start": -1e308}, "t_start is -1e+308"),
    ({"t_start": 5.0}, "t_end 1 is before t_start 5"),
])  # fmt: skip
def test_trace_times_and_counts_past_any_run_are_one_line(tmp_path, change, why):
    run = tmp_path / "run"
    run.mkdir()
    event = {
        "kind": "decode",
        "step": 0,
        "t_start": 0,
        "t_end": 1,
        "active_slots": 1,
        "capacity": 2,
        **change,
    }
    (run / "trace.jsonl").write_text(json.dumps(event) + "\n")  # json.dumps writes inf as Infinity
    assert_one_line_error(cli("report", str(run), tmp=tmp_path), f"trace.jsonl: event 1 (decode): {why}")


@pytest.mark.parametrize(("file", "doc", "why"), [
    ("metrics.json", {"summary": {"bubble_ratio": float("inf")}, "steps": []},
     "metrics.json: summary: bubble_ratio is inf, not a share between 0 and 1"),
    ("metrics.json", {"summary": {"step_time_s": -5}, "steps": []},
     "metrics.json: summary: step_time_s is -5, not a time or rate >= 0"),
    ("metrics.json", {"summary": {}, "steps": [{"step": 0, "bubble_ratio": 1.5}]},
     "metrics.json: step row 1: bubble_ratio is 1.5"),
    ("compare.json", {"runs": [{"mode": "baseline", "summary": {"step_time_s": float("nan")}, "steps": []}]},
     "compare.json: baseline's summary: step_time_s is nan, not a time or rate >= 0"),
])  # fmt: skip
def test_saved_numbers_a_report_would_print_wrongly_are_one_line(tmp_path, file, doc, why):
    """A report printed "inf%", "-5 s" and nan speed-ups from these, with exit 0."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / file).write_text(json.dumps(doc))
    assert_one_line_error(cli("report", "run", tmp=tmp_path), why)


def test_a_char_tokenizer_that_is_not_the_models_is_refused(tiny_model_dir, tmp_path):
    import shutil

    from reference_trainer.model.tokenizer import CharTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "char_tokenizer.json").unlink()
    CharTokenizer(["<pad>", "<bos>", "<eos>", "a"]).save(model)
    res = cli("generate", "--model", str(model), "--prompt", "a", "--max-tokens", "2", tmp=tmp_path)
    assert_one_line_error(res, "char_tokenizer.json: 4 tokens, where config.json's vocab_size is 99")
