"""What a rollout over W engines does when its engines' work goes uneven or one of them is lost: the one rule
for each, shared by the synchronous baseline (placed.py) and the controller of every other mode (multi.py).

- Migration: an engine that runs dry (free slots, nothing waiting) takes requests that have not started yet
  from the engine with the most predicted work left: about half the gap between them, and only requests
  whose move narrows it (so two engines never pass the same request back and forth).
- Loss: a dead engine is retired from the pool, the trace marks it (an `engine_lost` event naming it, with
  the step and how many of its requests go elsewhere), and a run with no engine left ends in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from reference_trainer.rollout.slots import WorkerPoolError
from reference_trainer.rollout.workers import WorkerPool
from reference_trainer.trace.schema import engine_lost_event


def steal_plan(
    thief: int,
    waiting: Sequence[Sequence[str]],
    left: Callable[[int], float],
    work: Mapping[str, float],
) -> tuple[int, list[str]] | None:
    """(donor, request ids) for engine `thief`, or None: the donor is the engine (other than the thief) with
    requests waiting and the most predicted work `left`; the ids come from the back of its queue `waiting`,
    their predicted `work` adding up to about half the gap (the first one only if it alone narrows it)."""
    donors = [w for w in range(len(waiting)) if w != thief and waiting[w]]
    if not donors:
        return None
    donor = max(donors, key=left)
    diff = left(donor) - left(thief)
    chosen: list[str] = []
    moved = 0.0
    for seq_id in reversed(waiting[donor]):
        if moved + work[seq_id] > (diff / 2 if chosen else diff - 1e-9):
            break
        chosen.append(seq_id)
        moved += work[seq_id]
    return (donor, chosen) if chosen else None


def retire_engine(pool: WorkerPool, lost: set[int], worker: int, requests: int) -> bool:
    """Mark `worker` lost (retired from `pool`, an `engine_lost` event in its trace); False if it already was
    (a slice it had in flight reports the death again). No engine left is one line."""
    if worker in lost:
        return False
    lost.add(worker)
    pool.retire(worker)
    pool.trace.add(engine_lost_event(pool.trace.now(), pool.trace.step, worker, requests))
    if len(lost) == pool.size:
        raise WorkerPoolError(f"every one of the {pool.size} rollout engines was lost")
    return True
