"""Validation on a real run: replaying a small baseline run's lengths on the simulator gives the run's own
work, counted in the trace: its engine forwards (per engine) and slot-steps, step by step, on one worker and
on two under two dispatch policies; a trace the simulator does not reproduce is said not to hold.
Counts, not timings: they do not depend on the machine's load (the bubble and rollout time the replay
also reports are a benchmark's to compare: docs/simulate.md)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import small_arith_run

from rlbench.simulate.modes import dispatch_option
from rlbench.simulate.replay import validate

pytestmark = pytest.mark.e2e  # a whole training run, then the replay
# The baseline's dispatch option and two of its policies: round-robin and a count-based least-loaded one.
KEY, POLICIES = dispatch_option("baseline")  # type: ignore[misc]


def baseline_run(
    tmp_path_factory, workers: int, slots: int, prompts: int, placement: str | None = None
) -> dict:
    """`validate` of a 2-step baseline run: groups of 4 random-model (geometric, capped) lengths, more
    sequences than slots, so the replay must get admission, refills and the tail right."""
    options = {KEY: placement} if placement else {}
    run = small_arith_run(
        tmp_path_factory,
        steps=2,
        prompts_per_step=prompts,
        max_num_seqs=slots,
        workers=workers,
        mode_options=options,
    )
    return validate(run)


def assert_same_work(doc: dict) -> None:
    for row in doc["steps"]:
        assert row["simulated_forwards"] == row["measured_forwards"], row
        assert row["simulated_slot_steps"] == row["measured_slot_steps"], row
        assert row["simulated_engine_forwards"] == row["measured_engine_forwards"], row
    assert doc["simulated_forwards"] == doc["measured_forwards"] > 0
    assert doc["verdict"]["forwards_equal"], doc["verdict"]
    assert doc["simulated_slot_steps"] == doc["measured_slot_steps"]
    # the workload has a tail: forwards with empty slots, which a replay of full batches would not count
    idle = 1 - doc["measured_slot_steps"] / (doc["capacity"] * doc["measured_forwards"])
    assert idle > 0.05, idle
    # the timings are reported beside the work (a benchmark compares them)
    assert all(math.isfinite(doc[k]) for k in ("measured_bubble", "simulated_bubble", "simulated_rollout_s"))


def test_replay_reproduces_the_measured_work(tmp_path_factory):
    doc = baseline_run(tmp_path_factory, workers=1, slots=8, prompts=6)  # 24 sequences on 8 slots
    assert doc["workers"] == 1 and doc["capacity"] == 8 and len(doc["steps"]) == 2
    assert_same_work(doc)


@pytest.mark.parametrize("placement", POLICIES[:2])
def test_replay_reproduces_the_measured_work_on_two_workers(tmp_path_factory, placement):
    """Two workers of 4 slots (in-process: the work does not depend on where they run;
    tests/test_multiworker.py runs real Ray actors and checks they give the in-process pool's samples), each
    run replayed under its own dispatch (train_config.json); a trace with one forward fewer on engine 1 than
    the engine ran is a disagreement the verdict names."""
    doc = baseline_run(tmp_path_factory, workers=2, slots=4, prompts=4, placement=placement)  # 16 on 2 x 4
    assert doc["workers"] == 2 and doc["capacity"] == 4 and len(doc["steps"]) == 2
    assert doc["dispatch"] == placement
    assert_same_work(doc)
    assert all(n > 0 for n in doc["measured_engine_forwards"]), doc["measured_engine_forwards"]
    run = tmp_path_factory.mktemp("altered")
    shutil.copy(f"{doc['run']}/train_config.json", run)
    events = [json.loads(line) for line in Path(doc["run"], "trace.jsonl").read_text().splitlines()]
    last = max(i for i, e in enumerate(events) if e.get("kind") == "decode" and e.get("worker") == 1)
    with open(run / "trace.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for i, e in enumerate(events) if i != last)
    altered = validate(run)
    assert not altered["verdict"]["holds"] and not altered["verdict"]["forwards_equal"]
    assert altered["measured_engine_forwards"][1] == doc["measured_engine_forwards"][1] - 1
    assert "forwards per engine differ" in altered["verdict"]["text"]
