"""Exact, cost-aware speculative decoding: verify per-sequence drafts of different lengths in one forward.

Acceptance rule (point-mass draft d, target distribution p = `sampling_probs` at that position): accept d
with probability p(d); on rejection emit a token from p with d removed and renormalised; when the whole
draft is accepted, emit a bonus token from p at the next position. It is realised as a coupling with plain
decoding: each position draws the token plain decoding would draw there, with the uniform keyed by the
request's seed and that position (sampler.draw), and d is accepted iff that token x == d. Then P(accept) =
p(d) and, given a rejection, x is distributed as p restricted to tokens != d, renormalised — the rule above.
The draw at a position depends on nothing but (seed, position) and p, so a seeded request emits the same
tokens with or without drafts, whatever the cost model decides: speculation changes speed only.

Cost awareness: on a CPU, verifying q tokens at large batch costs several decode steps (on a 2-core CPU,
a 3.25M-parameter decoder at context 128 verifying q = 9 tokens costs 1.5x a decode step at batch 1, 4.0x
at batch 64 and 5.4x at batch 256); on a GPU, where decode is memory-bound, it is close to 1x. Each step
the Speculator picks the verify width q maximising expected tokens per second (`verify_width`), from a
cost table timed at attach time through the runner's own decode and verify entry points (so under CUDA
graphs it times graph replays), corrected online by observed step times, and from the running acceptance;
q = 0 is a plain decode step. A verify costing within `margin` of a decode step is taken whenever it is
expected to emit any extra token, so drafting is never switched off where verifying is free.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any, Protocol

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.lookahead import is_lookahead
from reference_trainer.engine.sampler import SamplerOps, plain_tokens, scaled_logits, token_logprobs
from reference_trainer.engine.sequence import Sequence
from reference_trainer.engine.transfers import read_back
from reference_trainer.trace.schema import CAPTURE

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
    """Time the forwards a step runs (the fastest of `repeats`), through the runner's own entry points:
    `decode` for q = 1, `extend` (verification) for q > 1, on probe sequences in free slots that each
    continue a `context`-token sequence. So the table measures the path the engine takes: on CUDA with
    `EngineConfig.cuda_graphs`, the static shapes replayed as CUDA graphs (the untimed first run of each
    cell captures its graph); elsewhere, the eager forward at the step's own shape."""
    if engine.scheduler.running:
        raise RuntimeError("measure the cost model before any request runs: it writes into free slots")
    cap = engine.slots.capacity
    q_max = engine.config.max_verify_tokens
    batches = sorted({min(b, cap) for b in batches})
    qs = sorted({min(q, q_max) for q in qs} | {1})
    context = min(context, engine.max_model_len - 1)  # the cache holds max_verify_tokens more per slot
    runner, slot_mgr, dev = engine.runner, engine.slots, engine.device
    table: dict[tuple[int, int], float] = {}
    for b in batches:
        probes = [_probe(slot_mgr, i, context, max(qs)) for i in range(b)]
        for q in qs:
            times = []
            for _ in range(repeats + 1):  # the first run warms up (and captures the graph of its shape)
                for probe in probes:
                    probe.num_cached = context  # a decode step counts its token as cached: undo it
                _synchronize(dev)  # CUDA runs kernels asynchronously: time the work, not its launch
                t0 = time.perf_counter()
                if q == 1:
                    runner.decode(probes)
                else:
                    runner.extend(probes, [[PROBE_TOKEN] * q for _ in probes])
                _synchronize(dev)
                times.append(time.perf_counter() - t0)
            table[b, q] = min(times[1:])  # the least disturbed run: other load only ever adds time
        for probe in probes:
            slot_mgr.release(probe.slot)
    # A forward over more rows or more tokens never costs less: smooth out timing noise.
    for i, b in enumerate(batches):
        for j, q in enumerate(qs):
            below = [table[batches[i - 1], q]] if i else []
            left = [table[b, qs[j - 1]]] if j else []
            table[b, q] = max([table[b, q], *below, *left])
    return CostModel(table)


