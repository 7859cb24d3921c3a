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
        out[name] = _spread(ratios)
    return out


def _spread(values: list[float]) -> dict[str, float | None]:
    """The median, min and max of sorted `values` (each None when there are none)."""
    if not values:
        return dict.fromkeys(("median", "min", "max"))
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


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


# The parts of a step's time that a mode can change: the rollout, the update, the reward, and the rest
# (weight sync and the gaps between phases), each the mean seconds per step over the run.
PHASES = ("rollout", "update", "reward", "other")


def phase_seconds(summary: Event) -> dict[str, float] | None:
    """Mean seconds per step of each part of PHASES (they add up to the step time), or None."""
    step = summary.get("step_time_s")
    if step is None:
        return None
    # The rollout's part is the time the update waited for samples: the whole rollout in a synchronous
    # mode, what the updates did not hide in a run ahead (whose rollout overlaps them: gen counts twice).
    wait = "trainer_wait_s" if summary.get("trainer_wait_s") is not None else "timing_s/gen"
    gen, update, reward = (float(summary.get(k) or 0.0) for k in (wait, "timing_s/update", "timing_s/reward"))
    return {"rollout": gen, "update": update, "reward": reward, "other": float(step) - gen - update - reward}


def speedup_parts(summaries: dict[str, Event], baseline: str) -> dict[str, dict[str, Any]]:
    """Per run: its step time in parts, the seconds each part saved against `baseline` (negative: it cost
    more), each part's share of the step time saved, and the part that saved most (`main`)."""
    base = phase_seconds(summaries.get(baseline, {}))
    out: dict[str, dict[str, Any]] = {}
    for name, summary in summaries.items():
        mine = phase_seconds(summary)
        if base is None or mine is None:
            out[name] = {"seconds": mine, "saved_s": None, "share": None, "main": None, "speedup": None}
            continue
        saved = {p: base[p] - mine[p] for p in PHASES}
        total = sum(saved.values())
        out[name] = {
            "seconds": mine,
            "saved_s": saved,
            "share": {p: saved[p] / total for p in PHASES} if abs(total) > 1e-9 else None,
            "main": max(PHASES, key=lambda p: saved[p]) if total > 1e-9 else None,
            "speedup": _quotient(sum(base.values()), sum(mine.values())),
        }
    return out


def per_step_range(steps_by_run: dict[str, list[Event]], key: str) -> dict[str, dict[str, float | None]]:
    """Per run, the median, min and max of a per-step metric (e.g. bubble_ratio) over its steps."""
    out: dict[str, dict[str, float | None]] = {}
    for name, steps in steps_by_run.items():
        out[name] = _spread(sorted(float(s[key]) for s in steps if s.get(key) is not None))
    return out


HELDOUT_ACCURACY = "val/heldout_greedy_acc"  # the metrics row's held-out evaluation, made before its step


def reached(row: Event, target: float) -> bool:
    """Whether a metrics row's held-out evaluation (of the policy its step starts from) reaches `target`."""
    return row.get(HELDOUT_ACCURACY) is not None and float(row[HELDOUT_ACCURACY]) >= target


def time_to_target(rows: list[Event], target: float) -> dict[str, Any]:
    """What a run spent before held-out greedy accuracy first reached `target`: the steps before the
    evaluation that reached it (their wall time, held-out evaluations excluded; the rollout and update
    time inside it; trained samples; rollout tokens generated). `reached` False: not within these rows,
    and the totals are what the whole budget spent."""
    hit = next((i for i, row in enumerate(rows) if reached(row, target)), None)
    spent = rows if hit is None else rows[:hit]
    return {
        "reached": hit is not None,
        "steps": len(spent),
        "wall_s": sum(float(r.get("step_time_s") or 0.0) for r in spent),
        "rollout_s": sum(float(r.get("timing_s/gen") or 0.0) for r in spent),
        "update_s": sum(float(r.get("timing_s/update") or 0.0) for r in spent),
        "samples": sum(int(r.get("samples") or 0) for r in spent),
        "rollout_tokens": sum(int(r.get("rollout_tokens") or 0) for r in spent),
        "accuracy_start": next(
            (r[HELDOUT_ACCURACY] for r in rows if r.get(HELDOUT_ACCURACY) is not None), None
        ),
    }
