"""GRPO: group-relative advantages, the clipped policy loss and an updater with gradient accumulation.

The model is any causal LM callable as `model(input_ids[B, T]) -> logits[B, T, V]`. Sequences are
prompt + response, right-padded: with causal attention, padding after a sequence cannot change the
logits at its real positions, so no attention mask is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Aggregation = Literal["token-mean", "seq-mean"]


def group_advantages(rewards: Tensor, group_size: int, scale_std: bool = False, eps: float = 1e-6) -> Tensor:
    """A_i = r_i - mean(group of r_i); with `scale_std`, also divided by (group std + eps).

    Groups are consecutive runs of `group_size` samples. The default is Dr. GRPO's unscaled advantage
    (dividing by the std up-weights groups whose rewards barely differ); `scale_std=True` is the original
    GRPO, using the sample std (N - 1 denominator) as DeepSeekMath/TRL do. A group whose rewards are all
    equal gets advantage exactly 0 either way.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    groups = rewards.reshape(-1, group_size)
    if not groups.is_floating_point():
        groups = groups.float()
    adv = groups - groups.mean(dim=1, keepdim=True)
    if scale_std and group_size > 1:
        adv = adv / (groups.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)


def response_mask(response_lens: Tensor, width: int) -> Tensor:
    """[B, width] bool mask of the real response tokens (left-aligned)."""
    return torch.arange(width, device=response_lens.device)[None, :] < response_lens[:, None]


def logprobs_from_logits(
    logits: Tensor, input_ids: Tensor, prompt_lens: Tensor, response_lens: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-probs (differentiable) and entropies (detached) of the response tokens under softmax(logits / T).

    Row b holds prompt_lens[b] prompt tokens then response_lens[b] response tokens. Returns two
    [B, max(response_lens)] tensors, left-aligned on the response and 0 past its end. Response token j sits
    at position p + j and is predicted by the logits at p + j - 1, so every prompt needs >= 1 token.
    """
    if temperature <= 0:
        raise ValueError("log-probs need temperature > 0 (greedy decoding has no sampling distribution)")
    if int(prompt_lens.min()) < 1:
        raise ValueError("every sequence needs at least one prompt token (e.g. BOS)")
    width = max(int(response_lens.max()), 1)
    bsz, seq_len = input_ids.shape
    offsets = torch.arange(width, device=input_ids.device)[None, :]
    target_pos = (prompt_lens[:, None] + offsets).clamp(max=seq_len - 1)
    logits = logits.gather(1, (target_pos - 1)[..., None].expand(bsz, width, logits.shape[-1]))
    # Softmax in at least fp32: bf16 log-probs are too coarse for importance ratios near 1.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logp_all = F.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, input_ids.gather(1, target_pos)[..., None]).squeeze(-1)
    with torch.no_grad():  # entropy is a statistic, never part of the loss
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = response_mask(response_lens, width)
    return logp.masked_fill(~mask, 0.0), entropy.masked_fill(~mask, 0.0)


def token_logprobs(
    model: nn.Module, input_ids: Tensor, prompt_lens: Tensor, response_lens: Tensor, temperature: float = 1.0
) -> Tensor:
    """Per-token log-probs [B, max(response_lens)] of the response tokens, 0 on padding.

    These are the log-probs the rollout engine reports for sampled tokens: softmax(logits / temperature),
    with no top-k/top-p truncation.
    """
    return logprobs_from_logits(model(input_ids), input_ids, prompt_lens, response_lens, temperature)[0]


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref) on samples from pi: exp(d) - d - 1, d = ref - logp (>= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    is_weights: Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric (clip-higher) bounds and an optional k3 KL penalty.

    Per token: ratio = exp(logp - old_logp) and
        l = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) * w + kl_coef * k3(logp, ref_logp)
    where w = `is_weights` (detached per-token weights for off-policy correction; 1 by default; they scale
    the policy-gradient term only). `advantages` is [B] (one per sequence) or [B, T].

    Aggregation over the [B, T] `mask`:
      token-mean: sum of l over all response tokens / number of response tokens in the batch, so long
                  responses weigh more (DAPO).
      seq-mean:   mean of l over each sequence's tokens, then the mean over sequences (original GRPO).
    `num_tokens` / `num_seqs` override the denominators: pass the full batch's counts when this call sees
    one micro-batch, so summing micro-batch losses gives exactly the full-batch loss.

    Stats (token means over this call's tokens): clip_frac (tokens where the clipped term was the active,
    strictly smaller one), approx_kl (k3 estimate of KL(old || new)), ratio_mean, kl_ref (when given).
    """
    mask_f = mask.to(logprobs.dtype)
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    kl_ref = None
    if ref_logprobs is not None and kl_coef != 0.0:
        kl_ref = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl_ref

    per_token = per_token * mask_f
    if aggregation == "token-mean":
        denom = num_tokens if num_tokens is not None else mask_f.sum().clamp(min=1.0)
        loss = per_token.sum() / denom
    elif aggregation == "seq-mean":
        seq_means = per_token.sum(1) / mask_f.sum(1).clamp(min=1.0)
        loss = seq_means.sum() / (num_seqs if num_seqs is not None else max(mask.shape[0], 1))
    else:
        raise ValueError(f"aggregation must be 'token-mean' or 'seq-mean', got {aggregation!r}")

    with torch.no_grad():
        n = mask_f.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float(((clipped < unclipped).to(mask_f.dtype) * mask_f).sum() / n),
            "approx_kl": float((k3_kl(old_logprobs, logprobs) * mask_f).sum() / n),
            "ratio_mean": float((ratio * mask_f).sum() / n),
        }
        if kl_ref is not None:
            stats["kl_ref"] = float((kl_ref * mask_f).sum() / n)
    return loss, stats


