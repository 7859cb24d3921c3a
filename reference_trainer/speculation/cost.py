"""When a verify pays: a cost table of forwards (batch, tokens per row) and the width gate over it.

On a CPU, verifying q tokens at large batch costs several decode steps (on a 2-core CPU, a 3.25M-parameter
decoder at context 128 verifying q = 9 tokens costs 1.5x a decode step at batch 1, 4.0x at batch 64 and 5.4x
at batch 256); on a GPU, where decode is memory-bound, it is close to 1x. So the speculator picks each
step the verify width that maximises expected tokens per second (`verify_width`), from a table the engine
times through its own forwards (`Engine.time_forwards`) and the running acceptance; width 0 is a plain decode
step.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the Speculator's options are read without torch
    from reference_trainer.engine.engine import Engine


class ForwardCosts:
    """Seconds per forward as a function of (batch, q tokens per row), bilinear in a measured table and
    linear extrapolation beyond it."""

    def __init__(self, table: dict[tuple[int, int], float]) -> None:
        self.table = dict(table)
        self.batches = sorted({b for b, _ in table})
        self.qs = sorted({q for _, q in table})

    @classmethod
    def from_rows(cls, rows: list[list[float]]) -> ForwardCosts:
        """[[batch, q, seconds], ...]: the JSON form a TrainConfig holds (option spec.cost_model)."""
        return cls({(int(b), int(q)): float(t) for b, q, t in rows})

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


def measure_cost_model(
    engine: Engine,
    batches: Seq[int] = (1, 4, 16, 64),
    qs: Seq[int] = (1, 2, 4, 8, 16),
    context: int = 64,
    repeats: int = 3,
) -> ForwardCosts:
    """The engine's forwards timed at every (batch, q) (`Engine.time_forwards`: decode for q = 1, verify
    for q > 1, the path the engine takes, graphs included), made monotone: a forward over more rows or more
    tokens never costs less, so timing noise is smoothed out."""
    table = engine.time_forwards(batches, qs, context, repeats)
    batches_, qs_ = sorted({b for b, _ in table}), sorted({q for _, q in table})
    for i, b in enumerate(batches_):
        for j, q in enumerate(qs_):
            below = [table[batches_[i - 1], q]] if i else []
            left = [table[b, qs_[j - 1]]] if j else []
            table[b, q] = max([table[b, q], *below, *left])
    return ForwardCosts(table)


def expected_tokens(draft_lens: Seq[int], q: int, alpha: float) -> float:
    """Tokens emitted by one verify of width q: per sequence 1 + alpha + ... + alpha^min(q, len)."""
    geo = [0.0, *itertools.accumulate(alpha**i for i in range(1, q + 1))]
    return sum(1.0 + geo[min(q, n)] for n in draft_lens)


def verify_width(
    cost_model: ForwardCosts,
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
