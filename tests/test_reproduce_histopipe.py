"""histopipe-balance: per-epoch idle shares, the comparison the verdict reads (paired standard error), the
spec's rule, a tiny two-worker run end to end (in-process workers), and the benchmark's thin CLI."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_char_model

from reference_trainer.trace.records import read_jsonl
from rlbench.reproduce import histopipe
from rlbench.reproduce.base import Context
from rlbench.reproduce.histopipe import Workload, compare, epoch_idle
from rlbench.reproduce.spec import load_specs

ROOT = Path(__file__).resolve().parents[1]


def step(idle: list[float | None], gen: float = 1.0) -> dict:
    shares = {str(w): v for w, v in enumerate(idle)}
    return {"worker_idle_share": shares, "timing_s/gen": gen, "step_time_s": 2 * gen, "bubble_ratio": 0.5}


def epochs(per_step: list[float], steps_per_epoch: int = 2) -> list[dict]:
    """Per-epoch rows of a two-worker run whose idle share per step is `per_step` (worker 0 the busiest)."""
    return epoch_idle([step([0.0, 2 * v]) for v in per_step], steps_per_epoch)


def test_epoch_idle_averages_over_workers_then_steps():
    rows = epoch_idle([step([0.0, 0.4], 1.0), step([0.2, 0.0], 3.0), step([0.0, None], 2.0)], 2)
    assert [e["epoch"] for e in rows] == [1, 2]
    assert rows[0]["idle_share_per_step"] == pytest.approx([0.2, 0.1])
    assert rows[0]["idle_share"] == pytest.approx(0.15) and rows[0]["rollout_s"] == pytest.approx(2.0)
    assert rows[1]["idle_share"] == 0.0  # a worker without busy time counts as not idle, not as missing


def test_compare_uses_epochs_with_history_and_paired_differences():
    rr, lo, hp = (
        [0.4, 0.4, 0.3, 0.2, 0.25, 0.35],
        [0.1, 0.1, 0.2, 0.1, 0.1, 0.2],
        [0.4, 0.4, 0.1, 0.1, 0.05, 0.1],
    )
    results = {"round-robin": epochs(rr), "least-in-flight": epochs(lo), "histopipe": epochs(hp)}
    got = compare(results, epochs=3, differ=[])
    assert got["history_epochs"] == 2 and got["same_samples"] == 1.0
    assert got["idle_share.round-robin"] == pytest.approx(0.275)  # epoch 1 (0.4, 0.4) left out
    assert got["idle_share_epoch1.histopipe"] == pytest.approx(0.4)
    assert got["idle_vs_round_robin.histopipe"] == pytest.approx(0.0875 / 0.275)
    diff = [a - b for a, b in zip(rr[2:], hp[2:], strict=True)]
    se = statistics.stdev(diff) / math.sqrt(4) / 0.275
    assert got["idle_vs_round_robin_se.histopipe"] == pytest.approx(se)
    assert "idle_vs_round_robin_se.round-robin" not in got
    assert got["idle_gap.histopipe_minus_least-in-flight"] == pytest.approx(0.0875 - 0.15)
    assert compare(results, epochs=3, differ=[4])["same_samples"] == 0.0
    one = compare({p: r[:1] for p, r in results.items()}, epochs=1, differ=[])
    assert one["history_epochs"] == 0 and one["idle_share.histopipe"] is None


def test_the_spec_decides_on_the_halving_and_refuses_noise():
    spec = load_specs()["histopipe-balance"]
    good = {"history_epochs": 3, "same_samples": 1.0, "idle_share.round-robin": 0.2,
            "idle_vs_round_robin_se.histopipe": 0.1, "idle_vs_round_robin.histopipe": 0.4}  # fmt: skip
    assert spec.verdict(good)[0] == "reproduced"
    assert spec.verdict({**good, "idle_vs_round_robin.histopipe": 0.7})[0] == "not reproduced"
    for bad in ({"history_epochs": 0}, {"same_samples": 0.0}, {"idle_share.round-robin": 0.05},
                {"idle_vs_round_robin_se.histopipe": 0.4}):  # fmt: skip
        assert spec.verdict({**good, **bad})[0] == "inconclusive"


def test_workload_sizes():
    def ctx(quick: bool) -> Context:
        return Context(device="cpu", quick=quick, model=None, work_dir=Path("."))

    full, quick = Workload.for_context(ctx(False)), Workload.for_context(ctx(True))
    assert full.epochs >= 2 and quick.epochs >= 2  # history is the point
    assert full.steps_per_epoch * full.epochs > quick.steps_per_epoch * quick.epochs
    assert "histopipe" in full.placements and "round-robin" in full.placements
    with pytest.raises(ValueError, match="multiple"):
        histopipe.train_config(Workload(pool=10, prompts_per_step=4), "histopipe", "m")


def test_a_tiny_run_end_to_end_with_local_workers(tmp_path, monkeypatch):
    model = write_tiny_char_model(tmp_path / "model", eos_weight=1.0)
    w = Workload(epochs=2, pool=4, prompts_per_step=2, group_size=3, max_tokens=24, slots=4, lr=1e-2,
                 placements=("round-robin", "least-in-flight", "histopipe"))  # fmt: skip
    monkeypatch.setattr(Workload, "for_context", classmethod(lambda cls, ctx: w))
    monkeypatch.setattr(histopipe, "worker_backend", lambda: "local")  # as where Ray is not installed
    lines: list[str] = []
    ctx = Context(
        device="cpu", quick=True, model=str(model), work_dir=tmp_path / "work", progress=lines.append
    )
    outcome = histopipe.balance(ctx)
    m = outcome.measured
    assert m["same_samples"] == 1.0 and m["history_epochs"] == 1
    assert (
        outcome.config["backend"] == "local" and histopipe.LOCAL_NOTE in outcome.notes
    )  # said in the result
    for p in w.placements:
        assert 0.0 <= m[f"idle_share.{p}"] < 0.5  # mean over 2 workers: the busiest is never idle
    assert len(outcome.data["epochs"]["histopipe"]) == 2
    events = read_jsonl(tmp_path / "work" / "runs" / "histopipe" / "trace.jsonl")
    assert {e["worker"] for e in events if e["kind"] == "decode"} == {0, 1}
    assert outcome.sections and outcome.notes and "W = 2" in m["headline"]
    histopipe.balance(ctx)  # the finished set is reused
    assert lines[-1].startswith("reusing the finished runs")


@pytest.mark.e2e
def test_the_benchmark_is_a_thin_cli_over_the_package():
    text = (ROOT / "benchmarks" / "histopipe.py").read_text()
    assert "from rlbench.reproduce.histopipe import" in text and "def per_epoch" not in text
    out = subprocess.run([sys.executable, "-m", "benchmarks.histopipe", "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and "--prompts-per-step" in out.stdout
