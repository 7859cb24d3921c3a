"""The real-model reproductions (rlbench/reproduce/real_model.py) at --quick size on the embedded model: the
workloads carry the real setting (task options, temperature), every runner yields the numbers its spec's
verdict reads, and the learning run is reused when repeated. The real runs need SmolLM2 on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.reproduce import histospec, real_model, sortedrl
from rlbench.reproduce.base import Context
from rlbench.reproduce.spec import load_specs
from rlbench.training import open_trainers


def quick(tmp_path: Path, lines: list[str] | None = None) -> Context:
    say = lines.append if lines is not None else (lambda line: None)
    return Context(device="cpu", quick=True, model="embedded", work_dir=tmp_path, progress=say)


def test_the_real_workloads_train_on_the_setting_within_reach(tmp_path):
    ctx = Context(device="cpu", quick=False, model=None, work_dir=tmp_path)
    w = real_model.sortedrl_workload(ctx)
    assert (w.max_tokens, w.seeds) == (512, 1)
    config = sortedrl.mode_config(w, "sorted", "model-dir", "cpu")
    assert config.task_options == {"min_ops": 1, "max_ops": 1} and config.temperature == 0.7
    config.check()
    options = real_model.learning_options(ctx)
    assert options["task_option"] == ["min_ops=1", "max_ops=1"] and options["temperature"] == 0.7
    # every real-model run updates at the rate measured to learn there, not the embedded model's 1e-4
    spec = real_model.histospec_workload(ctx)
    assert options["lr"] == w.lr == spec.lr == 1e-5 and spec.task_options == w.task_options


def test_histospec_runs_update_at_the_workload_rate(tiny_model_dir, tmp_path):
    w = real_model.histospec_workload(Context(device="cpu", quick=True, model=None, work_dir=tmp_path))
    configs = histospec.mode_configs(w, str(tiny_model_dir), "cpu")
    with open_trainers(configs, {m: tmp_path / m for m in configs}) as trainers:
        assert [t.updater.optimizer.param_groups[0]["lr"] for t in trainers.values()] == [1e-5, 1e-5]
    default = histospec.mode_configs(histospec.Workload(), str(tiny_model_dir), "cpu")
    assert default["rhyme"].grpo.lr == 1e-4  # the embedded model's claims keep the trainer's rate


@pytest.mark.e2e
def test_the_learning_claim_measures_held_out_accuracy_before_and_after(tmp_path):
    lines: list[str] = []
    outcome = real_model.learning(quick(tmp_path, lines))
    m = outcome.measured
    assert m["greedy_lift"] == pytest.approx(m["greedy_after"] - m["greedy_before"])
    assert 0 <= m["greedy_before"] <= 1 and m["steps"] == 2 and m["samples"] == 2 * 2 * 4
    verdict, reasons = load_specs()["grpo-learning-smollm2"].verdict(m)
    assert verdict in ("reproduced", "not reproduced", "inconclusive") and len(reasons) == 2
    assert outcome.config["task_option"] == ["min_ops=1", "max_ops=1"]
    again: list[str] = []
    assert real_model.learning(quick(tmp_path, again)).measured == m
    assert any("reusing the finished learning run" in line for line in again)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("name", "runner"),
    [
        ("sortedrl-bubble-smollm2", real_model.sortedrl_bubble),
        ("histospec-speedup-smollm2", real_model.histospec_speedup),
    ],
)
def test_the_real_model_runners_yield_what_their_verdicts_read(tmp_path, name, runner):
    outcome = runner(quick(tmp_path))
    spec = load_specs()[name]
    missing = [c.metric for c in spec.checks + spec.requires if c.metric not in outcome.measured]
    assert not missing
    assert outcome.config["task_options"] == (("min_ops", 1), ("max_ops", 1))
    assert outcome.notes[0].startswith("A pretrained model on the setting within its reach")
