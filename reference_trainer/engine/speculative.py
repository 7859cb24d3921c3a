"""Exact, cost-aware speculative decoding: verify per-sequence drafts of different lengths in one forward.

Acceptance rule (point-mass draft d, target distribution p = `sampling_probs` at that position): accept d
with probability p(d); on rejection emit a token from p with d removed and renormalised; when the whole
draft is accepted, emit a bonus token from p at the next position. It is realised as a coupling with plain
decoding: each position draws the token plain decoding would draw there, x = argmax p / E with E ~ Exp(1)
from the request's own generator (sampler.draw), and d is accepted iff x == d. Then P(accept) = p(d) and,
given a rejection, x is distributed as p restricted to tokens != d, renormalised — the rule above. Because
the generator is rewound so it advances by exactly one draw per emitted token, a seeded request emits the
same tokens with or without drafts, whatever the cost model decides: speculation changes speed only.

Cost awareness: on a CPU, verifying q tokens at large batch costs several decode steps (on a 2-core CPU,
a 3.25M-parameter decoder at context 128 verifying q = 9 tokens costs 1.5x a decode step at batch 1, 4.0x
at batch 64 and 5.4x at batch 256; on a GPU, where decode is memory-bound, it is far closer to 1x). Each
step the Speculator picks the verify width q maximising expected tokens per second, from a cost table of
the runner measured at attach time, corrected online by observed step times, and from the running
acceptance; q = 0 is a plain decode step.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any, Protocol

import torch

from reference_trainer.engine.sampler import SamplingBatch, draw, sampling_probs, token_logprobs
from reference_trainer.engine.sequence import Sequence

# accept[i] for each flat verify row: (probs, plain draws x, draft tokens with -1 where none) -> bool [N].
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def coupled_accept(probs: torch.Tensor, plain: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The exact point-mass rule as a coupling: accept iff the plain draw equals the draft."""
    return plain == drafts


class Drafter(Protocol):
    def draft(self, seq: Sequence, limit: int) -> list[int]: ...

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None: ...

    def on_done(self, seq: Sequence, epoch: int) -> None: ...


class CostModel:
    """Seconds per forward as a function of (batch, q tokens per row), bilinear in a measured table and
    linear extrapolation beyond it."""

    def __init__(self, table: dict[tuple[int, int], float]) -> None:
        self.table = dict(table)
        self.batches = sorted({b for b, _ in table})
        self.qs = sorted({q for _, q in table})

    @staticmethod
    def _bracket(grid: list[int], x: float) -> tuple[int, int, float]:
        if len(grid) == 1:
            return grid[0], grid[0], 0.0
        i = min(max(bisect.bisect_left(grid, x), 1), len(grid) - 1)
        lo, hi = grid[i - 1], grid[i]
        return lo, hi, (x - lo) / (hi - lo)  # outside the grid this extrapolates linearly

    def cost(self, batch: int, q: int) -> float:
        b0, b1, wb = self._bracket(self.batches, batch)
        q0, q1, wq = self._bracket(self.qs, q)
        t = self.table
        lo = t[b0, q0] + (t[b0, q1] - t[b0, q0]) * wq
        hi = t[b1, q0] + (t[b1, q1] - t[b1, q0]) * wq
        return max(1e-9, lo + (hi - lo) * wb)


