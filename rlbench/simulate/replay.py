"""Validation: replay a measured run's lengths on a cost model calibrated from the same run, and compare.

The run's baseline rollout is replayed at its own worker count and slot capacity; what the simulator
must reproduce is the run's measured bubble ratio (rlbench.metrics), step by step and overall. Only
W = 1 runs exist today: multi-worker rollout (and with it a W = 2 check) waits on the HistoPipe
multi-worker issue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlbench.errors import UserError
from rlbench.simulate import workload
from rlbench.simulate.cost import calibrate
from rlbench.simulate.policies import POLICIES, simulate_policy


def read_events(run: str | Path) -> list[dict[str, Any]]:
    path = Path(run)
    path = path / "trace.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise UserError(f"{path}: no such trace file")
    return workload._read_jsonl(path)


def validate(run: str | Path) -> dict[str, Any]:
    """Measured vs simulated bubble ratio (and rollout time) of a baseline run, per step and overall."""
    from rlbench import metrics

    events = read_events(run)
    engine_ev = [e for e in events if e.get("kind") in metrics.ENGINE_KINDS]
    workers = sorted({int(e.get("worker", 0)) for e in engine_ev})
    if len(workers) != 1:
        raise UserError(f"{run}: validation replays single-worker runs; this one has {len(workers)} workers")
    capacity = max(int(e.get("capacity", 0)) for e in engine_ev)
    measured = metrics.compute(events)
    cost = calibrate(events, source=str(run))
    trace = workload.from_run_trace(events, str(run))
    n_steps = len(trace.steps)
    pred = np.full(len(trace), float(trace.response_tokens.mean()))
    acc = np.zeros(len(trace))
    sim = simulate_policy(POLICIES["baseline"], trace, pred, acc, cost, 1, capacity, n_steps)
    rows = []
    for m, s in zip(measured["steps"], sim["steps"], strict=False):
        rows.append(
            {
                "step": m["step"],
                "measured_bubble": m["bubble_ratio"],
                "simulated_bubble": s["bubble_ratio"],
                "measured_rollout_s": m["timing_s/gen"],
                "simulated_rollout_s": s["rollout_s"],
            }
        )
    return {
        "run": str(run),
        "capacity": capacity,
        "cost_model": cost.describe(),
        "steps": rows,
        "measured_bubble": measured["summary"]["bubble_ratio"],
        "simulated_bubble": sim["bubble_ratio"],
        "measured_rollout_s": measured["summary"]["timing_s/gen"],
        "simulated_rollout_s": sim["rollout_s"],
    }
