"""sortedrl-multi-engine's arithmetic on synthetic rows: the best policy per (mode, W), sorted's gain and its
growth, the CPU table's ratios to the baseline in the same seed, and the verdict the spec's rule gives:
reproduced, not reproduced, or inconclusive without a measured W = 2 run of sorted."""

from __future__ import annotations

import pytest

from rlbench.reproduce.multi_engine import answer, cpu_table, entries, summarize
from rlbench.reproduce.spec import load_specs


def sim_rows(gain8: float, gain4096: float) -> list[dict]:
    """Baseline under two policies (least-x the faster) and sorted, at W = 8 and 4096."""
    rows = []
    for w, gain in ((8, gain8), (4096, gain4096)):
        for policy, t in (("round-robin", 1.2), ("least-x", 1.0)):
            rows.append({"workers": w, "mode": "baseline", "policy": policy, "step_time_s": t,
                         "rollout_s": t / 2, "bubble_ratio": 0.5})  # fmt: skip
        rows.append({"workers": w, "mode": "sorted", "policy": "default", "step_time_s": 1.0 / gain,
                     "rollout_s": 0.5 / gain, "bubble_ratio": 0.1})  # fmt: skip
    return rows


def test_the_gain_is_each_mode_under_its_best_policy():
    ans = answer(sim_rows(1.1, 1.5))
    assert ans["best_policy"] == {
        "baseline": {8: "least-x", 4096: "least-x"},
        "sorted": {8: "default", 4096: "default"},
    }
    assert ans["sorted_gain"] == {8: pytest.approx(1.1), 4096: pytest.approx(1.5)}
    assert ans["sorted_gain_growth"] == pytest.approx(0.4) and ans["sorted_gain_grows"]
    assert not answer(sim_rows(1.5, 1.1))["sorted_gain_grows"]


def cpu(bubbles: dict[str, float]) -> dict:
    return {"runs": {f"{m}:round-robin:s0": {"bubble_ratio": b} for m, b in bubbles.items()},
            "skipped_modes": [m for m in ("baseline", "sorted") if m not in bubbles]}  # fmt: skip


@pytest.mark.parametrize(
    "gains, bubbles, verdict",
    [
        ((1.1, 1.5), {"baseline": 0.6, "sorted": 0.1}, "reproduced"),
        ((1.5, 1.1), {"baseline": 0.6, "sorted": 0.1}, "not reproduced"),
        ((1.1, 1.5), {"baseline": 0.1, "sorted": 0.6}, "not reproduced"),
        ((1.1, 1.5), {}, "inconclusive"),  # no W = 2 run measured (a mode on one engine only)
    ],
)
def test_the_verdict_reads_the_simulated_growth_and_the_measured_ordering(gains, bubbles, verdict):
    rows = sim_rows(*gains)
    m = summarize({"rows": rows, "answer": answer(rows)}, cpu(bubbles))
    assert m["sim.baseline_bubble.min_w"] == 0.5 and m["sim.best_policy.baseline.w4096"] == "least-x"
    assert load_specs()["sortedrl-multi-engine"].verdict(m)[0] == verdict
    assert ("sorted not run" in m["headline"]) == (not bubbles)


def test_the_cpu_table_pairs_each_seed_with_the_baseline_of_the_same_seed():
    runs = {}
    for seed, base in (("s0", 2.0), ("s1", 4.0)):
        runs[f"baseline:round-robin:{seed}"] = {
            "step_time_s": base,
            "bubble_ratio": 0.5,
            "cross_engine_idle": 0.2,
        }
        runs[f"baseline:least-x:{seed}"] = {
            "step_time_s": base * 0.9,
            "bubble_ratio": 0.4,
            "cross_engine_idle": 0.1,
        }
    rows = {(r["mode"], r["policy"]): r for r in cpu_table(runs)}
    least = rows["baseline", "least-x"]
    assert least["vs_baseline_rr"] == pytest.approx(0.9) and least["vs_baseline_rr_range"] == pytest.approx(
        [0.9, 0.9]
    )
    assert least["step_time_s"] == pytest.approx(2.7) and least["step_time_range"] == pytest.approx(
        [1.8, 3.6]
    )
    assert rows["baseline", "round-robin"]["vs_baseline_rr"] == pytest.approx(1.0) and least["seeds"] == 2


def test_the_cpu_runs_take_the_policies_asked_that_the_mode_takes():
    assert [e[1] for e in entries("baseline", ("round-robin", "no-such-policy"))] == ["round-robin"]
    assert entries("baseline")[0][1] == "round-robin"  # the mode's default first
