"""bubblespec-lookahead: the spec's rule, the figures from hand-made steps, and the runner end to end on the
tiny model (three runs interleaved, resumed from work/ on a second call)."""

from __future__ import annotations

import pytest

from rlbench.reproduce.base import Context
from rlbench.reproduce.lookahead import GATED, RUNS, UNGATED, Workload, measure, seed_figures, speedup
from rlbench.reproduce.spec import load_specs


def test_the_verdict_reads_the_gated_run_and_is_inconclusive_without_lookahead():
    spec = load_specs()["bubblespec-lookahead"]
    assert spec.runner == "rlbench.reproduce.lookahead:speedup"
    faster = {"lookahead_tokens": 500, "rollout_speedup": 1.2, "bubble_vs_baseline": 0.8}
    assert spec.verdict(faster)[0] == "reproduced"
    assert spec.verdict({**faster, "rollout_speedup": 0.9})[0] == "not reproduced"
    assert spec.verdict({**faster, "rollout_speedup": 1.0})[0] == "not reproduced"  # > 1.0, not >=
    assert spec.verdict({**faster, "bubble_vs_baseline": 1.05})[0] == "not reproduced"
    # the gate kept lookahead off: nothing was tested, whatever the noise made of the speed-up
    verdict, reasons = spec.verdict({**faster, "lookahead_tokens": 0})
    assert verdict == "inconclusive" and reasons[0] == "precondition lookahead_tokens > 0: fails (0)"
    # the gate-removed run is shown, never decides
    assert spec.verdict({**faster, "rollout_speedup.ungated": 0.5})[0] == "reproduced"


def run(rollout_s: list[float], bubble_slots: float, lookahead: int = 0, drafted: int = 0, accepted: int = 0):
    """A run's per-step figures: 100 tokens a step, capacity 10, `bubble_slots` of them idle all along."""
    n = len(rollout_s)
    return {"per_step": {
        "timing_s/gen": rollout_s, "rollout_tokens": [100] * n,
        "bubble_ratio": [bubble_slots / 10] * n, "lookahead_tokens": [lookahead] * n,
        "lookahead_slot_share": [0.1 if lookahead else 0.0] * n,
        "drafted_tokens": [0] + [drafted] * (n - 1), "accepted_tokens": [0] + [accepted] * (n - 1),
        "reward_mean": [0.1] * n, "slot_time": [(10 - bubble_slots) * t for t in rollout_s],
        "lookahead_slot_time": [t if lookahead else 0.0 for t in rollout_s], "capacity": [10] * n,
        "drafted_seqs": [0] + [5] * (n - 1), "decode_seq_steps": [20] * n,
    }}  # fmt: skip


def test_speed_up_from_step_2_bubble_and_drafts_from_the_steps():
    runs = {
        "baseline": run([2.0, 2.0, 2.0], bubble_slots=4),
        GATED: run([2.0, 2.0, 2.0], bubble_slots=4),  # the gate kept it off: the baseline's figures
        UNGATED: run([3.0, 1.0, 1.0], bubble_slots=2, lookahead=50, drafted=80, accepted=60),
    }
    slower = run([2.0, 4.0, 4.0], bubble_slots=2, lookahead=50, drafted=80, accepted=40)
    per_seed = {0: seed_figures(runs), 1: seed_figures({**runs, UNGATED: slower})}
    assert per_seed[0][UNGATED]["from_step2"]["speedup"] == pytest.approx(2.0)  # 4 s of baseline over 2 s
    assert per_seed[0][UNGATED]["all"]["speedup"] == pytest.approx(6 / 5)  # step 1's lookahead cost counts
    m = measure(per_seed)
    assert m["rollout_speedup.ungated"] == pytest.approx((2.0 + 0.5) / 2)
    assert m["rollout_speedup_sd.ungated"] == pytest.approx(2**0.5 * 0.75)
    assert m["bubble_ratio.baseline"] == pytest.approx(0.4)
    assert m["bubble_ratio.ungated"] == pytest.approx(0.2)
    assert m["bubble_vs_baseline.ungated"] == pytest.approx(0.5)
    assert m["bubble_vs_baseline"] == pytest.approx(1)
    assert m["lookahead_tokens"] == 0 and m["seeds_with_lookahead"] == 0 and m["acceptance"] is None
    assert m["lookahead_tokens.ungated"] == 2 * 150 and m["seeds_with_lookahead.ungated"] == 2
    assert m["acceptance.ungated"] == pytest.approx((2 * 60 + 2 * 40) / (4 * 80))  # pooled over seeds
    assert m["accepted_share.ungated"] == pytest.approx(200 / 400)  # of steps 2 on's tokens
    assert m["draft_coverage.ungated"] == pytest.approx(10 / 40)
    assert m["lookahead_slot_share.ungated"] == pytest.approx(0.1)


def test_the_runner_on_the_tiny_model_fills_the_bubble_ungated_and_resumes(tmp_path, tiny_model_dir):
    lines: list[str] = []
    ctx = Context("cpu", quick=True, model=str(tiny_model_dir), work_dir=tmp_path, progress=lines.append)
    # pairs of samples on 6 slots: the tiny model's lengths leave a pair of slots idle for lookahead to fill
    w = Workload(steps=2, prompts_per_step=3, group_size=2, max_tokens=48, seeds=1)
    out = speedup(ctx, w)
    m = out.measured
    assert set(out.data["per_step"]["0"]) == set(RUNS) and out.seeds == [0]
    assert all((tmp_path / "seed0" / r / "trace.jsonl").is_file() for r in RUNS)
    # with the gate removed the idle slots run ahead (their slot-time is out of the bubble) and step 2
    # verifies the drafts (bubbles are timings: not compared across runs here)
    assert m["lookahead_tokens.ungated"] > 0 and m["lookahead_slot_share.ungated"] > 0
    assert m["acceptance.ungated"] is not None and m["draft_coverage.ungated"] > 0
    assert m["seeds_with_lookahead.ungated"] == 1
    assert "gate removed" in m["headline"] and any("margin=100" in n for n in out.notes)
    # exact: every run generated the baseline's tokens
    figures = out.data["per_seed"]["0"]
    assert {figures[r]["all"]["tokens"] for r in RUNS} == {figures["baseline"]["all"]["tokens"]}
    assert not any("reusing" in line for line in lines)
    again = speedup(ctx, w)  # finished: read back from work/, nothing trained
    assert "reusing the finished runs of seed 0" in lines[-1] and again.measured == m
