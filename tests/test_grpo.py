"""GRPO math against hand-computed values, and the updater on a tiny stand-in causal model."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_trainer.train.config import GRPOConfig
from reference_trainer.train.grpo import GRPOUpdater, RolloutBatch
from reference_trainer.train.grpo_loss import group_advantages, k3_kl, policy_loss, token_logprobs

VOCAB = 11


class TinyLM(nn.Module):
    """Embedding + GRU + head: causal by construction, so right padding cannot leak backwards."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(input_ids))[0])


def make_model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM().double()  # float64 so accumulation-order differences stay far below tolerances


def make_batch(rewards: list[float], group_size: int, seed: int = 0) -> RolloutBatch:
    rng = random.Random(seed)
    n = len(rewards)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 5))] for _ in range(n)]
    responses = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 9))] for _ in range(n)]
    return RolloutBatch(prompts, responses, rewards, group_size)


def seq_token_logprobs(model: nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Log-probs of one unpadded sequence's response tokens."""
    lens = torch.tensor([len(prompt)]), torch.tensor([len(response)])
    return token_logprobs(model, torch.tensor([prompt + response]), *lens)[0]


def grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


# --- advantages -------------------------------------------------------------------------------------


def test_group_advantages_by_hand() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    adv = group_advantages(r, group_size=4)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 1.0, -1.0, 0, 0]))
    scaled = group_advantages(r, group_size=4, scale_std=True)
    s1 = math.sqrt(1 / 3)  # sample std of [1, 0, 0, 1]
    s3 = math.sqrt(2 / 3)  # sample std of [3, 1, 2, 2]
    expected = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0, 0, 0, 0, 1 / s3, -1 / s3, 0, 0]
    assert torch.allclose(scaled, torch.tensor(expected), atol=1e-5)
    assert torch.equal(group_advantages(torch.tensor([1, 0, 1, 1]), 2), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    with pytest.raises(ValueError):
        group_advantages(r, group_size=5)


# --- policy loss ------------------------------------------------------------------------------------


def _three_token_case(adv: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    ratios = torch.tensor([[1.1, 1.5, 0.5]], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    loss, stats = policy_loss(
        logp,
        torch.zeros_like(logp),
        torch.tensor([adv], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.bool),
        clip_low=0.2,
        clip_high=clip_high,
    )
    loss.backward()
    return loss.detach(), logp.grad, stats


def test_clipped_surrogate_by_hand() -> None:
    # A = +1: min(r, clip(r)) = [1.1, min(1.5, 1.3), min(0.5, 0.8)] = [1.1, 1.3, 0.5]; the clipped middle
    # token has no gradient, the others have d(-r/3)/dlogp = -r/3.
    loss, grad, stats = _three_token_case(+1.0, clip_high=0.3)
    assert loss.item() == pytest.approx(-(1.1 + 1.3 + 0.5) / 3)
    assert torch.allclose(grad, torch.tensor([[-1.1 / 3, 0.0, -0.5 / 3]], dtype=torch.float64))
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5) / 3)
    # A = -1: min(-r, -clip(r)) = [-1.1, -1.5, min(-0.5, -0.8)]: now the low-side token is clipped.
    loss, grad, stats = _three_token_case(-1.0, clip_high=0.3)
    assert loss.item() == pytest.approx((1.1 + 1.5 + 0.8) / 3)
    assert torch.allclose(grad, torch.tensor([[1.1 / 3, 1.5 / 3, 0.0]], dtype=torch.float64))
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    # Symmetric 0.2 clips the high token at 1.2 instead of 1.3 (clip-higher is asymmetric).
    loss, _, _ = _three_token_case(+1.0, clip_high=0.2)
    assert loss.item() == pytest.approx(-(1.1 + 1.2 + 0.5) / 3)


def test_token_mean_vs_seq_mean() -> None:
    # Lengths 1 and 3, ratio 1, per-sequence advantages 2 and 1, so per-token losses are -2 | -1 -1 -1.
    logp = torch.tensor([[-1.0, 5.0, 5.0], [-2.0, -0.5, -1.5]])  # the 5.0s are padding and must not count
    mask = torch.tensor([[True, False, False], [True, True, True]])
    adv = torch.tensor([2.0, 1.0])
    tok, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="token-mean")
    seq, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="seq-mean")
    assert tok.item() == pytest.approx(-(2 + 3 * 1) / 4)
    assert seq.item() == pytest.approx(-(2 / 1 + 3 / 3) / 2)
    # Explicit denominators (micro-batching) replace the local counts.
    tok10, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="token-mean", num_tokens=10)
    seq4, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="seq-mean", num_seqs=4)
    assert tok10.item() == pytest.approx(-5 / 10) and seq4.item() == pytest.approx(-3 / 4)
    with pytest.raises(ValueError):
        policy_loss(logp, logp, adv, mask, aggregation="sum")  # type: ignore[arg-type]


