"""Token sampling: temperature, top-k, top-p, per-request seeds, and log-probs of what was sampled.

The distribution a token is drawn from (`sampling_probs`) is kept separate from the draw so speculative
verification can apply its accept/reject rule to exactly the same distribution.

Randomness is counter-based: the token at position t of a request is drawn with one uniform that is a pure
function of (the request's key, t) — SplitMix64 (Steele, Lea and Flood, 2014) evaluated in int64 tensor ops
for the whole batch — by inverse-CDF sampling in float64. So a request's token at position t does not depend
on its batch neighbours, the batch size, the order of the rows, whether speculative verification or plain
decoding computed it, or on graphs vs eager execution: no generator state lives on the host. (torch has no
per-element keyed Philox, hence the hash here; its output is checked against a Python reference in tests.)
Inverse-CDF with one uniform per row measured 2-9x faster on CPU than an exponential race over the
vocabulary (one hashed uniform per token), and 2-18x faster than the per-row generators it replaced except
at batch 1 with the embedded model's 99-token vocabulary (30 vs 6 us): benchmarks/sampler_draw.py, 1 thread.

Sampling parameters live in per-slot device tensors (`SlotParams`), written when a request is admitted into
a slot; a step gathers them by row. Which optional ops a step runs (top-k, top-p, greedy rows) is decided
from the host-side parameters, never by reading a device tensor, so sampling never synchronises.

Reported log-probs are those of the sampled token under softmax(logits / temperature), before top-k/top-p
truncation (softmax(logits) for greedy requests): the quantity a trainer recomputes from the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.transfers import to_device

MASK64 = 2**64 - 1
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (odd, 2^64 / golden ratio)
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    value &= MASK64
    return value - 2**64 if value >= 2**63 else value


def splitmix64(value: int) -> int:
    """SplitMix64's output function on a Python int (the reference for the tensor version); unsigned."""
    z = value & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def seed_key(seed: int) -> int:
    """A request's stream key from its seed (any int), as int64: hashed, so nearby seeds start far apart."""
    return _signed(splitmix64(seed + GAMMA))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; masking off the sign-extended bits makes it logical.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors (multiplication wraps modulo 2^64)."""
    x = (x ^ _shift_right(x, 30)) * _signed(MIX1)
    x = (x ^ _shift_right(x, 27)) * _signed(MIX2)
    return x ^ _shift_right(x, 31)


def uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1] per row, a function of (key, position) only: from the position-th output of
    the SplitMix64 stream that starts at `key`, 53 bits as a float64."""
    state = torch.add(keys, positions + 1, alpha=_signed(GAMMA))
    # The top 53 bits by arithmetic shift, in [-2^52, 2^52); shifted up by 2^52 + 1 (exact in float64).
    return (mix64(state) >> 11).double().add_(2.0**52 + 1).mul_(2.0**-53)


@dataclass
class SamplingBatch:
    """Per-row sampling settings as device tensors; a setting no row uses is None, decided on the host from
    the rows' parameters (known since each request was admitted), so which ops run is never read back from
    the device."""

    keys: torch.Tensor  # [N] int64: each row's stream key (seed_key)
    positions: torch.Tensor  # [N] long: the position, in its sequence, of the token drawn from the row
    divisor: torch.Tensor | None  # [N] float32: the temperature, 1 for greedy rows; None: all 1
    greedy: torch.Tensor | None  # [N] bool; None: no greedy row
    top_k: torch.Tensor | None  # [N] long, 0 = off; None: no sampling row truncates by top-k
    top_p: torch.Tensor | None  # [N] float32; None: no sampling row truncates by top-p
    all_greedy: bool = False

    @classmethod
    def build(
        cls, params: list[SamplingParams], keys: list[int], positions: list[int], device: torch.device
    ) -> SamplingBatch:
        """A batch from host lists (tests, offline use): through a `SlotParams` table, as the engine."""
        table = SlotParams(len(params), device)
        table.assign(list(range(len(params))), params, keys)
        rows = torch.arange(len(params), device=device)
        return table.batch(rows, torch.tensor(positions, dtype=torch.long, device=device), params)


