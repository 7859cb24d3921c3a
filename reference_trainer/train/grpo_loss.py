"""GRPO's mathematics, as pure functions of tensors: group-relative advantages, per-token log-probs of a
response under a causal LM, the clipped policy loss with its optional k3 KL and truncated importance weights.
The updater (grpo.py) batches, accumulates and steps around them.

The model is any causal LM callable as `model(input_ids[B, T]) -> logits[B, T, V]`. Sequences are
prompt + response, right-padded: with causal attention, padding after a sequence cannot change the
logits at its real positions, so no attention mask is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reference_trainer.train.config import Aggregation

NO_PROMPT_TOKEN = "every sequence needs at least one prompt token (e.g. BOS)"


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
    logits: Tensor,
    input_ids: Tensor,
    prompt_lens: Tensor,
    response_lens: Tensor,
    temperature: float = 1.0,
    width: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probs (differentiable) and entropies (detached) of the response tokens under softmax(logits / T).

    Row b holds prompt_lens[b] prompt tokens then response_lens[b] response tokens. Returns two
    [B, max(response_lens)] tensors, left-aligned on the response and 0 past its end. Response token j sits
    at position p + j and is predicted by the logits at p + j - 1, so every prompt needs >= 1 token.
    A caller that knows max(response_lens, 1) passes it as `width` (and has checked the prompts' lengths):
    nothing is then read from the device.
    """
    if temperature <= 0:
        raise ValueError("log-probs need temperature > 0 (greedy decoding has no sampling distribution)")
    if width is None:
        if int(prompt_lens.min()) < 1:
            raise ValueError(NO_PROMPT_TOKEN)
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
) -> tuple[Tensor, dict[str, Tensor]]:
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

    Stats (token means over this call's tokens, as 0-d tensors on the logits' device: nothing is read back):
    clip_frac (tokens where the clipped term was the active, strictly smaller one), approx_kl (k3 estimate of
    KL(old || new)), ratio_mean, kl_ref (when given).
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

    loss = _aggregate(per_token * mask_f, mask_f, aggregation, num_tokens, num_seqs)
    with torch.no_grad():
        n = mask_f.sum().clamp(min=1.0)
        stats = {
            "clip_frac": ((clipped < unclipped).to(mask_f.dtype) * mask_f).sum() / n,
            "approx_kl": (k3_kl(old_logprobs, logprobs) * mask_f).sum() / n,
            "ratio_mean": (ratio * mask_f).sum() / n,
        }
        if kl_ref is not None:
            stats["kl_ref"] = (kl_ref * mask_f).sum() / n
    return loss, stats


def _aggregate(
    per_token: Tensor,
    mask_f: Tensor,
    aggregation: Aggregation,
    num_tokens: float | None,
    num_seqs: float | None,
) -> Tensor:
    """The masked per-token losses as one loss, by `aggregation` (policy_loss says how)."""
    if aggregation == "token-mean":
        denom = num_tokens if num_tokens is not None else mask_f.sum().clamp(min=1.0)
        return per_token.sum() / denom
    if aggregation == "seq-mean":
        seq_means = per_token.sum(1) / mask_f.sum(1).clamp(min=1.0)
        return seq_means.sum() / (num_seqs if num_seqs is not None else max(mask_f.shape[0], 1))
    raise ValueError(f"aggregation must be 'token-mean' or 'seq-mean', got {aggregation!r}")


def tis_weights(old_logprobs: Tensor, sampling_logprobs: Tensor, cap: float, mask: Tensor) -> Tensor:
    """Truncated importance weights min(exp(old - sampling), cap) per token (Yao et al. 2025; IMPALA's
    truncation): they correct tokens sampled by an older (or numerically different) policy towards the
    policy the update starts from. 1 on padding and where the sampling log-prob is unknown (NaN)."""
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")
    old, sampling = old_logprobs.to(torch.float64), sampling_logprobs.to(torch.float64)
    weights = torch.exp(old - sampling).clamp(max=cap)
    return torch.where(mask & torch.isfinite(sampling), weights, torch.ones_like(weights))