@dataclass
class GRPOConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # <= 0 disables clipping
    micro_batch_size: int = 16
    # A micro-batch also holds at most this many MiB of fp32 logits (sequences x width x vocab x 4 bytes):
    # at a 49k vocabulary 16 sequences of 300 tokens would be 0.9 GB of logits, several times over in the
    # log-softmax and its backward. The embedded model's 99-token vocabulary never reaches it.
    max_logits_mib: float = 256.0
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO's clip-higher uses 0.28
    aggregation: Aggregation = "token-mean"
    kl_coef: float = 0.0
    scale_std: bool = False
    # The rollout's sampling temperature: the trainer sets it from TrainConfig.temperature (and refuses a
    # different value here); None in an updater used on its own means 1.0.
    temperature: float | None = None
    recompute_old_logprobs: bool = True  # False: use the rollout's sampling log-probs
    ppo_epochs: int = 1  # optimizer steps over the same batch
    # Truncated importance sampling (TIS) for off-policy tokens: is_weight = min(pi_old / pi_sampling, cap),
    # pi_old the recomputed log-probs, pi_sampling the batch's `old_logprobs`. None disables it.
    tis_cap: float | None = None
    pad_id: int = 0


@dataclass
class RolloutBatch:
    """Samples of a step; the `group_size` samples of each prompt are consecutive."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]  # including the EOS token when the sample finished
    rewards: list[float]
    group_size: int
    old_logprobs: list[list[float]] | None = None  # per response token, as sampled by the rollout
    is_weights: list[list[float]] | None = None  # per response token, for off-policy correction

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class _MicroBatch:
    input_ids: Tensor
    prompt_lens: Tensor
    response_lens: Tensor
    mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    is_weights: Tensor | None = None
    sampling_logprobs: Tensor | None = None  # the rollout's log-probs, for TIS


def tis_weights(old_logprobs: Tensor, sampling_logprobs: Tensor, cap: float, mask: Tensor) -> Tensor:
    """Truncated importance weights min(exp(old - sampling), cap) per token (Yao et al. 2025; IMPALA's
    truncation): they correct tokens sampled by an older (or numerically different) policy towards the
    policy the update starts from. 1 on padding and where the sampling log-prob is unknown (NaN)."""
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")
    old, sampling = old_logprobs.to(torch.float64), sampling_logprobs.to(torch.float64)
    weights = torch.exp(old - sampling).clamp(max=cap)
    return torch.where(mask & torch.isfinite(sampling), weights, torch.ones_like(weights))


def _pad(rows: list[list[float]] | list[list[int]], width: int, value: float, dtype: torch.dtype) -> Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


class GRPOUpdater:
    """One GRPO update per `update(batch)`: advantages, old/ref log-probs, accumulated grads, AdamW step."""

    def __init__(self, model: nn.Module, config: GRPOConfig, ref_model: nn.Module | None = None) -> None:
        if config.kl_coef != 0.0 and ref_model is None:
            raise ValueError("kl_coef != 0 needs a ref_model")
        self.model, self.config, self.ref_model = model, config, ref_model
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )

    @property
    def temperature(self) -> float:
        return 1.0 if self.config.temperature is None else self.config.temperature

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _partition(self, batch: RolloutBatch) -> list[range]:
        """Consecutive index ranges of at most `micro_batch_size` sequences whose logits (padded to the
        range's longest sequence) fit in `max_logits_mib`; one sequence per range at least."""
        cfg = self.config
        vocab = int(getattr(getattr(self.model, "config", None), "vocab_size", 0))  # 0: no logits cap
        budget = cfg.max_logits_mib * 2**20
        ranges, lo, width = [], 0, 0
        for i in range(len(batch)):
            length = len(batch.prompt_ids[i]) + len(batch.response_ids[i])
            full = i - lo >= cfg.micro_batch_size or (i - lo + 1) * max(width, length) * vocab * 4 > budget
            if i > lo and full:
                ranges.append(range(lo, i))
                lo, width = i, 0
            width = max(width, length)
        return [*ranges, range(lo, len(batch))] if len(batch) else []

    def _micro_batches(self, batch: RolloutBatch, advantages: Tensor) -> list[_MicroBatch]:
        """Right-padded micro-batches, each only as wide as its own longest sequence."""
        cfg, dev = self.config, self.device
        out = []
        for idx in self._partition(batch):
            seqs = [batch.prompt_ids[i] + batch.response_ids[i] for i in idx]
            resp_lens = torch.tensor([len(batch.response_ids[i]) for i in idx], device=dev)
            width = max(int(resp_lens.max()), 1)
            mb = _MicroBatch(
                input_ids=_pad(seqs, max(map(len, seqs)), cfg.pad_id, torch.long).to(dev),
                prompt_lens=torch.tensor([len(batch.prompt_ids[i]) for i in idx], device=dev),
                response_lens=resp_lens,
                mask=response_mask(resp_lens, width),
                advantages=advantages[idx.start : idx.stop].to(dev),
            )
            # float64 keeps the rollout's Python floats exact; they are cast to the log-probs' dtype at use.
            f64 = torch.float64
            if batch.old_logprobs is not None and not cfg.recompute_old_logprobs:
                mb.old_logprobs = _pad([batch.old_logprobs[i] for i in idx], width, 0.0, f64).to(dev)
            if batch.is_weights is not None:
                mb.is_weights = _pad([batch.is_weights[i] for i in idx], width, 1.0, f64).to(dev)
            if cfg.tis_cap is not None:
                assert batch.old_logprobs is not None  # checked in prepare
                sampling = [batch.old_logprobs[i] for i in idx]
                mb.sampling_logprobs = _pad(sampling, width, math.nan, f64).to(dev)
            out.append(mb)
        return out

    @torch.no_grad()
    def _logprobs_no_grad(self, model: nn.Module, mb: _MicroBatch) -> Tensor:
        return token_logprobs(model, mb.input_ids, mb.prompt_lens, mb.response_lens, self.temperature)

    def prepare(self, batch: RolloutBatch) -> list[_MicroBatch]:
        """Advantages, micro-batches, old log-probs (recomputed or from the rollout) and ref log-probs."""
        cfg = self.config
        if len(batch.rewards) != len(batch) or len(batch.response_ids) != len(batch):
            raise ValueError("prompt_ids, response_ids and rewards must have one entry per sample")
        if not cfg.recompute_old_logprobs and batch.old_logprobs is None:
            raise ValueError("recompute_old_logprobs=False needs the rollout's old_logprobs in the batch")
        if cfg.tis_cap is not None and batch.old_logprobs is None:
            raise ValueError("tis_cap needs the rollout's sampling log-probs (old_logprobs) in the batch")
        rewards = torch.as_tensor(batch.rewards, dtype=torch.float32)
        advantages = group_advantages(rewards, batch.group_size, cfg.scale_std)
        mbs = self._micro_batches(batch, advantages)
        for mb in mbs:
            if mb.old_logprobs is None:
                mb.old_logprobs = self._logprobs_no_grad(self.model, mb)
            if self.ref_model is not None and cfg.kl_coef != 0.0:
                mb.ref_logprobs = self._logprobs_no_grad(self.ref_model, mb)
            if cfg.tis_cap is not None:
                assert mb.sampling_logprobs is not None
                tis = tis_weights(mb.old_logprobs, mb.sampling_logprobs, cfg.tis_cap, mb.mask)
                mb.is_weights = tis if mb.is_weights is None else mb.is_weights * tis
        return mbs

    def compute_gradients(self, mbs: list[_MicroBatch]) -> dict[str, float]:
        """Accumulate the full-batch loss gradient into `.grad` (not zeroed here), one micro-batch at a time.

        Each micro-batch loss is normalised by the full batch's token (or sequence) count, so the sum of
        micro-batch gradients equals the gradient of the loss over the whole batch.
        """
        cfg = self.config
        num_tokens = float(sum(int(mb.mask.sum()) for mb in mbs))
        num_seqs = float(sum(mb.mask.shape[0] for mb in mbs))
        totals: dict[str, float] = {}
        loss_total = 0.0
        for mb in mbs:
            logits = self.model(mb.input_ids)
            logp, entropy = logprobs_from_logits(
                logits, mb.input_ids, mb.prompt_lens, mb.response_lens, self.temperature
            )
            assert mb.old_logprobs is not None
            loss, stats = policy_loss(
                logp,
                mb.old_logprobs.to(logp.dtype),
                mb.advantages.to(logp.dtype),
                mb.mask,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                ref_logprobs=mb.ref_logprobs,
                kl_coef=cfg.kl_coef,
                is_weights=None if mb.is_weights is None else mb.is_weights.to(logp.dtype),
                num_tokens=max(num_tokens, 1.0),
                num_seqs=max(num_seqs, 1.0),
            )
            loss.backward()
            loss_total += float(loss.detach())
            tokens = float(mb.mask.sum())
            stats["entropy"] = float((entropy.detach() * mb.mask).sum() / max(tokens, 1.0))
            for key, value in stats.items():  # token-weighted, so micro-batch sizes do not bias the means
                totals[key] = totals.get(key, 0.0) + value * tokens
        out = {key: value / max(num_tokens, 1.0) for key, value in totals.items()}
        out["loss"] = loss_total
        out["num_tokens"] = num_tokens
        return out

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One GRPO update (ppo_epochs optimizer steps over the whole batch); returns scalar stats."""
        cfg = self.config
        self.model.train()
        mbs = self.prepare(batch)
        stats: dict[str, float] = {}
        for _ in range(cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            stats = self.compute_gradients(mbs)
            params = [p for p in self.model.parameters() if p.grad is not None]
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
            self.optimizer.step()
        advantages = torch.cat([mb.advantages for mb in mbs])
        rewards = torch.as_tensor(batch.rewards, dtype=torch.float32)
        stats.update(
            reward_mean=float(rewards.mean()),
            adv_abs_mean=float(advantages.abs().mean()),
            response_len_mean=stats["num_tokens"] / max(len(batch), 1),
            lr=float(self.optimizer.param_groups[0]["lr"]),
        )
        if cfg.tis_cap is not None:  # how much off-policy correction this batch needed
            w = torch.cat([mb.is_weights[mb.mask] for mb in mbs if mb.is_weights is not None])
            stats["tis_weight_mean"] = float(w.mean()) if w.numel() else 1.0
            stats["tis_clip_frac"] = float((w >= cfg.tis_cap).double().mean()) if w.numel() else 0.0
        return stats

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
