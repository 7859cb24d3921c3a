"""Token sampling: temperature, top-k, top-p, per-request seeds, and log-probs of what was sampled.

The distribution a token is drawn from (`sampling_probs`) is kept separate from the draw so speculative
verification can apply its accept/reject rule to exactly the same distribution.

Reported log-probs are those of the sampled token under softmax(logits / temperature), before top-k/top-p
truncation (softmax(logits) for greedy requests): the quantity a trainer recomputes from the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_trainer.engine.config import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per engine step."""

    temperature: torch.Tensor  # [N]; rows with 0 are greedy
    top_k: torch.Tensor  # [N]; 0 = off
    top_p: torch.Tensor  # [N]
    greedy: torch.Tensor  # [N] bool
    generators: list[torch.Generator | None]

    @classmethod
    def build(
        cls, params: list[SamplingParams], generators: list[torch.Generator | None], device: torch.device
    ) -> SamplingBatch:
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        return cls(
            temperature=temps,
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            greedy=temps <= 0,
            generators=generators,
        )

    def repeat(self, counts: list[int]) -> SamplingBatch:
        """Row i repeated counts[i] times (verification scores several positions per sequence)."""
        index = torch.repeat_interleave(
            torch.arange(len(counts), device=self.temperature.device),
            torch.tensor(counts, device=self.temperature.device),
        )
        gens = [g for g, c in zip(self.generators, counts, strict=True) for _ in range(c)]
        return SamplingBatch(
            self.temperature[index], self.top_k[index], self.top_p[index], self.greedy[index], gens
        )


def scaled_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    temps = torch.where(batch.greedy, torch.ones_like(batch.temperature), batch.temperature)
    return logits.float() / temps[:, None]


def token_logprobs(logits: torch.Tensor, batch: SamplingBatch, tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob of `tokens` under softmax(logits / T), untruncated."""
    logp = torch.log_softmax(scaled_logits(logits, batch), dim=-1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1)


def sampling_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each row samples from: temperature, top-k, then top-p; greedy rows are one-hot."""
    logits = scaled_logits(logits, batch)
    vocab = logits.shape[-1]
    if bool((batch.top_k > 0).any()):
        k = torch.where(batch.top_k > 0, batch.top_k.clamp(max=vocab), torch.full_like(batch.top_k, vocab))
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if bool((batch.top_p < 1).any()):
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays).
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= batch.top_p[:, None]
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    if bool(batch.greedy.any()):
        onehot = torch.zeros_like(probs).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(batch.greedy[:, None], onehot, probs)
    return probs


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row, each row from its own generator (so a request's samples do not depend on its
    batch neighbours). Exponential race: argmax(p / E), E ~ Exp(1), is an exact draw from p."""
    noise = torch.empty_like(probs)
    row = 0
    while row < len(generators):
        # Consecutive rows of one generator (a verified sequence's positions) fill in one call: the same
        # stream, drawn in the same order, as one row at a time.
        end = row + 1
        while end < len(generators) and generators[end] is generators[row] and generators[row] is not None:
            end += 1
        noise[row:end].exponential_(generator=generators[row])
        row = end
    return (probs / noise).argmax(-1)


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens, log-probs)."""
    if bool(batch.greedy.all()):
        tokens = logits.argmax(-1)
    else:
        tokens = draw(sampling_probs(logits, batch), batch.generators)
        tokens = torch.where(batch.greedy, logits.argmax(-1), tokens)
    return tokens, token_logprobs(logits, batch, tokens)
