"""Validation on a real run: replaying a small baseline run on a cost model calibrated from that run
reproduces its measured bubble ratio (rlbench.metrics) within a few points."""

from __future__ import annotations

import pytest
import torch

from reference_trainer.config import ModelConfig
from reference_trainer.loader import save_model
from reference_trainer.model import DecoderLM
from reference_trainer.tokenizer import CharTokenizer
from reference_trainer.trainer import TrainConfig, Trainer
from rlbench.simulate.replay import validate


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    torch.manual_seed(0)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = ModelConfig(vocab_size=99, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, **shape)
    model = tmp_path_factory.mktemp("model")
    save_model(DecoderLM(config), model)
    CharTokenizer().save(model)
    out = tmp_path_factory.mktemp("run")
    # 24 sequences on 8 slots with random-model (geometric, capped) lengths: queueing and a tail
    train = TrainConfig(task="arith", steps=2, model=str(model), prompts_per_step=6, group_size=4,
                        max_tokens=96, max_num_seqs=8, max_model_len=256, checkpoint_every=100)  # fmt: skip
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