PROBE_TOKEN = 3  # any valid id: the timing does not depend on the values


def _probe(slot_mgr: Any, index: int, context: int, width: int) -> Sequence:
    """A sequence in a free slot with `context` tokens counted as cached (their K/V are whatever the slot
    holds) and room for `width` more."""
    seq = Sequence(f"cost-probe-{index}", [PROBE_TOKEN] * (context + 1), SamplingParams())
    seq.slot = slot_mgr.allocate()
    slot_mgr.reserve(seq.slot, context + width)
    seq.num_cached = context
    return seq


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def expected_tokens(draft_lens: Seq[int], q: int, alpha: float) -> float:
    """Tokens emitted by one verify of width q: per sequence 1 + alpha + ... + alpha^min(q, len)."""
    geo = [0.0]
    for i in range(1, q + 1):
        geo.append(geo[-1] + alpha**i)
    return sum(1.0 + geo[min(q, n)] for n in draft_lens)


def verify_width(
    cost_model: CostModel,
    draft_lens: Seq[int],
    alpha: float,
    margin: float,
    decode_correction: float = 1.0,
    verify_correction: float = 1.0,
) -> int:
    """The gate: how many draft tokens per row to verify this step (0 = plain decode), from the cost table
    (each kind's entry times its correction), the running acceptance `alpha` and the batch's draft lengths.

    Verifying width q pays when its expected tokens per second beat plain decoding's. A verify that costs
    more than `margin` above a decode step must beat plain decoding by `margin` (timing noise must not
    switch drafting on); one within `margin` of a decode step costs "one decode step", so any expected
    accepted token is a gain and drafting stays on. Among the widths that pass, the fastest wins."""
    batch, longest = len(draft_lens), max(draft_lens, default=0)
    decode = cost_model.cost(batch, 1) * decode_correction
    best_q, best_rate = 0, 0.0
    for q in range(1, longest + 1):
        verify = cost_model.cost(batch, q + 1) * verify_correction
        tokens = expected_tokens(draft_lens, q, alpha)
        ratio = verify / decode
        needed = batch * (1.0 if ratio <= 1.0 + margin else ratio * (1.0 + margin))
        if tokens > needed and tokens / verify > best_rate:
            best_q, best_rate = q, tokens / verify
    return best_q


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

    def choose_width(self, draft_lens: Seq[int]) -> int:
        """Draft tokens per row to verify this step (0 = plain decode): `verify_width` on the cost table
        corrected by the observed step times (verify takes decode's correction until it has been seen)."""
        assert self.cost_model is not None
        decode_corr = self.correction["decode"] or 1.0
        return verify_width(
            self.cost_model,
            draft_lens,
            self.alpha,
            self.margin,
            decode_corr,
            self.correction["verify"] or decode_corr,
        )

    def free_rows(self, batch: int, want: int) -> int:
        """The cost gate of lookahead (rollout/lookahead.py): how many of `want` more rows may join decode
        steps of `batch` rows while a step costs at most `margin` more, from the cost table. Filling the
        bubble pays only where its slots are free: on a GPU, whose decode is memory-bound, most of them; on a
        CPU, whose decode time grows with the batch, few or none, so there lookahead leaves the rollout as
        fast as plain decoding."""
        assert self.cost_model is not None
        limit = (1.0 + self.margin) * self.cost_model.cost(max(batch, 1), 1)
        n = max(0, want)
        while n > 0 and self.cost_model.cost(batch + n, 1) > limit:
            n -= 1
        return n

    def _observe_time(self, kind: str, batch: int, q: int, seconds: float) -> None:
        assert self.cost_model is not None
        ratio = min(max(seconds / self.cost_model.cost(batch, q), 0.05), 20.0)
        old = self.correction[kind]
        self.correction[kind] = ratio if old is None else 0.9 * old + 0.1 * ratio

    # ---- engine hooks ------------------------------------------------------------------------------------
    def on_done(self, seq: Sequence) -> None:
        self.drafter.on_done(seq, self.engine.policy_version)

    def step(
        self, seqs: list[Sequence], t_start: float, occupied: dict[str, str], ops: SamplerOps | None = None
    ) -> list[Sequence]:
        """One decode step of the running sequences: plain (with the engine's sampler ops for them, where it
        has them), or a verification of their drafts."""
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
            return self._plain(seqs, t_start, occupied, ops)
        return self._verify(seqs, [d[:q] for d in drafts], q, t_start, occupied)

    def _plain(
        self, seqs: list[Sequence], t_start: float, occupied: dict[str, str], ops: SamplerOps | None
    ) -> list[Sequence]:
        engine = self.engine
        t0 = time.perf_counter()
        finished = engine.emit(seqs, engine.runner.decode(seqs, ops))
        self._observe_time("decode", len(seqs), 1, time.perf_counter() - t0)
        engine.trace_forward("decode", t_start, occupied, seqs, len(seqs))
        return finished

    @torch.inference_mode()
    def _verify(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        q: int,
        t_start: float,
        occupied: dict[str, str],
    ) -> list[Sequence]:
        engine = self.engine
        static, width = engine.runner.static, 1 + max(len(d) for d in drafts)
        capture_start = engine.trace.now()
        if static is not None and static.ensure_captured(
            len(seqs), width, max(s.num_cached for s in seqs) + width
        ):  # a verify width's first use: its capture is its own event, outside the verify forward's time
            t_start = engine.trace.now()
            engine.trace.add({"kind": CAPTURE, "t_start": capture_start, "t_end": t_start, "graphs": 1})
        t0 = time.perf_counter()
        scored = engine.runner.extend(seqs, [[s.last_token] + d for s, d in zip(seqs, drafts, strict=True)])
        counts = [len(d) + 1 for d in drafts]  # rows of each sequence: its draft positions + the bonus
        params = [s.params for s, c in zip(seqs, counts, strict=True) for _ in range(c)]
        # Row j of a sequence scores the token at position length + j: the draw plain decoding makes there.
        batch = engine.sampling.batch(scored.slots, scored.positions, params)
        draft_flat = scored.drafts
        assert draft_flat is not None
        scaled = scaled_logits(scored.logits, batch)
        plain, probs = plain_tokens(scaled, batch)
        accept = self.accept_rule(probs, plain, draft_flat) & (draft_flat >= 0)
        emit_flat = torch.where(accept, draft_flat, plain)
        logp_flat = token_logprobs(scaled, emit_flat)

        accept_l, emit_l, logp_l = read_back(accept, emit_flat, logp_flat)  # the step's one read-back
        finished: list[Sequence] = []
        emitted = drafted = accepted = draft_seqs = draft_emitted = ahead = 0
        start = 0
        for b, (seq, d) in enumerate(zip(seqs, drafts, strict=True)):
            n_acc = 0
            while n_acc < len(d) and accept_l[start + n_acc]:
                n_acc += 1
            before = len(seq.response_ids)
            emit = [int(t) for t in emit_l[start : start + n_acc + 1]]
            done = engine._append(seq, emit, logp_l[start : start + n_acc + 1])
            n_out = len(seq.response_ids) - before
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
            ahead += n_out if is_lookahead(seq.seq_id) else 0
            drafted += len(d)
            accepted += min(n_acc, n_out)
            start += counts[b]
        self._observe_time("verify", len(seqs), q + 1, time.perf_counter() - t0)
        engine.trace_forward(
            "verify",
            t_start,
            occupied,
            seqs,
            emitted,
            ahead,
            drafted=drafted,
            accepted=accepted,
            draft_seqs=draft_seqs,
            draft_emitted=draft_emitted,
            width=q,
        )
        return finished