class SlotParams:
    """Each slot's sampling parameters as device tensors, indexed by slot; written only when a request is
    admitted into the slot (`assign`), gathered by row each step (`batch`)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.device = device
        self.divisor = torch.ones(capacity, dtype=torch.float32, device=device)
        self.top_p = torch.ones(capacity, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(capacity, dtype=torch.long, device=device)
        self.greedy = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.key = torch.zeros(capacity, dtype=torch.long, device=device)

    def assign(self, slots: list[int], params: list[SamplingParams], keys: list[int]) -> None:
        """The admitted requests' parameters into their slots: one float and one integer upload."""
        floats = [[1.0 if p.greedy else p.temperature for p in params], [p.top_p for p in params]]
        ints = [slots, [p.top_k for p in params], [int(p.greedy) for p in params], list(keys)]
        divisor, top_p = to_device(torch.tensor(floats, dtype=torch.float32), self.device)
        index, top_k, greedy, key = to_device(torch.tensor(ints, dtype=torch.long), self.device)
        tables = (self.divisor, self.top_p, self.top_k, self.greedy, self.key)
        for table, values in zip(tables, (divisor, top_p, top_k, greedy.bool(), key), strict=True):
            table.index_copy_(0, index, values)

    def batch(
        self, slots: torch.Tensor, positions: torch.Tensor, params: list[SamplingParams]
    ) -> SamplingBatch:
        """Rows sampling for the sequences in `slots` ([N] device) at `positions` ([N] device); `params`
        are the rows' host-side parameters, which decide what is gathered."""
        return self.gather(slots, positions, SamplerOps.of(params))

    def gather(self, slots: torch.Tensor, positions: torch.Tensor, ops: SamplerOps) -> SamplingBatch:
        """The rows' settings for the optional ops `ops` runs (all gathered on the device: a CUDA graph
        can hold this, given `slots` and `positions` in static buffers)."""
        return SamplingBatch(
            keys=self.key[slots],
            positions=positions,
            divisor=self.divisor[slots] if ops.divisor else None,
            greedy=self.greedy[slots] if ops.greedy else None,
            top_k=self.top_k[slots] if ops.top_k else None,
            top_p=self.top_p[slots] if ops.top_p else None,
            all_greedy=ops.all_greedy,
        )


@dataclass(frozen=True)
class SamplerOps:
    """Which optional sampling ops a batch of rows runs, from their host-side parameters: the part of a
    sampling step's shape that is not a size (a CUDA graph that samples is captured per value)."""

    divisor: bool  # some sampling row has a temperature other than 1
    greedy: bool  # some row is greedy
    top_k: bool  # some sampling row truncates by top-k
    top_p: bool  # some sampling row truncates by top-p
    all_greedy: bool  # every row is greedy: argmax only

    @classmethod
    def of(cls, params: list[SamplingParams]) -> SamplerOps:
        # One plain loop: it runs every decode step over every row, in series with the GPU (issue 49's
        # host-work budget); five generator passes took 41 us at 256 rows.
        divisor = greedy = top_k = top_p = sampling = False
        for p in params:
            if p.temperature <= 0.0:  # SamplingParams.greedy, inlined
                greedy = True
                continue
            sampling = True
            divisor = divisor or p.temperature != 1.0
            top_k = top_k or p.top_k > 0
            top_p = top_p or p.top_p < 1
        return cls(divisor=divisor, greedy=greedy, top_k=top_k, top_p=top_p, all_greedy=not sampling)


def scaled_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits / T per row (T = 1 for greedy rows), float32."""
    logits = logits.float()
    return logits if batch.divisor is None else logits / batch.divisor[:, None]


def token_logprobs(scaled: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob of `tokens` under softmax(scaled logits), untruncated."""
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def sampling_probs(scaled: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each row samples from, given its scaled logits: top-k, then top-p; greedy rows are
    one-hot."""
    logits = scaled
    vocab = logits.shape[-1]
    if batch.top_k is not None:
        k = torch.where(batch.top_k > 0, batch.top_k.clamp(max=vocab), torch.full_like(batch.top_k, vocab))
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if batch.top_p is not None:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays).
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= batch.top_p[:, None]
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    if batch.greedy is not None:
        onehot = torch.zeros_like(probs).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(batch.greedy[:, None], onehot, probs)
    return probs


def draw(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row by inverse-CDF sampling with the row's own uniform u in (0, 1]: the first token
    whose float64 cumulative mass reaches u x total (which exists: u x total rounds to at most the total).
    A token of zero probability never is the first (its predecessor reached the same mass), so truncated
    tokens are never drawn."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    target = uniforms(batch.keys, batch.positions).mul_(cdf[:, -1])
    return torch.searchsorted(cdf, target[:, None]).view(-1)


def plain_tokens(scaled: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The token plain decoding draws from each row (given its scaled logits), and the distribution it was
    drawn from (an empty tensor when every row is greedy: no distribution is computed)."""
    if batch.all_greedy:
        return scaled.argmax(-1), scaled.new_zeros(0)
    probs = sampling_probs(scaled, batch)
    tokens = draw(probs, batch)
    if batch.greedy is not None:  # a greedy row's one-hot draws its argmax anyway; this keeps ties' argmax
        tokens = torch.where(batch.greedy, scaled.argmax(-1), tokens)
    return tokens, probs


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens, log-probs)."""
    scaled = scaled_logits(logits, batch)
    tokens, _ = plain_tokens(scaled, batch)
    return tokens, token_logprobs(scaled, tokens)


# The accept rule of a verify forward: accept[i] for each flat verify row, from (the row's distribution,
# the token plain decoding draws there, the draft token or -1 where none) -> bool [N].
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def coupled_accept(probs: torch.Tensor, plain: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The exact point-mass rule as a coupling with plain decoding: accept iff the draw equals the draft.

    For a draft token d and the row's distribution p, the draw x equals d with probability p(d), and given
    a rejection x is distributed as p restricted to tokens != d, renormalised: the textbook rule (accept d
    with probability p(d), else resample from the residual). Since the draw at a position depends only on
    (seed, position) and p, a seeded request emits the same tokens with or without drafts."""
    return plain == drafts
