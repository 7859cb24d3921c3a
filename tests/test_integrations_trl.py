"""rlbench.integrations.trl with a real TRL GRPOTrainer on the CPU: a tiny Llama and a character tokenizer
made here, a few steps; the recorder's run folder must agree with what TRL itself logged."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from conftest import cli  # noqa: E402

from reference_trainer.trace import metrics  # noqa: E402
from reference_trainer.trace.records import read_json, read_jsonl  # noqa: E402
from reference_trainer.trace.schema import read_trace  # noqa: E402
from rlbench.integrations.trl import RLBenchRecorder  # noqa: E402

pytestmark = pytest.mark.e2e


def _trainer(out, recorder, steps: int, **grpo):
    """8 samples per step (2 prompts x 4), completions of at most 12 tokens: benchmarks/trl_grpo.py's."""
    from benchmarks.trl_grpo import build_trainer  # the repository root is on sys.path under pytest

    return build_trainer(out, recorder, steps, **grpo)


def test_a_grpo_run_becomes_an_rlbench_run(tmp_path):
    out = tmp_path / "run"
    recorder = RLBenchRecorder(out, whatif_workers=(1, 2))
    trainer = _trainer(tmp_path, recorder, steps=3)
    recorder.wrap_generation(trainer)
    trainer.train()

    doc = read_json(out / "metrics.json")
    events = read_trace(out / "trace.jsonl")
    assert doc["summary"] == metrics.compute(events)["summary"]  # everything recomputes from the trace
    assert doc["run"]["rollout_timed_by"] == "GRPOTrainer._generate"
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3]  # TRL's global_step, as its logs number them
    groups = read_jsonl(out / "lengths.jsonl")
    assert len(groups) == 6 and {len(g["response_tokens"]) for g in groups} == {4}  # 2 prompts x 4, 3 steps
    assert all(g["prompt_tokens"] > 0 for g in groups)  # read from _generate's prompt ids
    for step, row in zip(doc["steps"], doc["integration"]["per_step"], strict=True):
        lengths = [n for g in groups if g["step"] == step["step"] for n in g["response_tokens"]]
        # the probe's lengths are the ones TRL logged
        assert sum(lengths) / len(lengths) == pytest.approx(row["TRL completions/mean_length"])
        assert max(lengths) == row["TRL completions/max_length"]
        # one generation batch decodes together: busy sample-steps over 8 slots x the longest sample
        assert step["bubble_ratio"] == pytest.approx(1 - sum(lengths) / (8 * max(lengths)))
        assert 0 < step["timing_s/gen"] < step["step_time_s"]
        assert step["timing_s/update"] > 0
    assert {r["mode"] for r in doc["whatif"]["results"]} == {
        "baseline",
        "sorted",
        "sorted-partial",
        "histopipe",
        "async",
    }
    (out / "report.html").unlink()
    res = cli("report", str(out))
    assert res.returncode == 0, res.stderr
    assert "TRL GRPOTrainer" in (out / "report.html").read_text()
    # the audit sets TRL's own step_time beside the trace's step time
    res = cli("audit", str(out))
    assert res.returncode == 0, res.stderr
    assert "declared by TRL step_time" in res.stdout and "label: " in res.stdout


def test_without_the_wrapper_the_probe_closes_the_rollout(tmp_path):
    out = tmp_path / "run"
    recorder = RLBenchRecorder(out, slots=4, whatif_workers=(1,))
    _trainer(tmp_path, recorder, steps=2).train()
    doc = read_json(out / "metrics.json")
    assert doc["run"]["rollout_timed_by"] == "length probe"
    assert doc["run"]["slots_per_worker"] == 4
    rollouts = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "rollout"]
    updates = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "update"]
    assert len(rollouts) == len(updates) == 2
    for r, u in zip(rollouts, updates, strict=True):
        assert r["t_end"] == u["t_start"]  # the probe's call ends one and starts the other
    # 8 samples on 4 slots: continuous batching, so some sample waits for a slot
    seqs = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "sequence" and e["step"] == 1]
    assert len(seqs) == 8 and max(s["t_admit"] for s in seqs) > rollouts[0]["t_start"]


def test_import_trl_reads_a_finished_runs_output_dir(tmp_path):
    out = tmp_path / "recorded"
    recorder = RLBenchRecorder(out, whatif_workers=(1,))
    trainer = _trainer(tmp_path, recorder, steps=2, log_completions=True)
    trainer.train()
    trainer.save_state()  # trainer_state.json: TRL's per-step step_time and completions/*
    imported = tmp_path / "imported"
    res = cli("import", "trl", str(tmp_path / "trl"), "--workers", "1", "--out", str(imported))
    assert res.returncode == 0, res.stderr
    doc, recorded = read_json(imported / "metrics.json"), read_json(out / "metrics.json")
    # the probe's completion_tokens column in TRL's parquet: the lengths the callback saw, step by step
    assert [g["response_tokens"] for g in read_jsonl(imported / "lengths.jsonl")] == [
        g["response_tokens"] for g in read_jsonl(out / "lengths.jsonl")
    ]
    for mine, theirs in zip(doc["steps"], recorded["steps"], strict=True):
        assert mine["bubble_ratio"] == pytest.approx(theirs["bubble_ratio"])  # decode steps, same slots
        assert mine["step"] == theirs["step"]
    # one headline bubble for the run, whichever way it was read (the callback's clock weights steps by
    # their seconds; the headline does not depend on it)
    headline = recorded["integration"]["bubble_decode_steps"]
    assert doc["integration"]["bubble_decode_steps"] == pytest.approx(headline)
    for page in (imported / "report.html", out / "report.html"):
        assert f"{100 * headline:.1f}%" in page.read_text()
    assert doc["run"]["time_unit"] == "decode step"
    assert [r["step"] for r in doc["integration"]["per_step"]] == [1, 2]
    assert [s["reward_mean"] for s in doc["steps"]] == [s["reward_mean"] for s in recorded["steps"]]
    assert all(r["TRL step_time"] > 0 for r in doc["integration"]["per_step"])


def test_the_benchmark_s_trl_config_names_checkpointing_as_the_installed_transformers_does(tmp_path):
    """TRL's default gradient checkpointing, passed under transformers' current name: building the trainer
    raises no FutureWarning about the config's old name (one per test run in the suite's output before)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(tmp_path, RLBenchRecorder(tmp_path / "run"), steps=1)
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert not [m for m in said if m.startswith("`gradient_checkpointing` is deprecated")], said
    assert trainer.args.gradient_checkpointing  # the setting itself kept: TRL's default, on
