"""Validation on a real run: replaying a small baseline run on a cost model calibrated from that run
reproduces its measured bubble ratio (reference_trainer.trace.metrics) within a few points."""

from __future__ import annotations

import pytest
import torch
from conftest import write_tiny_char_model

from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer
from rlbench.simulate.replay import validate

pytestmark = pytest.mark.e2e  # whole commands in processes of their own


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model = write_tiny_char_model(tmp_path_factory.mktemp("model"))
    out = tmp_path_factory.mktemp("run")
    # 24 sequences on 8 slots with random-model (geometric, capped) lengths: queueing and a tail
    train = TrainConfig(task="arith", steps=2, model=str(model), prompts_per_step=6, group_size=4,
                        eval_every=0, max_tokens=96, max_num_seqs=8, max_model_len=256,
                        checkpoint_every=100)  # fmt: skip
    train.grpo.micro_batch_size = 8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: a shared 2-core machine stalls multi-threaded forwards at random
    try:
        Trainer(train, out).run()
    finally:
        torch.set_num_threads(threads)
    return out


def test_replay_reproduces_measured_bubble(run_dir):
    doc = validate(run_dir)
    assert doc["capacity"] == 8 and len(doc["steps"]) == 2
    assert 0.05 < doc["measured_bubble"] < 0.95
    assert doc["simulated_bubble"] == pytest.approx(doc["measured_bubble"], abs=0.05)
    assert doc["simulated_rollout_s"] == pytest.approx(doc["measured_rollout_s"], rel=0.3)


@pytest.fixture(scope="module")
def two_worker_run_dir(tmp_path_factory):
    """Round-robin over two real Ray actors (4 slots each): 4 steps of 32 sequences, enough rollout time
    that slice-to-slice jitter on a shared 2-core machine averages out."""
    ray = pytest.importorskip("ray")
    import os
    import tempfile

    model = write_tiny_char_model(tmp_path_factory.mktemp("model2"))
    out = tmp_path_factory.mktemp("run2")
    train = TrainConfig(task="arith", steps=4, model=str(model), prompts_per_step=8, group_size=4,
                        eval_every=0, max_tokens=128, max_num_seqs=4, max_model_len=256, checkpoint_every=100,
                        workers=2)  # fmt: skip
    train.grpo.micro_batch_size = 8
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RLBENCH_RAY_TMPDIR")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RLBENCH_RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    trainer = Trainer(train, out)
    try:
        trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return out


def test_replay_reproduces_measured_bubble_on_two_workers(two_worker_run_dir):
    doc = validate(two_worker_run_dir)
    assert doc["workers"] == 2 and doc["capacity"] == 4 and len(doc["steps"]) == 4
    assert 0.05 < doc["measured_bubble"] < 0.95
    assert doc["simulated_bubble"] == pytest.approx(doc["measured_bubble"], abs=0.05)
    assert doc["simulated_rollout_s"] == pytest.approx(doc["measured_rollout_s"], rel=0.3)
