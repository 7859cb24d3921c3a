"""Learning-curve arithmetic (rlbench.reproduce.curves): accuracy at equal samples, samples to a target, and
the benchmark's parity table."""

from __future__ import annotations

import pytest

from benchmarks import learning_curves as lc
from rlbench.reproduce.curves import accuracy_at, samples_to_reach

CURVE = [
    {"step": 0, "samples": 0, "greedy_acc": 0.2, "pass1": 0.1},
    {"step": 10, "samples": 1000, "greedy_acc": 0.4, "pass1": 0.3},
    {"step": 20, "samples": 2000, "greedy_acc": 0.5, "pass1": 0.4},
]


def test_accuracy_at_interpolates_between_evaluations():
    assert accuracy_at(CURVE, 0) == 0.2
    assert accuracy_at(CURVE, 500) == pytest.approx(0.3)
    assert accuracy_at(CURVE, 1500) == pytest.approx(0.45)
    assert accuracy_at(CURVE, 5000) == 0.5  # past the end: the last evaluation


def test_samples_to_reach_interpolates_to_the_first_crossing_of_the_target():
    assert samples_to_reach(CURVE, 0.2) == 0.0  # already there before training
    assert samples_to_reach(CURVE, 0.4) == pytest.approx(1000)
    assert samples_to_reach(CURVE, 0.3) == pytest.approx(500)
    assert samples_to_reach(CURVE, 0.45) == pytest.approx(1500)
    assert samples_to_reach(CURVE, 0.9) is None
    dip = [
        *CURVE[:2],
        {"step": 20, "samples": 2000, "greedy_acc": 0.1},
        {"step": 30, "samples": 3000, "greedy_acc": 0.5},
    ]
    assert samples_to_reach(dip, 0.4) == pytest.approx(1000)  # the first crossing, not the last


def test_the_parity_table_compares_modes_at_the_samples_every_run_reached():
    def run(mode, seed, final_samples, acc, tokens=None):
        curve = [{"step": 0, "samples": 0, "greedy_acc": 0.2, "pass1": 0.1},
                 {"step": 9, "samples": final_samples, "greedy_acc": acc, "pass1": acc}]  # fmt: skip
        return {"task": "kk", "mode": mode, "seed": seed, "steps": 9, "samples": final_samples,
                "wall_s": 60.0, "held_out_greedy_accuracy": {"before": 0.2, "after": acc},
                "curve": curve, **({"rollout_tokens": tokens} if tokens else {})}  # fmt: skip

    runs = [run("baseline", 0, 1000, 0.6), run("baseline", 1, 1000, 0.4), run("sorted", 0, 2000, 0.8)]
    table = lc.summarise(runs, target=0.5)
    assert "kk parity at 1000 samples" in table  # every task with two or more modes gets a table
    # baseline seed 0 crosses 0.5 at 750 samples; seed 1 never does, so no ratio against baseline
    assert "| baseline | 2 | 0.500 ± 0.141 | +0.000 | 750 (1/2 reached) |  |" in table
    # sorted reached 0.8 at 2000 samples; at 1000 it is halfway between 0.2 and 0.8; 0.5 at 1000; no
    # rollout tokens saved with these curves, so that column stays empty
    assert "| sorted | 1 | 0.500 ± 0.000 | +0.000 | 1000 (1/1 reached) |  |  |" in table
    both = [run("baseline", 0, 1000, 0.6, tokens=40_000), run("sorted", 0, 1000, 0.8, tokens=100_000)]
    table = lc.summarise(both, target=0.5)
    rows = table.splitlines()
    baseline = "| baseline | 1 | 0.600 ± 0.000 | +0.000 | 750 (1/1 reached) | 0.0% fewer | 40,000 (1.00x) |"
    assert baseline in rows
    sorted_ = "| sorted | 1 | 0.800 ± 0.000 | +0.200 | 500 (1/1 reached) | 33.3% fewer | 100,000 (2.50x) |"
    assert sorted_ in rows
