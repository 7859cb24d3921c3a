"""The GRPO updater: a rollout batch in micro-batches, gradient accumulation, one optimizer step per PPO
epoch (the loss and its pieces are in grpo_loss.py).

On a GPU the host must not wait for the device inside an update: everything the host needs to shape the
work (widths, token counts) comes from the batch's Python lists, the statistics accumulate as device
tensors, and an optimizer step reads the device back once, before it steps (the loss, the gradient norm and
the statistics together, to refuse a non-finite update), and once after (are the weights still finite).
The forward and backward run under bf16 autocast on CUDA (`GRPOConfig.autocast`) over fp32 weights, and
AdamW is the fused kernel on CUDA (tests/test_grpo_update.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from reference_trainer.engine.transfers import read_back, to_device
from reference_trainer.train.config import GRPOConfig
from reference_trainer.train.grpo_loss import (
    NO_PROMPT_TOKEN,
    group_advantages,
    logprobs_from_logits,
    policy_loss,
    response_mask,
    tis_weights,
)


class NonFiniteUpdate(ArithmeticError):
    """An update whose loss, gradient or resulting weights are not finite numbers."""


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
    width: int  # max(response_lens, 1), known on the host
    num_tokens: int  # response tokens, known on the host
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    is_weights: Tensor | None = None
    sampling_logprobs: Tensor | None = None  # the rollout's log-probs, for TIS


def _pad(rows: list[list[float]] | list[list[int]], width: int, value: float, dtype: torch.dtype) -> Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def make_optimizer(model: nn.Module, config: GRPOConfig) -> torch.optim.AdamW:
    """AdamW over the model's parameters: the fused kernel on CUDA (one launch for every tensor, step counts
    on the device, so a step reads nothing back), the multi-tensor (foreach) one elsewhere."""
    params = list(model.parameters())
    on_cuda = bool(params) and all(p.device.type == "cuda" for p in params)
    backend = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay, **backend
    )


def read_scalars(values: dict[str, Tensor]) -> dict[str, float]:
    """Device scalars as floats, in one device-to-host transfer."""
    rows = read_back(*(v.detach().reshape(1) for v in values.values())) if values else []
    return {key: row[0] for key, row in zip(values, rows, strict=True)}


class GRPOUpdater:
    """One GRPO update per `update(batch)`: advantages, old/ref log-probs, accumulated grads, AdamW step."""

    def __init__(self, model: nn.Module, config: GRPOConfig, ref_model: nn.Module | None = None) -> None:
        if config.kl_coef != 0.0 and ref_model is None:
            raise ValueError("kl_coef != 0 needs a ref_model")
        self.model, self.config, self.ref_model = model, config, ref_model
        self.optimizer = make_optimizer(model, config)

    @property
    def temperature(self) -> float:
        return 1.0 if self.config.temperature is None else self.config.temperature

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 when the update's forwards and backwards run under autocast; None: in the weights' dtype."""
        mode, cuda = self.config.autocast, self.device.type == "cuda"
        if mode not in ("auto", "bfloat16", "off"):
            raise ValueError(f"autocast must be auto, bfloat16 or off, got {mode!r}")
        auto = mode == "auto" and cuda and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if mode == "bfloat16" or auto else None

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
        """Right-padded micro-batches, each only as wide as its own longest sequence. Every shape and count
        comes from the batch's lists; the tensors go to the device without the host waiting."""
        cfg, dev = self.config, self.device
        out = []
        for idx in self._partition(batch):
            seqs = [batch.prompt_ids[i] + batch.response_ids[i] for i in idx]
            lens = [len(batch.response_ids[i]) for i in idx]
            width = max(max(lens), 1)
            resp_lens = to_device(torch.tensor(lens), dev)
            mb = _MicroBatch(
                input_ids=to_device(_pad(seqs, max(map(len, seqs)), cfg.pad_id, torch.long), dev),
                prompt_lens=to_device(torch.tensor([len(batch.prompt_ids[i]) for i in idx]), dev),
                response_lens=resp_lens,
                mask=response_mask(resp_lens, width),
                advantages=to_device(advantages[idx.start : idx.stop], dev),
                width=width,
                num_tokens=sum(lens),
            )
            # float64 keeps the rollout's Python floats exact; they are cast to the log-probs' dtype at use.
            f64 = torch.float64
            if batch.old_logprobs is not None and not cfg.recompute_old_logprobs:
                mb.old_logprobs = to_device(_pad([batch.old_logprobs[i] for i in idx], width, 0.0, f64), dev)
            if batch.is_weights is not None:
                mb.is_weights = to_device(_pad([batch.is_weights[i] for i in idx], width, 1.0, f64), dev)
            if cfg.tis_cap is not None:
                assert batch.old_logprobs is not None  # checked in prepare
                sampling = [batch.old_logprobs[i] for i in idx]
                mb.sampling_logprobs = to_device(_pad(sampling, width, math.nan, f64), dev)
            out.append(mb)
        return out

    def _logprobs(self, model: nn.Module, mb: _MicroBatch) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies; under autocast the matmuls run in bf16 while the weights (and their
        gradients) stay fp32, and the log-softmax runs in fp32 (logprobs_from_logits)."""
        dtype = self.autocast_dtype
        with torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(mb.input_ids)
        args = (mb.input_ids, mb.prompt_lens, mb.response_lens, self.temperature)
        return logprobs_from_logits(logits, *args, width=mb.width)

    @torch.no_grad()
    def _logprobs_no_grad(self, model: nn.Module, mb: _MicroBatch) -> Tensor:
        return self._logprobs(model, mb)[0]

    def prepare(self, batch: RolloutBatch) -> list[_MicroBatch]:
        """Advantages, micro-batches, old log-probs (recomputed or from the rollout) and ref log-probs."""
        cfg = self.config
        if len(batch.rewards) != len(batch) or len(batch.response_ids) != len(batch):
            raise ValueError("prompt_ids, response_ids and rewards must have one entry per sample")
        if not cfg.recompute_old_logprobs and batch.old_logprobs is None:
            raise ValueError("recompute_old_logprobs=False needs the rollout's old_logprobs in the batch")
        if cfg.tis_cap is not None and batch.old_logprobs is None:
            raise ValueError("tis_cap needs the rollout's sampling log-probs (old_logprobs) in the batch")
        if not all(batch.prompt_ids):
            raise ValueError(NO_PROMPT_TOKEN)
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

    def accumulate_gradients(self, mbs: list[_MicroBatch]) -> dict[str, Tensor]:
        """Accumulate the full-batch loss gradient into `.grad` (not zeroed here), one micro-batch at a time;
        returns the loss and the token sums of the stats as device scalars (nothing is read back).

        Each micro-batch loss is normalised by the full batch's token (or sequence) count, so the sum of
        micro-batch gradients equals the gradient of the loss over the whole batch.
        """
        cfg = self.config
        num_tokens = float(sum(mb.num_tokens for mb in mbs))
        num_seqs = float(sum(mb.input_ids.shape[0] for mb in mbs))
        sums: dict[str, Tensor] = {}
        for mb in mbs:
            logp, entropy = self._logprobs(self.model, mb)
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
            # token-weighted, so micro-batch sizes do not bias the means
            weighted = {key: value * mb.num_tokens for key, value in stats.items()}
            weighted["entropy"] = (entropy.detach() * mb.mask).sum()
            weighted["loss"] = loss.detach()
            for key, value in weighted.items():
                sums[key] = value if key not in sums else sums[key] + value
        return sums

    def _stats(self, mbs: list[_MicroBatch], read: dict[str, float]) -> dict[str, float]:
        """Token means of the stats read back, with the loss and the host-known counts."""
        num_tokens = sum(mb.num_tokens for mb in mbs)
        out = {key: value / max(num_tokens, 1) for key, value in read.items() if key != "loss"}
        out["loss"] = read.get("loss", 0.0)
        out["num_tokens"] = float(num_tokens)
        # the work of these forwards: every position of every padded micro-batch, prompts included
        out["forward_tokens"] = float(sum(mb.input_ids.numel() for mb in mbs))
        return out

    def compute_gradients(self, mbs: list[_MicroBatch]) -> dict[str, float]:
        """`accumulate_gradients` with its stats read back (once) as token means."""
        return self._stats(mbs, read_scalars(self.accumulate_gradients(mbs)))

    def _batch_sums(self, mbs: list[_MicroBatch]) -> dict[str, Tensor]:
        """Sums over the batch that no epoch changes, read back with each epoch's stats: |advantages| and,
        with TIS, the weights and how many were capped (how much off-policy correction the batch needed)."""
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        out = {"adv_abs": sum((mb.advantages.abs().sum() for mb in mbs), zero)}
        cap = self.config.tis_cap
        if cap is not None:
            weighted = [(mb.is_weights, mb.mask) for mb in mbs if mb.is_weights is not None]
            out["tis_weight"] = sum(((w * m).sum() for w, m in weighted), zero)
            out["tis_capped"] = sum((((w >= cap) & m).sum() for w, m in weighted), zero)
        return out

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One GRPO update (ppo_epochs optimizer steps over the whole batch); returns scalar stats.

        A non-finite loss or gradient norm raises NonFiniteUpdate before the optimizer step, so the weights
        stay as they were; weights that an optimizer step made non-finite raise it too. Each optimizer step
        reads the device back twice, whatever the number of micro-batches: the stats, the loss and the
        gradient norm before it, the weights' largest magnitude after it."""
        cfg = self.config
        self.model.train()
        mbs = self.prepare(batch)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        batch_sums = self._batch_sums(mbs)
        stats: dict[str, float] = {}
        batch_read: dict[str, float] = {}
        for _ in range(cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            sums = self.accumulate_gradients(mbs)
            params = [p for p in self.model.parameters() if p.grad is not None]
            if params:
                sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, max_norm)
            read = read_scalars({**sums, **batch_sums})
            batch_read = {key: read.pop(key) for key in batch_sums}
            grad_norm = read.pop("grad_norm", 0.0)
            stats = {**self._stats(mbs, read), "grad_norm": grad_norm}
            if not (math.isfinite(stats["loss"]) and math.isfinite(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteUpdate(f"the loss is {stats['loss']} and the gradient norm {grad_norm}")
            self.optimizer.step()
            # The largest |weight| is finite iff every weight is (NaN propagates): one read for all tensors.
            if params and not math.isfinite(float(torch.nn.utils.get_total_norm(params, math.inf))):
                raise NonFiniteUpdate("an optimizer step made the weights non-finite")
        samples, tokens = len(batch), stats.get("num_tokens", 0.0)
        stats.update(
            reward_mean=math.fsum(batch.rewards) / samples if samples else math.nan,
            adv_abs_mean=batch_read.get("adv_abs", math.nan) / samples if samples else math.nan,
            response_len_mean=tokens / max(samples, 1),
            lr=float(self.optimizer.param_groups[0]["lr"]),
        )
        if cfg.tis_cap is not None:
            stats["tis_weight_mean"] = batch_read["tis_weight"] / tokens if tokens else 1.0
            stats["tis_clip_frac"] = batch_read["tis_capped"] / tokens if tokens else 0.0
        return stats

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Load optimizer state saved by any AdamW: the kernel (fused, foreach) stays this process's choice,
        since a checkpoint may come from another device."""
        groups = [
            {**saved, "fused": current["fused"], "foreach": current["foreach"]}
            for saved, current in zip(state["param_groups"], self.optimizer.param_groups, strict=True)
        ]
        self.optimizer.load_state_dict({**state, "param_groups": groups})
