"""sortedrl-accuracy from curves already in its work dir: it resumes (trains nothing) and measures parity."""

from __future__ import annotations

import math

import pytest

from reference_trainer.trace.records import write_json
from rlbench.reproduce.accuracy import Workload, accuracy, gap_standard_error
from rlbench.reproduce.base import Context
from rlbench.reproduce.curves import parity_plan


def curve_run(mode: str, seed: int, final: float, half: float) -> dict:
    curve = [{"step": 0, "samples": 0, "greedy_acc": 0.10, "pass1": 0.2},
             {"step": 3, "samples": 384, "greedy_acc": half, "pass1": 0.25},
             {"step": 6, "samples": 768, "greedy_acc": final, "pass1": 0.3}]  # fmt: skip
    return {"task": "kk", "mode": mode, "seed": seed, "steps": 6, "samples": 768, "wall_s": 1.0,
            "held_out_greedy_accuracy": {"before": 0.1, "after": final}, "curve": curve,
            "rollout_tokens": 1000 * (2 if mode.startswith("sorted") else 1) + seed}  # fmt: skip


def test_gap_standard_error_pools_the_seed_spread():
    modes = {"baseline": {"seeds": [0, 1, 2], "accuracy_sd": 0.03},
             "sorted": {"seeds": [0, 1, 2], "accuracy_sd": 0.05},
             "rhyme": {"seeds": [0], "accuracy_sd": 0.0}}  # fmt: skip
    pooled = math.sqrt((0.03**2 + 0.05**2) / 2)
    assert gap_standard_error(modes) == pytest.approx(pooled * math.sqrt(1 + 1 / 3))  # the 1-seed mode
    assert gap_standard_error({"baseline": {"seeds": [0], "accuracy_sd": 0.0}}) is None


def test_the_reproduction_resumes_from_finished_curves_and_decides(tmp_path):
    finals = {"baseline": (0.34, 0.35, 0.33), "sorted": (0.35, 0.34, 0.36),
              "sorted-partial": (0.33, 0.34, 0.35), "rhyme": (0.34,), "sorted+rhyme": (0.36,)}  # fmt: skip
    halves = {"baseline": 0.22, "sorted": 0.32, "sorted-partial": 0.25, "rhyme": 0.22, "sorted+rhyme": 0.3}
    runs = [curve_run(m, s, finals[m][s], halves[m]) for _, m, s in parity_plan("kk")]
    write_json(tmp_path / "parity_kk.json", {"target": 0.3, "runs": runs})
    ctx = Context(device="cpu", quick=False, model=None, work_dir=tmp_path, progress=lambda _: None)
    out = accuracy(ctx)  # would train for hours if it did not resume
    m = out.measured
    assert m["samples"] == 768
    assert m["accuracy.baseline"] == pytest.approx(0.34)
    assert m["worst_accuracy_gap"] == pytest.approx(0.02)  # sorted+rhyme 0.36 vs 0.34
    # baseline (0.10, 0.22 at 384, final at 768) crosses the target after 384 samples; sorted (0.10, 0.32
    # at 384) before
    target = Workload.target
    assert 0.22 < target < min(finals["baseline"]) and target < 0.32
    base = [384 + (target - 0.22) / (f - 0.22) * 384 for f in finals["baseline"]]
    mine = 384 * (target - 0.10) / 0.22
    assert m["sorted_fewer_samples_share"] == pytest.approx(1 - mine / (sum(base) / 3))
    assert m["accuracy_gap_se"] < 0.03
    assert m["rollout_tokens.baseline"] == pytest.approx(1001)
    assert m["rollout_tokens.sorted"] == pytest.approx(2001)
    assert sorted(out.seeds) == [0, 1, 2] and len(out.data["curves"]) == 11
    assert Workload.for_context(ctx).task == "kk"
