"""A rollout run ahead of the update (modes async, sorted+async) as the simulator runs it: rollout and trainer
as two pools of the same W devices, the steps pipelined under the staleness bound k; docs/simulate.md ("A
rollout run ahead") says how the pools are split and why. Per step t, with R and U the rollout and update
times:

    rollout t starts at max(end of rollout t-1, end of update t-k-1)   (the weights of step t - k are out)
    update t starts at max(end of rollout t, end of update t-1)

k = 0 is the synchronous schedule on split pools. On one device there is nothing to split: the two would
share it, which the cost model does not describe, so W = 1 is not modelled (`simulate` lists it apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rlbench.simulate.cost import CostModel
from rlbench.simulate.modes import SimMode
from rlbench.simulate.scheduler import totals

AHEAD_ON_ONE = "rollout and trainer as two pools need two devices; on one they would share it (not modelled)"


def trainer_splits(workers: int, rollout_s: float, update_s: float) -> list[int]:
    """The trainer pool sizes tried on `workers` devices: the balanced share, a quarter and a half (each
    1..workers-1, without repeats)."""
    total = rollout_s + update_s
    balanced = round(workers * update_s / total) if total > 0 else 1
    return sorted({min(workers - 1, max(1, n)) for n in (balanced, workers // 4, workers // 2)})


def pipeline(rollout: list[float], update: list[float], k: int) -> dict[str, list[float]]:
    """The pipelined schedule of per-step rollout and update times at staleness bound k: per step, its time
    (between two updates' ends), the trainer's wait for samples and the rollout's wait for weights."""
    r_end: list[float] = []
    u_end: list[float] = []
    out: dict[str, list[float]] = {"step_time_s": [], "trainer_wait_s": [], "rollout_wait_s": []}
    for t, (r, u) in enumerate(zip(rollout, update, strict=True)):
        prev_r = r_end[-1] if r_end else 0.0
        prev_u = u_end[-1] if u_end else 0.0
        weights = u_end[t - k - 1] if t - k - 1 >= 0 else 0.0
        start = max(prev_r, weights)
        r_end.append(start + r)
        begin = max(r_end[-1], prev_u)
        u_end.append(begin + u)
        out["step_time_s"].append(u_end[-1] - prev_u)
        out["trainer_wait_s"].append(begin - prev_u)
        out["rollout_wait_s"].append(start - prev_r)
    return out


def run_ahead(
    sim_mode: SimMode,
    replay: Callable[[SimMode, int], dict[str, Any]],
    cost: CostModel,
    workers: int,
    together: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`sim_mode` (an ahead mode) on `workers` devices split into two pools. `replay(mode, n)`: a synchronous
    mode's replay on n workers (scheduler.simulate_mode with the run's trace, groups and settings bound);
    `together`: its strategy's replay on all `workers` (made here when not given), which sets the split."""
    inner = replace(sim_mode, ahead=False)
    if workers < 2:
        raise ValueError(AHEAD_ON_ONE)
    together = together or replay(inner, workers)
    best: tuple[float, int, dict[str, Any], list[dict[str, Any]], dict[str, list[float]]] | None = None
    for w_t in trainer_splits(workers, together["rollout_s"], together["update_s"]):
        pool = replay(inner, workers - w_t)
        rows = [{**s, "update_s": cost.update(s["trained_tokens"], w_t)} for s in pool["steps"]]
        times = pipeline(
            [r["rollout_s"] for r in rows], [r["update_s"] for r in rows], sim_mode.max_staleness
        )
        if best is None or sum(times["step_time_s"]) < best[0]:
            best = (sum(times["step_time_s"]), w_t, pool, rows, times)
    total, w_t, pool, rows, times = best  # type: ignore[misc]
    for key, values in times.items():
        for row, value in zip(rows, values, strict=True):
            row[key] = value
    return {
        "policy": sim_mode.name,
        "mode": sim_mode.mode,
        "mode_options": dict(sim_mode.options),
        "workers": workers,
        "draft_len": pool["draft_len"],
        **totals(rows, workers - w_t),
        "trainer_workers": w_t,
        "rollout_workers": workers - w_t,
        "trainer_wait_share": sum(times["trainer_wait_s"]) / total if total else None,
        "rollout_wait_share": sum(times["rollout_wait_s"]) / total if total else None,
        "steps": rows,
    }
