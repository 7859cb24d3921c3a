"""Validation: replay a measured run's lengths on a cost model fitted to the same run, and compare.

The run's baseline rollout (W = 1, or round-robin placement over W Ray workers) is replayed at its own
worker count and per-worker slot capacity; what the simulator must reproduce is the run's measured bubble
ratio (reference_trainer.trace.metrics), step by step and overall. Beside those timings, the work: engine
forwards and slot-steps (occupied slots summed over the forwards), counted in the trace and in the simulated
schedule with no clock. The scheduler mirrors the engine's, so on the run's own lengths the two counts are
equal whatever the machine's load did to the timings.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics
from reference_trainer.trace.schema import FORWARD_KINDS
from reference_trainer.trace.steps import worker_capacities
from rlbench.simulate import workload
from rlbench.simulate.cost import fit_run
from rlbench.simulate.modes import SIM_MODES
from rlbench.simulate.scheduler import simulate_mode

WORK = ("measured_forwards", "simulated_forwards", "measured_slot_steps", "simulated_slot_steps")


def read_events(run: str | Path) -> list[dict[str, Any]]:
    path = Path(run)
    path = path / "trace.jsonl" if path.is_dir() else path
    if not path.exists():  # one that exists is read as a regular file (records.read_jsonl says why not)
        raise UserError(f"{path}: no such trace file")
    return workload.read_rows(path)


def validate(run: str | Path) -> dict[str, Any]:
    """Measured vs simulated bubble ratio, rollout time and work (forwards, slot-steps) of a baseline run,
    per step and overall."""
    events = read_events(run)
    engine_ev = [e for e in events if e.get("kind") in FORWARD_KINDS]
    if not engine_ev:
        raise UserError(f"{run}: the trace has no engine steps to replay")
    caps = worker_capacities(events)  # per worker
    workers, capacity = len(caps), max(caps.values())
    measured = metrics.compute(events)
    cost = fit_run(events, source=str(run))
    trace = workload.from_run_trace(events, str(run))
    n_steps = len(trace.steps)
    pred = np.full(len(trace), float(trace.response_tokens.mean()))
    acc = np.zeros(len(trace))
    sim = simulate_mode(SIM_MODES["baseline"], trace, pred, acc, cost, workers, capacity, n_steps)
    forwards = Counter(int(e.get("step", 0)) for e in engine_ev)
    slot_steps: Counter[int] = Counter()
    for e in engine_ev:
        slot_steps[int(e.get("step", 0))] += int(e.get("active_slots", 0))
    rows = []
    for m, s in zip(measured["steps"], sim["steps"], strict=False):
        rows.append(
            {
                "step": m["step"],
                "measured_bubble": m["bubble_ratio"],
                "simulated_bubble": s["bubble_ratio"],
                "measured_rollout_s": m["timing_s/gen"],
                "simulated_rollout_s": s["rollout_s"],
                "measured_forwards": forwards[m["step"]],
                "simulated_forwards": s["forwards"],
                "measured_slot_steps": slot_steps[m["step"]],
                "simulated_slot_steps": s["slot_steps"],
            }
        )
    return {
        "run": str(run),
        "workers": workers,
        "capacity": capacity,
        "cost_model": cost.describe(),
        "steps": rows,
        "measured_bubble": measured["summary"]["bubble_ratio"],
        "simulated_bubble": sim["bubble_ratio"],
        "measured_rollout_s": measured["summary"]["timing_s/gen"],
        "simulated_rollout_s": sim["rollout_s"],
        **{key: sum(r[key] for r in rows) for key in WORK},
    }
