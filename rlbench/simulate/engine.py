"""Continuous batching on W workers at once: event-driven per worker, vectorised across workers.

Each worker mirrors the reference engine's scheduler: when a slot is free and work is queued, queued
sequences are admitted in order into the next forward, which emits each one's first token. With nothing
running that forward is a prefill of their own; otherwise they ride in the decode (or k-draft verify) of the
running sequences, which costs that forward `cost.riding` more. The engine admits at once where an
admission costs no more than it adds (the CPU); a GPU engine's admission gate, which may hold admissions
back a few forwards to spare an eager step, is not modelled here (the GPU replay of a trace has it).
A sequence that emits `e` tokens per forward (1, or the expected accepted length under speculation) needs
ceil((length - 1) / e) forwards after the one that admitted it.

Between two events of a worker (an admission or a finish) its batch is fixed, so a whole run of decode
forwards is one "round": its time is the per-forward cost at the run's mid-point context times its
length (exact when the cost is linear in context, which the roofline is on either side of its knee).
All workers advance one round per loop iteration, so the Python loop runs (events per worker) times,
not (events x workers) times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlbench.simulate.cost import CostModel

INF = np.iinfo(np.int64).max // 4


@dataclass
class Queues:
    """Per-worker work in admission order, padded to (W, Q); `length` marks the real entries."""

    tokens: np.ndarray  # response tokens still to generate (>= 1)
    ctx0: np.ndarray  # tokens the prefill processes: prompt (+ tokens kept from an earlier step)
    rate: np.ndarray  # tokens emitted per decode/verify forward
    length: np.ndarray  # (W,) queue lengths


@dataclass
class Rounds:
    """What happened: (R, W) arrays, one row per round; `busy` excludes the per-forward host gap."""

    t0: np.ndarray
    busy: np.ndarray
    gap: np.ndarray
    occupied: np.ndarray
    it0: np.ndarray  # forwards done before the round (decode/verify forwards, with admissions or not)
    k: np.ndarray  # decode forwards in the round (0 for a prefill; 1 for a decode with admissions riding)
    prefill: np.ndarray  # 1 where the round is a prefill (one forward), else 0

    def _done(self, horizon: np.ndarray | float) -> np.ndarray:
        """The share of each round done by `horizon`."""
        span = self.busy + self.gap
        frac = np.clip((horizon - self.t0) / np.where(span > 0, span, 1.0), 0.0, 1.0)
        return np.where(span > 0, frac, (self.t0 < horizon).astype(float))

    def upto(self, horizon: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per worker, up to `horizon`: busy time, busy slot-time, and decode forwards completed."""
        frac = self._done(horizon)
        busy = (self.busy * frac).sum(axis=0)
        slot_time = (self.busy * self.occupied * frac).sum(axis=0)
        forwards = np.floor(self.k * frac + 1e-9).sum(axis=0)
        return busy, slot_time, forwards

    def work(self, horizon: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Per worker, up to `horizon`: forwards started (prefills and decode/verify forwards) and slot-steps
        (occupied slots summed over them): the work a trace counts, with no clock in it."""
        frac = self._done(horizon)
        forwards = self.prefill * (frac > 0) + np.floor(self.k * frac + 1e-9)
        return forwards.sum(axis=0), (forwards * self.occupied).sum(axis=0)


@dataclass
class Result:
    admit_t: np.ndarray  # (W, Q) start of the forward that admitted it; inf if never
    admit_it: np.ndarray  # (W, Q) the worker's decode-forward count once its first token is out
    finish_t: np.ndarray  # (W, Q)
    end_t: np.ndarray  # (W,) when the worker ran out of work
    rounds: Rounds


class _Slots:
    """Every worker's slots and clock during `run`: (W, width) slot arrays, (W,) counters, (W, Q) results."""

    def __init__(self, queues: Queues, capacity: int) -> None:
        n_w, n_q = queues.tokens.shape
        width = min(capacity, n_q)  # a worker never holds more sequences than its queue: narrower slot arrays
        self.queues, self.cap, self.cols = queues, capacity, np.arange(width)
        self.need = np.where(
            np.arange(n_q)[None, :] < queues.length[:, None],
            np.ceil(np.maximum(queues.tokens - 1, 0) / queues.rate).astype(np.int64),
            0,
        )
        self.idx = np.full((n_w, width), -1, dtype=np.int64)
        self.target = np.full((n_w, width), INF, dtype=np.int64)  # forward count at which the slot ends
        self.ctx = np.zeros((n_w, width))  # context at admission (after the first token)
        self.rate = np.zeros((n_w, width))
        self.admit = np.zeros((n_w, width), dtype=np.int64)
        self.live = np.zeros(n_w, dtype=np.int64)
        self.qptr = np.zeros(n_w, dtype=np.int64)
        self.it = np.zeros(n_w, dtype=np.int64)
        self.t = np.zeros(n_w)
        self.admit_t = np.full((n_w, n_q), np.inf)
        self.admit_it = np.zeros((n_w, n_q), dtype=np.int64)
        self.finish_t = np.full((n_w, n_q), np.inf)

    def decode(
        self, decode: np.ndarray, admit: np.ndarray, cost: CostModel, q: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The round's decode forwards per worker, its context at the round's start, and the busy time of
        the workers that only decode (those with admissions riding are timed in `take`)."""
        active = self.idx >= 0
        k = np.where(decode, np.min(self.target, axis=1) - self.it, 0)
        # admissions riding a decode make it one forward long; a worker whose admissions are a prefill of
        # their own (nothing running) decodes nothing in this round, whatever the others do
        k = np.where(admit & decode, 1, np.maximum(k, 0))
        ctx_now = np.where(active, self.ctx + self.rate * (self.it[:, None] - self.admit), 0.0).sum(axis=1)
        grow = np.where(active, self.rate, 0.0).sum(axis=1)
        mid = ctx_now + grow * np.maximum(k - 1, 0) / 2.0
        busy = np.where(decode & ~admit, k * cost.decode(self.live.astype(float), mid, q), 0.0)
        return k, ctx_now, busy

    def take(
        self,
        admit: np.ndarray,
        decode: np.ndarray,
        k: np.ndarray,
        ctx_now: np.ndarray,
        cost: CostModel,
        q: float,
        max_prefill_tokens: float,
    ) -> np.ndarray:
        """Admit queued sequences into free slots (a prefill of their own, or riding the decode); the busy
        time of the admitting forward per worker."""
        queues, cap, cols = self.queues, self.cap, self.cols
        n_q = queues.tokens.shape[1]
        waiting = queues.length - self.qptr
        m = np.where(admit, np.minimum(cap - self.live, waiting), 0)
        if np.isfinite(max_prefill_tokens):
            cand = np.take_along_axis(queues.ctx0, np.minimum(self.qptr[:, None] + cols, n_q - 1), axis=1)
            fits = (np.maximum.accumulate(cand, axis=1) * (cols + 1) <= max_prefill_tokens) | (cols == 0)
            m = np.minimum(m, fits.sum(axis=1))
        first = self.it + k  # the decode-forward count once the admitting forward is done
        free = self.idx < 0
        rank = np.cumsum(free, axis=1)
        take = free & (rank <= m[:, None])
        qi = np.where(take, self.qptr[:, None] + rank - 1, 0)
        ctx0 = np.take_along_axis(queues.ctx0, qi, axis=1)
        self.idx = np.where(take, qi, self.idx)
        self.target = np.where(take, first[:, None] + np.take_along_axis(self.need, qi, axis=1), self.target)
        self.ctx = np.where(take, ctx0 + 1.0, self.ctx)
        self.rate = np.where(take, np.take_along_axis(queues.rate, qi, axis=1), self.rate)
        self.admit = np.where(take, first[:, None], self.admit)
        w_take, c_take = np.nonzero(take)
        self.admit_t[w_take, qi[w_take, c_take]] = self.t[w_take]
        self.admit_it[w_take, qi[w_take, c_take]] = first[w_take]
        tok = np.where(take, ctx0, 0.0)
        n_tok, sq = tok.sum(axis=1), (tok * tok).sum(axis=1)
        busy = np.where(admit & (self.live == 0), cost.prefill(m, n_tok, sq), 0.0)
        if decode.any():  # `live` is still the running rows: the admitted ride in their forward
            riding = admit & decode
            step = cost.decode((self.live + m).astype(float), np.where(riding, ctx_now, 0.0), q)
            busy += np.where(riding, step + cost.riding(m, n_tok, sq), 0.0)
        self.qptr += m
        self.live += m
        return busy

    def finish(self, ran: np.ndarray) -> None:
        """Free the slots whose sequences are done once the round is over (on the workers that `ran`)."""
        done = (self.idx >= 0) & (self.target <= self.it[:, None]) & ran[:, None]
        if done.any():
            w_d, c_d = np.nonzero(done)
            self.finish_t[w_d, self.idx[w_d, c_d]] = self.t[w_d]
            self.idx[done] = -1
            self.target[done] = INF
            self.live -= done.sum(axis=1)


COUNTS = ("it0", "k", "prefill")  # the integer fields of Rounds


def run(
    queues: Queues, capacity: int, cost: CostModel, q: float = 1.0, max_prefill_tokens: float = np.inf
) -> Result:
    """Simulate every worker until its queue is empty; `q` = query tokens per sequence per forward.

    A prefill admits the longest prefix of the waiting queue with (longest prompt x count) within
    `max_prefill_tokens`, at least one sequence (the reference scheduler's rule)."""
    n_w = queues.tokens.shape[0]
    s = _Slots(queues, int(capacity))
    rec: dict[str, list[np.ndarray]] = {k: [] for k in ("t0", "busy", "gap", "occupied", *COUNTS)}
    while True:
        admit = (s.live < s.cap) & (queues.length - s.qptr > 0)
        prefill = admit & (s.live == 0)  # nothing runs: the admissions are a forward of their own
        decode = s.live > 0  # a decode round; with admissions riding, one forward long
        if not (admit.any() or decode.any()):
            break
        busy, k, ctx_now = np.zeros(n_w), np.zeros(n_w, dtype=np.int64), np.zeros(n_w)
        if decode.any():
            k, ctx_now, busy = s.decode(decode, admit, cost, q)
        if admit.any():
            busy = busy + s.take(admit, decode, k, ctx_now, cost, q, max_prefill_tokens)
        gap = np.where(prefill, 1, k) * cost.gap
        row = (s.t.copy(), busy, gap, s.live.copy(), s.it.copy(), k, prefill.astype(np.int64))
        for key, val in zip(rec, row, strict=True):
            rec[key].append(val)
        s.t = s.t + busy + gap
        s.it = s.it + k
        s.finish(admit | decode)
    rounds = Rounds(
        **{
            key: np.stack(v) if v else np.zeros((0, n_w), dtype=np.int64 if key in COUNTS else float)
            for key, v in rec.items()
        }
    )
    return Result(s.admit_t, s.admit_it, s.finish_t, s.t, rounds)
