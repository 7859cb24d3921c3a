"""simulator-scale: the trend and the flat measurements the verdict reads, the spec's rule, a small simulated
sweep (deterministic, reused when finished), and the reproduction end to end on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tiny_char_model

from rlbench.reproduce import scale
from rlbench.reproduce.base import Context
from rlbench.reproduce.scale import RealRuns, Sweep, run_sweep, summarize, trend
from rlbench.reproduce.spec import load_specs

SMALL = Sweep(
    workers=(1, 2, 8, 32), steps=2, groups_per_worker=2, slots=8, mean_tokens=300.0, max_tokens=3000
)


def ctx_at(
    path: Path, quick: bool = True, model: str | None = None, lines: list[str] | None = None
) -> Context:
    sink = lines.append if lines is not None else (lambda line: None)
    return Context(device="cpu", quick=quick, model=model, work_dir=path, progress=sink)


def test_trend_is_growth_and_the_largest_fall():
    assert trend([(1, 0.5), (2, 0.6), (4, 0.58), (16, 0.7)]) == pytest.approx(
        {"growth": 0.2, "largest_drop": 0.02}
    )
    assert trend([(1, 0.5), (8, 0.5), (64, 0.9)]) == pytest.approx({"growth": 0.4, "largest_drop": 0.0})
    assert trend([(1, 0.8), (8, 0.3)])["growth"] == pytest.approx(-0.5)


def fake(
    val_errors: tuple[float, float] = (0.01, 0.02), baseline: tuple[float, ...] = (0.5, 0.6, 0.7)
) -> dict:
    val = {w: {"measured_bubble": 0.4, "simulated_bubble": 0.4 + e, "measured_rollout_s": 2.0,
               "simulated_rollout_s": 2.2} for w, e in zip((1, 2), val_errors, strict=True)}  # fmt: skip
    results = [
        {
            "policy": p,
            "workers": w,
            "bubble_ratio": b if p == "baseline" else 0.1,
            "worker_idle_share": 0.1 * i,
        }
        for p in ("baseline", "sorted")
        for i, (w, b) in enumerate(zip((1, 16, 4096), baseline, strict=True))
    ]
    return summarize(val, {"results": results})


def test_summarize_and_the_spec_verdict():
    m = fake()
    assert m["max_workers"] == 4096
    assert m["validation.error.w1"] == pytest.approx(0.01) and m["validation.error.w2"] == pytest.approx(0.02)
    assert m["validation.rollout_s_rel_error.w2"] == pytest.approx(0.1)
    assert m["bubble_ratio.baseline.w1"] == 0.5 and m["bubble_ratio.baseline.max_w"] == 0.7
    assert m["worker_idle_share.sorted.max_w"] == pytest.approx(0.2)
    assert m["trend.bubble_growth.baseline"] == pytest.approx(0.2)
    assert m["trend.idle_growth.baseline"] == pytest.approx(0.2)
    assert "50% (W = 1)" in m["headline"] and "W = 4096" in m["headline"]
    spec = load_specs()["simulator-scale"]
    assert spec.verdict(m)[0] == "reproduced"
    assert spec.verdict(fake(val_errors=(0.01, -0.08)))[0] == "not reproduced"  # |error| counts
    assert spec.verdict(fake(baseline=(0.5, 0.52, 0.53)))[0] == "not reproduced"  # too little growth
    assert spec.verdict(fake(baseline=(0.5, 0.8, 0.7)))[0] == "not reproduced"  # falls on the way
    assert spec.verdict(fake(baseline=(0.5, 0.6, 0.59)))[0] == "reproduced"  # within the noise
    assert spec.verdict({**m, "validation.measured_bubble.w2": 0.05})[0] == "inconclusive"


def test_a_small_sweep_grows_with_workers_and_is_reused(tmp_path):
    lines: list[str] = []
    doc = run_sweep(ctx_at(tmp_path, lines=lines), SMALL)
    assert {(r["policy"], r["workers"]) for r in doc["results"]} == {
        (m, w) for m in scale.MODES for w in SMALL.workers
    }
    base = dict(scale.curve(doc["results"], "baseline", "worker_idle_share"))
    assert base[1] == 0.0 and base[32] > base[2] > 0.0  # one worker never waits for another
    bubble = scale.curve(doc["results"], "baseline", "bubble_ratio")
    assert bubble[-1][1] > bubble[0][1]
    assert all("steps" not in r for r in doc["results"])
    assert (
        run_sweep(ctx_at(tmp_path, lines=lines), SMALL) == doc
        and lines[-1] == "reusing the finished simulation"
    )


def test_sizes_full_and_quick():
    full, quick = Sweep.for_context(ctx_at(Path("."), False)), Sweep.for_context(ctx_at(Path("."), True))
    assert full.workers[0] == 1 and full.workers[-1] == 4096 and quick.workers[-1] < 4096
    assert 2 in full.workers and 2 in quick.workers
    assert (
        RealRuns.for_context(ctx_at(Path("."), False)).steps > RealRuns.for_context(ctx_at(Path("."))).steps
    )


def test_the_reproduction_end_to_end_on_a_tiny_model(tmp_path, monkeypatch):
    """W = 2 runs on in-process workers here (Ray is slow to start): they take turns, so the measured W = 2
    bubble is not comparable with the replay's and only the plumbing is checked."""
    model = write_tiny_char_model(tmp_path / "model", eos_weight=1.0)
    tiny = RealRuns(steps=2, prompts_per_worker=3, group_size=4, max_tokens=48, slots=8)
    monkeypatch.setattr(RealRuns, "for_context", classmethod(lambda cls, ctx: tiny))
    monkeypatch.setattr(Sweep, "for_context", classmethod(lambda cls, ctx: SMALL))
    monkeypatch.setattr(scale, "worker_backend", lambda: "local")  # as where Ray is not installed
    lines: list[str] = []
    ctx = ctx_at(tmp_path / "work", model=str(model), lines=lines)
    outcome = scale.scale(ctx)
    m = outcome.measured
    assert m["max_workers"] == 32 and 0.0 < m["validation.measured_bubble.w1"] < 1.0
    for w, v in outcome.data["validation"].items():  # the replay does the runs' own work, at W = 1 and 2
        assert v["workers"] == int(w) and v["simulated_forwards"] == v["measured_forwards"] > 0
        assert v["simulated_slot_steps"] == v["measured_slot_steps"]
    assert len(outcome.sections[0][1]) == 2 and outcome.notes
    assert outcome.config["worker_backend"] == "local" and scale.LOCAL_NOTE in outcome.notes
    names = {t.name for t in outcome.sections[0][1][0].data}
    assert {"baseline", "sorted", "measured (CPU run)", "predicted for that run (replay)"} <= names
    assert load_specs()["simulator-scale"].verdict(m)[0] in ("reproduced", "not reproduced", "inconclusive")
    scale.scale(ctx)  # everything is reused
    assert sum(line.startswith("reusing") for line in lines) == 3
