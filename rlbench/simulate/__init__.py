"""Trace-driven cluster simulator: SortedRL / HistoSpec / HistoPipe at 1 to thousands of rollout workers.

workload.py    length traces (JSONL format, conversion from a run's trace.jsonl, synthetic generator)
calibration.py GPU calibrations: costs measured on a GPU per model shape, one committed file each
gpu_replay.py  a run's own engine schedule replayed through a calibration (compare, profile)
cost.py        the simulator's cost models: measured presets (calibration.py), the roofline (H100/H200 x
               1.5B/7B/32B) and the fit to a run
engine.py      continuous batching over slots, event-driven per worker, vectorised across workers
modes.py       the trainer's modes (reference_trainer/modes.py) + options -> SimModes, the simulator's knobs
jobs.py        the trace's groups as a stream; a step's outstanding sequences
scheduler.py   the modes' schedulers, step by step, and the metrics of each step
pipeline.py    a rollout run ahead of the update (async): rollout and trainer as two pools, pipelined
replay.py      validation: a measured run replayed on a cost model fitted to itself
whatif.py      what each mode would buy on lengths rlbench did not run (observed servers, imports)
config.py      one `rlbench simulate` run as a checked SimConfig, and the run
(simulate.json -> report.html is rlbench/report/simulate_report.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from rlbench.simulate.cost import CostModel
from rlbench.simulate.modes import SimMode, parse_sim_modes
from rlbench.simulate.pipeline import AHEAD_ON_ONE, run_ahead
from rlbench.simulate.scheduler import simulate_mode
from rlbench.simulate.workload import LengthTrace, fill_predictions


def _schedule(p: SimMode) -> SimMode:
    """What a replay depends on: the knobs, not the names (max_staleness only where work is kept)."""
    return replace(p, name="", mode="", options=(), max_staleness=p.max_staleness if p.partial else 0)


def _workload(
    trace: LengthTrace, steps: int, groups_per_worker: int | None, rank_corr: float, acc: np.ndarray
) -> dict[str, Any]:
    """The sweep's workload: the trace's, the steps replayed, the scaling, where predictions came from."""
    return {
        **trace.summary(),
        "steps_simulated": steps,
        "scaling": "weak" if groups_per_worker else "strong",
        "groups_per_worker": groups_per_worker,
        "predicted_lengths": "trace" if not np.isnan(trace.predicted).all() else f"rank_corr={rank_corr}",
        "acceptance_mean": float(acc.mean()),
    }


def simulate(
    trace: LengthTrace,
    cost: CostModel,
    workers: list[int],
    modes: list[str],
    capacity: int,
    steps: int | None = None,
    groups_per_worker: int | None = None,
    mode_options: dict[str, Any] | None = None,
    acceptance: float = 0.7,
    rank_corr: float = 0.8,
    max_prefill_tokens: float = 8192,
    seed: int = 0,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
) -> dict[str, Any]:
    """Every (mode, worker count). `modes` are registry names, optionally with options of their own
    (NAME:KEY=VALUE...); `mode_options` go to every mode that takes them. `groups_per_worker` set = weak
    scaling (B = groups_per_worker * W). `progress(result, done, total)` hears of each result as it is
    replayed (a long sweep shows its way)."""
    t0 = time.perf_counter()
    sim_modes = parse_sim_modes(modes, mode_options)
    pred = fill_predictions(trace, rank_corr, seed)
    acc = np.where(np.isnan(trace.acceptance), acceptance, trace.acceptance)
    steps = steps or len(trace.steps)
    results, not_modelled = [], []
    for w in workers:
        base: dict[str, Any] | None = None
        replayed: dict[SimMode, dict[str, Any]] = {}  # by schedule: an ahead mode's synchronous schedule
        b = groups_per_worker * w if groups_per_worker else None

        def replay(mode: SimMode, n: int, b: int | None = b) -> dict[str, Any]:
            return simulate_mode(mode, trace, pred, acc, cost, n, capacity, steps, b, max_prefill_tokens)

        for p in sim_modes:
            if p.ahead and w < 2:  # two pools need two devices
                not_modelled.append({"mode": p.name, "workers": w, "why": AHEAD_ON_ONE})
                continue
            if p.ahead:
                r = run_ahead(p, replay, cost, w, together=replayed.get(_schedule(replace(p, ahead=False))))
            else:
                r = replayed[_schedule(p)] = replay(p, w)
            base = base or r
            r["speedup"] = base["step_time_s"] / r["step_time_s"] if r["step_time_s"] else None
            r["rollout_speedup"] = base["rollout_s"] / r["rollout_s"] if r["rollout_s"] else None
            results.append(r)
            if progress is not None:
                progress(r, len(results) + len(not_modelled), len(workers) * len(sim_modes))
    return {
        "workload": _workload(trace, steps, groups_per_worker, rank_corr, acc),
        "cluster": {
            "workers": workers,
            "capacity_per_worker": capacity,
            "max_prefill_tokens": max_prefill_tokens,
        },
        "cost_model": {"name": cost.name, **cost.describe()},
        "modes": {p.name: {"mode": p.mode, "options": dict(p.options)} for p in sim_modes},
        "results": results,
        "not_modelled": not_modelled,
        "elapsed_s": time.perf_counter() - t0,
    }