def test_k3_kl_and_is_weights_by_hand() -> None:
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    # d = ref - logp = log(0.5): exp(d) - d - 1 = 0.5 + ln 2 - 1
    assert k3_kl(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert k3_kl(logp, logp).item() == 0.0
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = policy_loss(logp, logp, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1))
    assert stats["kl_ref"] == pytest.approx(0.5 + math.log(2) - 1)
    lp = torch.zeros(1, 3)
    w = torch.tensor([[2.0, 0.0, 1.0]])
    loss, _ = policy_loss(lp, lp, torch.ones(1), torch.ones(1, 3, dtype=torch.bool), is_weights=w)
    assert loss.item() == pytest.approx(-(2 + 0 + 1) / 3)


# --- log-probs --------------------------------------------------------------------------------------


def test_token_logprobs_match_sampler_definition_and_ignore_padding() -> None:
    model = make_model()
    batch = make_batch([0.0] * 4, group_size=4, seed=1)
    seqs = [p + r for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    plen = torch.tensor([len(p) for p in batch.prompt_ids])
    rlen = torch.tensor([len(r) for r in batch.response_ids])
    temp = 0.7
    out = token_logprobs(model, ids, plen, rlen, temperature=temp)
    assert out.shape == (4, int(rlen.max()))
    for b, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        alone = model(torch.tensor([p + r]))[0]  # unpadded, one at a time
        for j, tok in enumerate(r):
            expected = F.log_softmax(alone[len(p) + j - 1] / temp, dim=-1)[tok]
            assert out[b, j].item() == pytest.approx(expected.item(), abs=1e-10)
        assert torch.all(out[b, len(r) :] == 0)
    with pytest.raises(ValueError):
        token_logprobs(model, ids, plen, rlen, temperature=0.0)


# --- updater ----------------------------------------------------------------------------------------


def _grad_for(batch: RolloutBatch, **cfg: object) -> torch.Tensor:
    model = make_model()
    updater = GRPOUpdater(model, GRPOConfig(**cfg))  # type: ignore[arg-type]
    updater.compute_gradients(updater.prepare(batch))
    return grads(model)


def test_equal_reward_groups_give_exactly_zero_gradient() -> None:
    equal = make_batch([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], group_size=3)
    for aggregation in ("token-mean", "seq-mean"):
        g = _grad_for(equal, aggregation=aggregation, micro_batch_size=4)
        assert torch.count_nonzero(g) == 0
    mixed = make_batch([1.0, 0.0, 1.0, 0.0, 0.0, 0.0], group_size=3)
    assert torch.count_nonzero(_grad_for(mixed, micro_batch_size=4)) > 0


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_micro_batch_accumulation_equals_full_batch(aggregation: str) -> None:
    batch = make_batch([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.2, 0.9, 0.1], group_size=5, seed=3)
    full = _grad_for(batch, aggregation=aggregation, micro_batch_size=len(batch))
    for mbs in (1, 3, 4):
        micro = _grad_for(batch, aggregation=aggregation, micro_batch_size=mbs)
        assert torch.allclose(micro, full, rtol=0, atol=1e-6)
    assert full.abs().max() > 1e-3


def test_logits_budget_splits_micro_batches_and_keeps_the_gradient() -> None:
    """A micro-batch holds at most `max_logits_mib` of logits (sequences x longest x vocab x 4 bytes); the
    split changes memory only, not the accumulated gradient."""
    from types import SimpleNamespace

    batch = make_batch([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.2, 0.9, 0.1], group_size=5, seed=3)
    longest = max(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True))
    two_rows = 2 * longest * VOCAB * 4 / 2**20  # MiB: room for two sequences of the longest length

    def grad_and_sizes(**cfg: object) -> tuple[torch.Tensor, list[int]]:
        model = make_model()
        model.config = SimpleNamespace(vocab_size=VOCAB)
        updater = GRPOUpdater(model, GRPOConfig(**cfg))  # type: ignore[arg-type]
        mbs = updater.prepare(batch)
        updater.compute_gradients(mbs)
        for mb in mbs:  # each micro-batch's padded logits fit the budget, or it is a single sequence
            fits = mb.input_ids.numel() * VOCAB * 4 <= cfg["max_logits_mib"] * 2**20  # type: ignore[operator]
            assert fits or mb.input_ids.shape[0] == 1
        return grads(model), [mb.input_ids.shape[0] for mb in mbs]

    full, sizes = grad_and_sizes(micro_batch_size=len(batch), max_logits_mib=1e9)
    assert sizes == [len(batch)]
    for budget in (two_rows, 1e-9):  # two sequences at most; one each
        split, sizes = grad_and_sizes(micro_batch_size=len(batch), max_logits_mib=budget)
        assert sum(sizes) == len(batch) and max(sizes) <= (2 if budget == two_rows else 1)
        assert torch.allclose(split, full, rtol=0, atol=1e-6)


