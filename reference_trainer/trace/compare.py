"""Comparing runs measured side by side (modes taking their steps in turn: `rlbench compare`, reproductions,
benchmarks), from each run's per-step metrics and summary (metrics.py): the per-round spread of a speed-up,
and whether the machine's load drifted while they ran."""

from __future__ import annotations

import statistics
from typing import Any

Event = dict[str, Any]

# The update costs about the same per token it processes in every mode (up to ~25% apart on a
# quiet machine: shorter micro-batches are cheaper per token), so runs whose update cost per token differs by
# more than this factor were measured under different machine load, and their ratios carry that drift.
DRIFT_TOLERANCE = 1.5


def step_speedups(steps_by_run: dict[str, list[Event]], baseline: str) -> dict[str, dict[str, float | None]]:
    """Per run, the step-time speed-up over `baseline` in each round (step k of both, run back to back) and
    its median, min and max: the spread one interleaved comparison shows."""
    base = {s["step"]: s.get("step_time_s") for s in steps_by_run.get(baseline, [])}
    out: dict[str, dict[str, float | None]] = {}
    for name, steps in steps_by_run.items():
        ratios = sorted(r for s in steps if (r := _quotient(base.get(s["step"]), s.get("step_time_s"))))
        out[name] = {
            "median": statistics.median(ratios) if ratios else None,
            "min": ratios[0] if ratios else None,
            "max": ratios[-1] if ratios else None,
        }
    return out


def drift_check(summaries: dict[str, Event], tolerance: float = DRIFT_TOLERANCE) -> dict[str, Any]:
    """The runs' update cost per 1,000 processed tokens (`update_s_per_ktoken`), a phase no mode changes:
    flagged when the largest is more than `tolerance` times the smallest."""
    cost = {name: s.get("update_s_per_ktoken") for name, s in summaries.items()}
    known = [c for c in cost.values() if c]
    ratio = max(known) / min(known) if len(known) > 1 else None
    return {
        "phase": "update",
        "s_per_ktoken": cost,
        "ratio": ratio,
        "tolerance": tolerance,
        "flagged": ratio is not None and ratio > tolerance,
    }


def _quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
