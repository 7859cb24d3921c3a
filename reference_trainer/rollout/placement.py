"""Each engine's queue order and the length predictor of the multi-engine rollout; which engine runs which
request is the dispatch policy's (dispatch.py).

- `reorder`: each engine's queue as dispatched (fifo), long->short on even steps and short->long on odd ones
  (alternate: HistoPipe's, so an engine that ended the last step on long work starts this one on short
  work), or longest first on every step (long-first: LPT order within an engine).
- `LengthHistory`: a prompt's predicted response length, the work a length-aware policy dispatches by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reference_trainer.rollout.dispatch import ORDERS, Unit


def reorder(queues: list[list[int]], units: Sequence[Unit], step: int, order: str) -> list[list[int]]:
    """Each engine's queue (indices into `units`) in `order` (ORDERS)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {', '.join(ORDERS)}")
    if order == "fifo":
        return [list(q) for q in queues]
    long_first = order == "long-first" or step % 2 == 0
    return [sorted(q, key=lambda i: (-units[i].work if long_first else units[i].work, i)) for q in queues]


class LengthHistory:
    """Predicted response length per prompt: the mean length of its samples in the last epoch that ran it;
    for a prompt never seen, a least-squares line through (prompt tokens, mean response length) of the
    prompts seen so far (prompt length is the one feature every task has); before any history, a constant."""

    def __init__(self, default: float = 1.0) -> None:
        self.default = default
        self.last: dict[str, float] = {}
        self._fit = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, sum x, sum y, sum xx, sum xy over recorded prompts

    def record(self, prompt_id: str, prompt_tokens: int, response_lengths: Sequence[int]) -> None:
        mean = sum(response_lengths) / len(response_lengths)
        self.last[prompt_id] = mean
        x, fit = float(prompt_tokens), self._fit
        for k, v in enumerate((1.0, x, mean, x * x, x * mean)):
            fit[k] += v

    def prior(self, prompt_tokens: int) -> float:
        n, sx, sy, sxx, sxy = self._fit
        if n == 0:
            return self.default
        denom = n * sxx - sx * sx
        if n < 2 or denom <= 1e-9:
            return sy / n
        slope = (n * sxy - sx * sy) / denom
        return max(1.0, (sy - slope * sx) / n + slope * prompt_tokens)

    def predict(self, prompt_id: str, prompt_tokens: int) -> float:
        seen = self.last.get(prompt_id)
        return seen if seen is not None else self.prior(prompt_tokens)

    def state_dict(self) -> dict[str, Any]:
        return {"last": dict(self.last), "fit": list(self._fit)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last = {k: float(v) for k, v in state["last"].items()}
        self._fit = [float(v) for v in state["fit"]]