def test_rollout_logprobs_used_when_not_recomputing() -> None:
    batch = make_batch([1.0, 0.0, 0.0, 1.0], group_size=2, seed=4)
    model = make_model()
    with torch.no_grad():
        cur = [
            seq_token_logprobs(model, batch.prompt_ids[i], batch.response_ids[i]).tolist() for i in range(4)
        ]
    with pytest.raises(ValueError, match="old_logprobs"):
        GRPOUpdater(make_model(), GRPOConfig(recompute_old_logprobs=False)).prepare(batch)
    # Rollout log-probs equal to the current policy's give the recomputed gradient.
    batch.old_logprobs = cur
    same = _grad_for(batch, recompute_old_logprobs=False)
    assert torch.allclose(same, _grad_for(batch), atol=1e-10)
    # Stale rollout log-probs (each 0.1 lower) show up as ratio exp(0.1) on every token.
    batch.old_logprobs = [[x - 0.1 for x in row] for row in cur]
    updater = GRPOUpdater(make_model(), GRPOConfig(recompute_old_logprobs=False, clip_high=0.5))
    stats = updater.compute_gradients(updater.prepare(batch))
    assert stats["ratio_mean"] == pytest.approx(math.exp(0.1))


def test_update_raises_logprob_of_positive_advantage_response() -> None:
    batch = make_batch([1.0, 0.0, 0.0, 1.0], group_size=2, seed=5)
    model = make_model()

    def seq_logprob(i: int) -> float:
        with torch.no_grad():
            return float(seq_token_logprobs(model, batch.prompt_ids[i], batch.response_ids[i]).sum())

    before = [seq_logprob(i) for i in range(4)]
    updater = GRPOUpdater(model, GRPOConfig(lr=1e-2, micro_batch_size=2))
    loss_before = updater.update(batch)["loss"]
    after = [seq_logprob(i) for i in range(4)]
    assert after[0] > before[0] and after[3] > before[3]  # reward 1 in its group
    assert after[1] < before[1] and after[2] < before[2]  # reward 0 in its group
    # Re-evaluate the same objective at the new weights (old log-probs frozen at the pre-update policy).
    mbs = updater.prepare(batch)
    pre_update = GRPOUpdater(make_model(), GRPOConfig(micro_batch_size=2)).prepare(batch)
    for mb, old in zip(mbs, pre_update, strict=True):
        mb.old_logprobs = old.old_logprobs
    model.zero_grad()
    assert updater.compute_gradients(mbs)["loss"] < loss_before


def test_update_stats_kl_epochs_and_optimizer_resume() -> None:
    batch = make_batch([1.0, 0.0, 0.0, 0.5], group_size=2, seed=6)
    with pytest.raises(ValueError, match="ref_model"):
        GRPOUpdater(make_model(), GRPOConfig(kl_coef=0.1))
    model = make_model()
    cfg = GRPOConfig(lr=1e-2, kl_coef=0.1, ppo_epochs=2, max_grad_norm=0.5)
    updater = GRPOUpdater(model, cfg, ref_model=copy.deepcopy(model))
    stats = updater.update(batch)
    assert stats["kl_ref"] > 0  # the second epoch runs after one step away from the reference
    assert updater.optimizer.state_dict()["state"][0]["step"] == 2
    assert stats["reward_mean"] == pytest.approx(0.375) and stats["adv_abs_mean"] == pytest.approx(0.375)
    assert stats["num_tokens"] == sum(map(len, batch.response_ids)) and stats["entropy"] > 0
    # Resume: a fresh updater with the saved weights + optimizer state takes exactly the same next step.
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(updater.state_dict())
    updater.update(batch)
    resumed = make_model(seed=1)
    resumed.load_state_dict(saved_model)
    other = GRPOUpdater(resumed, cfg, ref_model=copy.deepcopy(updater.ref_model))
    other.load_state_dict(saved_opt)
    other.update(batch)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
