"""Learning curves (rlbench.reproduce.curves): accuracy at equal samples, samples to a target, the
benchmark's parity table, and a budgeted run that resumes after a kill."""

from __future__ import annotations

import pytest

from benchmarks import learning_curves as lc
from reference_trainer.trace.records import read_jsonl
from rlbench.reproduce.curves import accuracy_at, run_curve, samples_to_reach

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


class _Killed(Exception):
    pass


# A small embedded-model run: 4 steps, checkpoints every 2, held-out evaluation at steps 0 and 2.
TINY = {"task": "arith", "mode": "baseline", "seed": 0, "steps": 4, "prompts_per_step": 2,
        "group_size": 2, "max_tokens": 24, "eval_every": 2, "eval_problems": 4, "eval_samples": 1,
        "checkpoint_every": 2}  # fmt: skip
NO_CLOCK = ("train_s", "wall_s")


@pytest.mark.e2e
def test_a_killed_curve_resumes_to_the_run_it_would_have_been(tmp_path):
    whole = run_curve(tmp_path / "whole", progress=lambda line: None, **TINY)

    def kill_after_step_2(line: str) -> None:  # logged, not checkpointed: the resume re-runs it, logs it once
        if " step   2 " in line:
            raise _Killed

    with pytest.raises(_Killed):
        run_curve(tmp_path / "cut", progress=kill_after_step_2, **TINY)
    lines: list[str] = []
    resumed = run_curve(tmp_path / "cut", progress=lines.append, **TINY)
    assert lines[0] == "arith baseline s0: resuming at step 2" + lines[0].split("step 2")[1]
    assert {k: v for k, v in resumed.items() if k not in NO_CLOCK} == {
        k: v for k, v in whole.items() if k not in NO_CLOCK
    }
    assert [r["step"] for r in read_jsonl(tmp_path / "cut" / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.e2e
def test_a_spent_budget_survives_the_resume(tmp_path):
    options = {**TINY, "checkpoint_every": 1}
    first = run_curve(tmp_path, minutes=1e-9, progress=lambda line: None, **options)
    assert first["steps"] == 1 and first["train_s"] > 0  # the first step spends the budget
    (tmp_path / "heldout.json").unlink()  # as if killed during the final evaluation
    lines: list[str] = []
    again = run_curve(tmp_path, minutes=1e-9, progress=lines.append, **options)
    assert again["steps"] == 1 and again["curve"] == first["curve"]
    assert len(lines) == 1 and "resuming at step 1" in lines[0]  # no step trained after the budget
