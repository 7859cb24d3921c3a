"""The simulator's async model (rlbench/simulate/pipeline.py): rollout and trainer as two pools, the steps
pipelined under the staleness bound; the what-if's update at a log's own cost."""

from __future__ import annotations

import pytest

from rlbench.simulate import simulate, workload
from rlbench.simulate.cost import preset
from rlbench.simulate.pipeline import pipeline, trainer_splits
from rlbench.simulate.whatif import LoggedUpdate, logged_update_cost, whatif


def test_the_pipeline_by_hand():
    """Rollouts of 2 s, updates of 3 s. k = 0: 5 s steps. k = 1: rollout 1 runs beside update 0 (on version
    0), rollout 2 waits 1 s for update 0's weights; the trainer waits only for the first rollout."""
    same = pipeline([2.0] * 3, [3.0] * 3, 0)
    assert same["step_time_s"] == [5.0, 5.0, 5.0] and same["trainer_wait_s"] == [2.0, 2.0, 2.0]
    ahead = pipeline([2.0] * 3, [3.0] * 3, 1)
    assert ahead["step_time_s"] == [5.0, 3.0, 3.0]
    assert ahead["trainer_wait_s"] == [2.0, 0.0, 0.0] and ahead["rollout_wait_s"] == [0.0, 0.0, 1.0]
    # a trainer-bound run gains nothing from more staleness; a rollout-bound one is paced by its rollout
    assert pipeline([2.0] * 3, [3.0] * 3, 2)["step_time_s"] == ahead["step_time_s"]
    assert pipeline([4.0] * 3, [1.0] * 3, 1)["step_time_s"] == [5.0, 4.0, 4.0]


def test_trainer_splits_try_the_balanced_share_a_quarter_and_a_half():
    assert trainer_splits(8, 3.0, 1.0) == [2, 4]
    assert trainer_splits(64, 99.0, 1.0) == [1, 16, 32]
    assert trainer_splits(2, 1.0, 1.0) == [1]


def test_async_splits_the_same_devices_and_is_not_modelled_on_one():
    trace = workload.synthetic(steps=3, prompts=16, group_size=4, mean_tokens=500.0, sigma=0.8,
                               max_tokens=4096, rank_corr=0.8, overlap=0.8, seed=0)  # fmt: skip
    doc = simulate(trace, preset("h100", "7b"), [1, 4], ["baseline", "async", "async:max_staleness=0"], 64)
    results = {(r["policy"], r["workers"]): r for r in doc["results"]}
    assert ("async", 1) not in results
    assert {(n["mode"], n["workers"]) for n in doc["not_modelled"]} == {
        ("async", 1),
        ("async:max_staleness=0", 1),
    }
    ahead, same = results[("async", 4)], results[("async:max_staleness=0", 4)]
    assert 1 <= ahead["trainer_workers"] <= 3 and ahead["rollout_workers"] == 4 - ahead["trainer_workers"]
    for step in same["steps"]:  # k = 0: rollout then update, on the split pools
        assert step["step_time_s"] == pytest.approx(step["rollout_s"] + step["update_s"])
    assert ahead["step_time_s"] <= same["step_time_s"] + 1e-9  # overlap never slows the same split down


def test_a_logs_update_cost_replaces_the_presets():
    events = [
        {"kind": "update", "step": 0, "t_start": 0.0, "t_end": 2.0},
        {"kind": "update", "step": 1, "t_start": 5.0, "t_end": 5.0},  # untimed: left out
        {"kind": "sequence", "step": 0, "status": "finished", "prompt_tokens": 10, "response_tokens": 90},
        {"kind": "sequence", "step": 0, "status": "aborted", "prompt_tokens": 10, "response_tokens": 900},
        {"kind": "sequence", "step": 1, "status": "finished", "prompt_tokens": 10, "response_tokens": 90},
    ]
    assert logged_update_cost(events) == pytest.approx(2.0 / 100)
    assert logged_update_cost([e for e in events if e["kind"] == "sequence"]) is None
    cost = LoggedUpdate(preset("h100", "7b"), 0.02)
    assert cost.update(1000.0, 4) == pytest.approx(5.0)
    trace = workload.synthetic(steps=2, prompts=8, group_size=2, mean_tokens=200.0, sigma=0.5,
                               max_tokens=1024, rank_corr=0.8, overlap=0.8, seed=1)  # fmt: skip
    doc = whatif(trace, 32, [1, 2], ["baseline", "async"], update_s_per_token=0.02)
    assert "the log's 20 s per 1,000 trained tokens" in doc["cost_model"]
    assert [(n["mode"], n["workers"]) for n in doc["not_modelled"]] == [("async", 1)]
