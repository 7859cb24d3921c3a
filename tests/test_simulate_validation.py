"""Validation on a real run: replaying a small baseline run's lengths on the simulator gives the run's own
work, counted in the trace: its engine forwards and slot-steps, step by step, on one worker and on two.
Counts, not timings: they do not depend on the machine's load (the bubble and rollout time the replay
also reports are a benchmark's to compare: docs/simulate.md)."""

from __future__ import annotations

import math

import pytest
from conftest import write_tiny_char_model

from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer
from rlbench.simulate.replay import validate

pytestmark = pytest.mark.e2e  # a whole training run, then the replay


def baseline_run(tmp_path_factory, workers: int, slots: int, prompts: int) -> dict:
    """`validate` of a 2-step baseline run: groups of 4 random-model (geometric, capped) lengths, more
    sequences than slots, so the replay must get admission, refills and the tail right."""
    model = write_tiny_char_model(tmp_path_factory.mktemp("model"))
    out = tmp_path_factory.mktemp("run")
    train = TrainConfig(task="arith", steps=2, model=str(model), prompts_per_step=prompts, group_size=4,
                        eval_every=0, max_tokens=64, max_num_seqs=slots, max_model_len=256,
                        checkpoint_every=100, workers=workers, worker_backend="local")  # fmt: skip
    train.grpo.micro_batch_size = 8
    trainer = Trainer(train, out)
    try:
        trainer.run()
    finally:
        trainer.close()
    return validate(out)


def assert_same_work(doc: dict) -> None:
    for row in doc["steps"]:
        assert row["simulated_forwards"] == row["measured_forwards"], row
        assert row["simulated_slot_steps"] == row["measured_slot_steps"], row
    assert doc["simulated_forwards"] == doc["measured_forwards"] > 0
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


def test_replay_reproduces_the_measured_work_on_two_workers(tmp_path_factory):
    """Round-robin over two workers of 4 slots (in-process: the work does not depend on where they run;
    tests/test_multiworker.py runs real Ray actors and checks they give the in-process pool's samples)."""
    doc = baseline_run(tmp_path_factory, workers=2, slots=4, prompts=4)  # 16 sequences on 2 x 4 slots
    assert doc["workers"] == 2 and doc["capacity"] == 4 and len(doc["steps"]) == 2
    assert_same_work(doc)
