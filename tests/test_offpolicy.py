"""Truncated importance sampling (TIS) in GRPOUpdater.prepare, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.train.config import GRPOConfig
from reference_trainer.train.grpo import GRPOUpdater, RolloutBatch
from reference_trainer.train.grpo_loss import tis_weights, token_logprobs


def test_tis_weights_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3]]))
    sampling = torch.log(torch.tensor([[0.25, 0.4, 0.1, 0.3]])).double()
    sampling[0, 3] = math.nan  # unknown sampling log-prob: no correction possible, weight 1
    mask = torch.tensor([[True, True, True, True]])
    # ratios 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.1 = 9 -> capped at 2, NaN -> 1
    assert tis_weights(old, sampling, 2.0, mask).tolist()[0] == pytest.approx([2.0, 0.5, 2.0, 1.0])
    assert tis_weights(old, sampling, 10.0, mask).tolist()[0] == pytest.approx([2.0, 0.5, 9.0, 1.0])
    pad = torch.tensor([[True, False, True, False]])
    assert tis_weights(old, sampling, 2.0, pad).tolist()[0] == pytest.approx([2.0, 1.0, 2.0, 1.0])
    with pytest.raises(ValueError):
        tis_weights(old, sampling, 0.0, mask)


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=17,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    return DecoderLM(config)


def make_batch(model, ratios: list[list[float]]) -> tuple[RolloutBatch, list[list[float]]]:
    """Two prompts x 2 samples; sampling log-probs set so pi_old / pi_sampling equals `ratios` exactly."""
    prompts = [[1, 3], [1, 3], [1, 4, 5], [1, 4, 5]]
    responses = [[6, 7, 8], [9, 2], [10, 11], [12]]
    exact = []
    for p, r in zip(prompts, responses, strict=True):
        ids = torch.tensor([p + r])
        lp = token_logprobs(model, ids, torch.tensor([len(p)]), torch.tensor([len(r)]))
        exact.append(lp[0].tolist())
    pairs = zip(exact, ratios, strict=True)
    sampling = [[lp - math.log(q) for lp, q in zip(row, rr, strict=True)] for row, rr in pairs]
    return RolloutBatch(prompts, responses, [1.0, 0.0, 0.0, 1.0], 2, old_logprobs=sampling), exact


RATIOS = [[1.0, 0.5, 3.0], [1.5, 0.1], [2.5, 1.0], [0.25]]


def test_prepare_fills_is_weights_with_truncated_ratios(model):
    batch, _ = make_batch(model, RATIOS)
    updater = GRPOUpdater(model, GRPOConfig(tis_cap=2.0, micro_batch_size=3))
    mbs = updater.prepare(batch)
    got = []
    for mb, lo in zip(mbs, (0, 3), strict=True):
        for j, row in enumerate(mb.is_weights):
            got.append(row[: len(batch.response_ids[lo + j])].tolist())
    expected = [[min(q, 2.0) for q in row] for row in RATIOS]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, rel=1e-5)
    # a weight the rollout already carried is multiplied in, not replaced
    batch.is_weights = [[0.5] * len(r) for r in batch.response_ids]
    again = updater.prepare(batch)
    assert again[0].is_weights[0, :3].tolist() == pytest.approx([0.5, 0.25, 1.0], rel=1e-5)


def test_loss_uses_the_truncated_weights(model):
    """First PPO epoch: the policy equals pi_old, so ratio = 1 and the token-mean loss is
    -sum_i A_i * sum_t w_it / (number of tokens): with rewards (1,0 | 0,1), A = (0.5,-0.5 | -0.5,0.5)."""
    batch, _ = make_batch(model, RATIOS)
    updater = GRPOUpdater(model, GRPOConfig(tis_cap=2.0, micro_batch_size=8))
    stats = updater.compute_gradients(updater.prepare(batch))
    w = [[min(q, 2.0) for q in row] for row in RATIOS]
    adv = [0.5, -0.5, -0.5, 0.5]
    expected = -sum(a * sum(row) for a, row in zip(adv, w, strict=True)) / 8
    assert stats["loss"] == pytest.approx(expected, rel=1e-5)


def test_on_policy_tokens_make_tis_a_no_op(model):
    batch, exact = make_batch(model, [[1.0] * len(r) for r in RATIOS])
    batch.old_logprobs = exact
    with_tis = GRPOUpdater(model, GRPOConfig(tis_cap=2.0, micro_batch_size=8))
    plain = GRPOUpdater(model, GRPOConfig(micro_batch_size=8))
    assert with_tis.compute_gradients(with_tis.prepare(batch))["loss"] == pytest.approx(
        plain.compute_gradients(plain.prepare(batch))["loss"], rel=1e-6
    )


def test_update_reports_tis_stats_and_needs_sampling_logprobs(model):
    batch, _ = make_batch(model, RATIOS)
    stats = GRPOUpdater(model, GRPOConfig(tis_cap=2.0, lr=1e-3)).update(batch)
    weights = [min(q, 2.0) for row in RATIOS for q in row]
    assert stats["tis_weight_mean"] == pytest.approx(sum(weights) / len(weights), rel=1e-5)
    assert stats["tis_clip_frac"] == pytest.approx(2 / 8)  # 3.0 and 2.5 of 8 tokens hit the cap
    batch.old_logprobs = None
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOUpdater(model, GRPOConfig(tis_cap=2.0)).prepare(batch)


def test_modes_set_the_cap_and_the_config_overrides_it(tmp_path):
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer
    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    config = ModelConfig(
        vocab_size=99,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    save_model(DecoderLM(config), tmp_path / "m")
    CharTokenizer().save(tmp_path / "m")

    def cap(mode: str, **grpo) -> float | None:
        cfg = TrainConfig(eval_every=0, mode=mode, model=str(tmp_path / "m"), max_model_len=128)
        for k, v in grpo.items():
            setattr(cfg.grpo, k, v)
        return Trainer(cfg, tmp_path / mode).updater.config.tis_cap

    assert cap("baseline") is None and cap("sorted") is None
    assert cap("sorted-partial") == 2.0 and cap("sorted-partial", tis_cap=5.0) == 5.0