@torch.inference_mode()
def measure_cost_model(
    engine: Any,
    batches: Seq[int] = (1, 4, 16, 64),
    qs: Seq[int] = (1, 2, 4, 8, 16),
    context: int = 64,
    repeats: int = 3,
) -> CostModel:
    """Time the runner's forwards on free slots (the fastest of `repeats`), the way decode and verification
    run them: each row continues a `context`-token sequence in its own cache blocks."""
    if engine.scheduler.running:
        raise RuntimeError("measure the cost model before any request runs: it writes into free slots")
    cap = engine.slots.capacity
    q_max = engine.config.max_verify_tokens
    batches = sorted({min(b, cap) for b in batches})
    qs = sorted({min(q, q_max) for q in qs} | {1})
    context = min(context, engine.max_model_len - 1)
    model, slot_mgr, dev = engine.model, engine.slots, engine.device
    table: dict[tuple[int, int], float] = {}
    for b in batches:
        slots = [slot_mgr.allocate() for _ in range(b)]
        for slot in slots:
            slot_mgr.reserve(slot, context + max(qs))
        rows = slot_mgr.rows(slots)
        starts = torch.full((b,), context, dtype=torch.long, device=dev)
        for q in qs:
            ids = torch.full((b, q), 3, dtype=torch.long, device=dev)
            times = []
            for _ in range(repeats + 1):  # the first run warms up
                _synchronize(dev)  # CUDA runs kernels asynchronously: time the work, not its launch
                t0 = time.perf_counter()
                model.forward_cached(ids, starts, slot_mgr.cache, rows, contiguous=slot_mgr.contiguous)
                _synchronize(dev)
                times.append(time.perf_counter() - t0)
            table[b, q] = min(times[1:])  # the least disturbed run: other load only ever adds time
        for slot in slots:
            slot_mgr.release(slot)
    # A forward over more rows or more tokens never costs less: smooth out timing noise.
    for i, b in enumerate(batches):
        for j, q in enumerate(qs):
            below = [table[batches[i - 1], q]] if i else []
            left = [table[b, qs[j - 1]]] if j else []
            table[b, q] = max([table[b, q], *below, *left])
    return CostModel(table)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Speculator:
    """Drafting + verification attached to an Engine: it takes over the engine's decode steps."""

    def __init__(
        self,
        drafter: Drafter,
        cost_model: CostModel | list[list[float]] | None = None,
        margin: float = 0.05,
        prior_acceptance: float = 0.7,
        prior_weight: float = 8.0,
        decay: float = 0.98,
        cost_batches: Seq[int] = (1, 4, 16, 64),
        cost_qs: Seq[int] = (1, 2, 4, 8, 16),
        cost_repeats: int = 3,
        accept_rule: AcceptRule = coupled_accept,
    ) -> None:
        if isinstance(cost_model, list):  # [[batch, q, seconds], ...]: the JSON form a TrainConfig can hold
            cost_model = CostModel({(int(b), int(q)): float(t) for b, q, t in cost_model})
        self.drafter, self.cost_model, self.margin = drafter, cost_model, margin
        self.prior_acceptance, self.prior_weight, self.decay = prior_acceptance, prior_weight, decay
        self.cost_args = {"batches": cost_batches, "qs": cost_qs, "repeats": cost_repeats}
        self.accept_rule = accept_rule
        # Decayed counts of verified draft positions: each is accepted with probability ~alpha. Decaying
        # towards the prior lets a speculator that stopped verifying (low alpha) try again later.
        self._tried, self._accepted = 0.0, 0.0
        # Observed / predicted step time, per kind: what the table misses (sampling, Python, context).
        # Verify takes decode's correction until it has been observed itself.
        self.correction: dict[str, float | None] = {"decode": 1.0, "verify": None}
        self.engine: Any = None

    def attach(self, engine: Any) -> None:
        if self.cost_model is None:
            self.cost_model = measure_cost_model(engine, **self.cost_args)
        self.engine = engine
        engine.speculator = self

    # ---- the chooser -------------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self._accepted + w * self.prior_acceptance) / (self._tried + w)

    def expected_tokens(self, draft_lens: Seq[int], q: int) -> float:
        """Tokens emitted by one verify of width q: per sequence 1 + alpha + ... + alpha^min(q, len)."""
        a = self.alpha
        geo = [0.0]
        for i in range(1, q + 1):
            geo.append(geo[-1] + a**i)
        return sum(1.0 + geo[min(q, n)] for n in draft_lens)

    def choose_width(self, draft_lens: Seq[int]) -> int:
        """Draft tokens per row to verify this step; 0 = plain decode (the default unless verifying is
        expected to beat it by `margin`)."""
        assert self.cost_model is not None
        batch, longest = len(draft_lens), max(draft_lens, default=0)
        decode_corr = self.correction["decode"] or 1.0
        verify_corr = self.correction["verify"] or decode_corr
        plain = batch / (self.cost_model.cost(batch, 1) * decode_corr)
        best_q, best_rate = 0, plain * (1.0 + self.margin)
        for q in range(1, longest + 1):
            rate = self.expected_tokens(draft_lens, q) / (self.cost_model.cost(batch, q + 1) * verify_corr)
            if rate > best_rate:
                best_q, best_rate = q, rate
        return best_q

    def _observe_time(self, kind: str, batch: int, q: int, seconds: float) -> None:
        assert self.cost_model is not None
        ratio = min(max(seconds / self.cost_model.cost(batch, q), 0.05), 20.0)
        old = self.correction[kind]
        self.correction[kind] = ratio if old is None else 0.9 * old + 0.1 * ratio

    # ---- engine hooks ------------------------------------------------------------------------------------
    def on_done(self, seq: Sequence) -> None:
        self.drafter.on_done(seq, self.engine.policy_version)

    def step(self, seqs: list[Sequence], t_start: float, occupied: dict[int, str]) -> list[Sequence]:
        """One decode step of the running sequences: plain, or a verification of their drafts."""
        engine = self.engine
        drafts = []
        for s in seqs:
            # Draft no further than the sequence may grow: its max_tokens, the cache and the verify width.
            room = min(
                s.params.max_tokens - len(s.response_ids),
                engine.max_model_len - s.length,
                engine.config.max_verify_tokens,
            )
            drafts.append(self.drafter.draft(s, room - 1) if room > 1 else [])
        q = self.choose_width([len(d) for d in drafts])
        self._tried *= self.decay
        self._accepted *= self.decay
        if q == 0:
            return self._plain(seqs, t_start, occupied)
        return self._verify(seqs, [d[:q] for d in drafts], q, t_start, occupied)

    def _plain(self, seqs: list[Sequence], t_start: float, occupied: dict[int, str]) -> list[Sequence]:
        engine = self.engine
        t0 = time.perf_counter()
        finished = engine.emit(seqs, engine.runner.decode(seqs))
        self._observe_time("decode", len(seqs), 1, time.perf_counter() - t0)
        engine.trace.engine_step(
            "decode", t_start, engine.trace.now(), occupied, engine.slots.capacity, len(seqs)
        )
        return finished

    @torch.inference_mode()
    def _verify(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        q: int,
        t_start: float,
        occupied: dict[int, str],
    ) -> list[Sequence]:
        engine = self.engine
        t0 = time.perf_counter()
        dev = engine.device
        logits = engine.runner.extend(seqs, [[s.all_ids[-1]] + d for s, d in zip(seqs, drafts, strict=True)])
        counts = [len(d) + 1 for d in drafts]  # rows of each sequence: its draft positions + the bonus
        row_of = torch.tensor([b for b, c in enumerate(counts) for _ in range(c)], device=dev)
        pos_of = torch.tensor([j for c in counts for j in range(c)], device=dev)
        flat = logits[row_of, pos_of]  # [N, V]
        gens = [engine._generators.get(s.seq_id) for s in seqs]
        batch = SamplingBatch.build([s.params for s in seqs], gens, dev).repeat(counts)
        draft_flat = torch.tensor([t for d in drafts for t in d + [-1]], dtype=torch.long, device=dev)

        greedy = flat.argmax(-1)
        if bool(batch.greedy.all()):
            plain, probs = greedy, None
        else:
            probs = sampling_probs(flat, batch)
            states = [g.get_state() if g is not None else None for g in gens]
            plain = torch.where(batch.greedy, greedy, draw(probs, batch.generators))
        if probs is None:
            probs = torch.zeros(0, device=dev)
        accept = self.accept_rule(probs, plain, draft_flat) & (draft_flat >= 0)
        emit_flat = torch.where(accept, draft_flat, plain)
        logp_flat = token_logprobs(flat, batch, emit_flat)

        accept_l, emit_l, logp_l = accept.tolist(), emit_flat.tolist(), logp_flat.tolist()
        finished: list[Sequence] = []
        emitted = drafted = accepted = draft_seqs = draft_emitted = 0
        start = 0
        for b, (seq, d) in enumerate(zip(seqs, drafts, strict=True)):
            n_acc = 0
            while n_acc < len(d) and accept_l[start + n_acc]:
                n_acc += 1
            before = len(seq.response_ids)
            done = engine._append(seq, emit_l[start : start + n_acc + 1], logp_l[start : start + n_acc + 1])
            n_out = len(seq.response_ids) - before
            if gens[b] is not None and probs.numel() and n_out < counts[b]:
                # Rewind the generator so it advances by one draw per emitted token, as plain decoding.
                gens[b].set_state(states[b])
                torch.empty(n_out, flat.shape[-1], device=dev).exponential_(generator=gens[b])
            if done:
                finished.append(seq)
            else:
                seq.num_cached = seq.length - 1  # rejected positions are rolled back by not counting them
            seq.drafted += len(d)
            seq.accepted += min(n_acc, n_out)
            self.drafter.observe(seq, len(d), n_acc)
            if d:
                draft_seqs += 1
                draft_emitted += n_out
                # Positions actually tested: the accepted ones plus the first rejected one.
                self._tried += min(n_acc + 1, len(d))
                self._accepted += n_acc
            emitted += n_out
            drafted += len(d)
            accepted += min(n_acc, n_out)
            start += counts[b]
        self._observe_time("verify", len(seqs), q + 1, time.perf_counter() - t0)
        engine.trace.engine_step(
            "verify",
            t_start,
            engine.trace.now(),
            occupied,
            engine.slots.capacity,
            emitted,
            drafted=drafted,
            accepted=accepted,
            draft_seqs=draft_seqs,
            draft_emitted=draft_emitted,
            width=q,
        )
        return finished
