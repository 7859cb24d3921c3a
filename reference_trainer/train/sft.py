"""Supervised warm start: next-token cross-entropy on the response part of (prompt, response) pairs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_trainer.model.decoder import DecoderLM

Row = tuple[list[int], list[int]]  # an example: (prompt ids, response ids incl. EOS)


@dataclass
class SFTConfig:
    steps: int = 600
    batch_size: int = 32  # examples per optimizer step
    micro_batch_tokens: int = 2048  # padded tokens per forward; rows are length-sorted to waste little
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0


def sft_loss(model: DecoderLM, rows: list[Row], pad_id: int = 0, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over response tokens (mean, or sum with reduction="sum");
    rows are (prompt ids, response ids incl. EOS)."""
    device = next(model.parameters()).device
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        seq = prompt + response
        ids[i, : len(seq)] = torch.tensor(seq)
        # position t predicts token t+1: supervise only predictions of response tokens
        targets[i, len(prompt) - 1 : len(seq) - 1] = torch.tensor(response)
    logits = model(ids.to(device))
    return F.cross_entropy(
        logits.flatten(0, 1).float(), targets.to(device).flatten(), ignore_index=-100, reduction=reduction
    )


def micro_batches(rows: list[Row], max_tokens: int) -> list[list[Row]]:
    """Length-sorted chunks whose padded size stays within max_tokens (at least one row each)."""
    rows = sorted(rows, key=lambda r: len(r[0]) + len(r[1]))
    chunks: list[list[Row]] = [[]]
    for row in rows:
        width = len(row[0]) + len(row[1])  # the longest so far, since rows are sorted
        if chunks[-1] and width * (len(chunks[-1]) + 1) > max_tokens:
            chunks.append([])
        chunks[-1].append(row)
    return chunks


def train_sft(
    model: DecoderLM,
    sample_batch: Callable[[random.Random, int], list[Row]],
    config: SFTConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """AdamW with linear warm-up and cosine decay; `sample_batch(rng, n)` yields fresh examples each step."""
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95)
    )

    def lr_at(step: int) -> float:
        if step < config.warmup:
            return config.lr * (step + 1) / config.warmup
        progress = (step - config.warmup) / max(1, config.steps - config.warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    model.train()
    losses = []
    for step in range(config.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        rows = sample_batch(rng, config.batch_size)
        num_targets = sum(len(r[1]) for r in rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for chunk in micro_batches(rows, config.micro_batch_tokens):
            loss = sft_loss(model, chunk, reduction="sum") / num_targets
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        opt.step()
        losses.append(total)
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses
