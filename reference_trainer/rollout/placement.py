"""Which rollout worker runs which request, and in what order: HistoPipe (RhymeRL) and the baselines.

Pure functions over predicted work; nothing here knows about engines or Ray. A placement returns, per worker,
the indices of the units it runs, in admission order.

- `round_robin`: group g on worker g mod W, all its samples together (OpenRLHF/verl synchronous rollout
  split the prompt batch across engines this way, oblivious to length).
- `least_outstanding`: each request to the worker with the fewest outstanding requests when it is
  dispatched (verl's async server manager); for a batch dispatched at once this equalises request counts.
- `histopipe`: longest-predicted-first greedy (LPT) onto the least loaded worker, then each worker's
  queue ordered long->short on even steps and short->long on odd ones, so a worker that ended the last step
  on long work starts this one on short work. LPT's makespan is at most (4/3 - 1/(3W)) x optimal, and
  never more than total/W + the largest unit (Graham's list-scheduling bound).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reference_trainer.option import Options, option

Placement = list[list[int]]


@dataclass(frozen=True)
class Unit:
    """One request to place: its group (the prompt's position in the step) and its predicted work."""

    group: int
    work: float


def round_robin(units: Sequence[Unit], workers: int, step: int = 0) -> Placement:
    order = sorted(set(u.group for u in units))
    slot = {g: i % workers for i, g in enumerate(order)}
    placement: Placement = [[] for _ in range(workers)]
    for i, unit in enumerate(units):
        placement[slot[unit.group]].append(i)
    return placement


def least_outstanding(units: Sequence[Unit], workers: int, step: int = 0) -> Placement:
    placement: Placement = [[] for _ in range(workers)]
    for i in range(len(units)):
        target = min(range(workers), key=lambda w: (len(placement[w]), w))
        placement[target].append(i)
    return placement


def balance(works: Sequence[float], workers: int) -> Placement:
    """LPT: units by decreasing work, each onto the worker with the least work so far (ties: lowest id)."""
    placement: Placement = [[] for _ in range(workers)]
    heap = [(0.0, w) for w in range(workers)]
    for i in sorted(range(len(works)), key=lambda i: (-works[i], i)):
        load, w = heapq.heappop(heap)
        placement[w].append(i)
        heapq.heappush(heap, (load + works[i], w))
    return placement


def histopipe(units: Sequence[Unit], workers: int, step: int = 0) -> Placement:
    return reorder(balance([u.work for u in units], workers), units, step, "alternate")


ORDERS = ("fifo", "alternate", "long-first")


def reorder(placement: Placement, units: Sequence[Unit], step: int, order: str) -> Placement:
    """Each worker's queue in `order`: fifo (as placed), alternate (long->short on even steps, short->long on
    odd ones: HistoPipe's), or long-first every step (LPT order within a worker)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {', '.join(ORDERS)}")
    if order == "fifo":
        return [list(q) for q in placement]
    long_first = order == "long-first" or step % 2 == 0
    return [sorted(q, key=lambda i: (-units[i].work if long_first else units[i].work, i)) for q in placement]


PLACEMENTS: dict[str, Callable[[Sequence[Unit], int, int], Placement]] = {
    "round-robin": round_robin,
    "least-outstanding": least_outstanding,
    "histopipe": histopipe,
}


@dataclass(frozen=True)
class PlacedOptions(Options):
    """The options of a rollout over W workers (placed.PlacedRollout); `migrate` and `order` left to auto
    follow the placement (`migrates`, `queue_order`: the trainer's and the simulator's one rule)."""

    placement: str = option(
        "round-robin",
        "which worker runs which request (rollout/placement.py)",
        choices=tuple(PLACEMENTS),
        multi_worker=True,
        simulated=True,
    )
    migrate: bool | None = option(
        None,
        "straggler migration: a worker that runs dry takes not-started requests from the busiest; auto = on "
        "for histopipe placement",
        null_word="auto",
        multi_worker=True,
        simulated=True,
    )
    order: str | None = option(
        None,
        "each worker's queue order; auto = alternate for histopipe placement, else fifo",
        choices=ORDERS,
        null_word="auto",
        multi_worker=True,
        simulated=True,
    )

    @property
    def migrates(self) -> bool:
        return self.placement == "histopipe" if self.migrate is None else self.migrate

    @property
    def queue_order(self) -> str:
        return self.order or ("alternate" if self.placement == "histopipe" else "fifo")


def get_placement(name: str) -> Callable[[Sequence[Unit], int, int], Placement]:
    if name not in PLACEMENTS:
        raise ValueError(f"unknown placement {name!r}; valid: {', '.join(PLACEMENTS)}")
    return PLACEMENTS[name]


def loads(placement: Placement, works: Sequence[float]) -> list[float]:
    return [sum(works[i] for i in queue) for queue in placement]


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
