"""The what-if's best dispatch policy: the policy with the least simulated step time at the log's largest
worker count, against round-robin, with every policy's figures; nothing to choose on one engine."""

from __future__ import annotations

import pytest

from rlbench.simulate.cost import preset
from rlbench.simulate.modes import dispatch_entries, dispatch_option
from rlbench.simulate.whatif import best_dispatch, whatif
from rlbench.simulate.workload import synthetic


@pytest.fixture(scope="module")
def trace():
    return synthetic(steps=2, prompts=8, group_size=4, mean_tokens=200.0, sigma=1.2, max_tokens=2000, seed=3)


def test_the_best_policy_has_the_least_step_time(trace):
    doc = best_dispatch(trace, preset("h200", "embedded"), 8, workers=4, steps=2, groups_per_worker=2)
    assert doc["available"] and doc["workers"] == 4
    key, policies = dispatch_option("baseline")
    assert [r["policy"] for r in doc["policies"]] == [
        e.split("=", 1)[1] for e in dispatch_entries("baseline")
    ]
    assert set(policies) == {r["policy"] for r in doc["policies"]} and len(policies) >= 2
    times = {r["policy"]: r["step_time_s"] for r in doc["policies"]}
    assert doc["best"] == min(times, key=times.get)
    assert doc["best_speedup"] == pytest.approx(times["round-robin"] / times[doc["best"]])
    assert doc["best_speedup"] >= 1.0 and doc["best"] in doc["line"] and "round-robin" in doc["line"]


def test_one_engine_has_nothing_to_dispatch_and_the_whatif_says_so(trace):
    doc = whatif(trace, 8, [1], ["baseline"], gpu="h200", model_size="embedded", steps=1)
    assert doc["best_dispatch"] == {
        "available": False,
        "reason": "one engine: nothing to dispatch",
        "workers": 1,
    }
    doc = whatif(trace, 8, [1, 2], ["baseline"], gpu="h200", model_size="embedded", steps=1)
    assert doc["best_dispatch"]["available"] and doc["best_dispatch"]["workers"] == 2


def test_the_modes_default_policy_comes_first():
    first = dispatch_entries("baseline")[0]
    assert first.endswith("=round-robin")  # the mode's default first: the what-if's reference
