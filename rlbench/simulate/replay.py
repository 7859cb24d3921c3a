"""Validation: replay a measured run's lengths on a cost model fitted to the same run, and compare.

A run (W = 1, or W engines as Ray actors or in-process workers) is replayed with its own mode and options
(train_config.json: the mode, its dispatch), its own worker count and per-worker slot capacity, its own
finished lengths (the trace's sequence events) and a cost model fitted to its own engine events. What the
simulator must reproduce, step by step and overall:

- the bubble ratio (reference_trainer.trace.metrics);
- the cross-engine idle (reference_trainer/trace/engines.py, the trace's own definition): the engine-seconds
  in which an engine runs no forward while another runs one, over W x the step's engine span, a ratio of
  sums over the steps; the replay's forwards are read by the same function as the run's;
- the work, with no clock in it: engine forwards per engine and slot-steps (occupied slots summed over the
  forwards). The scheduler mirrors the engine's, so on the run's own lengths and dispatch the counts are
  equal whatever the machine's load did to the timings.

The verdict of a run: both ratios within `tolerance` (3 points) and every engine's forwards equal in
every step, or not, with the numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference_trainer.errors import UserError, check_number
from reference_trainer.rollout.dispatch import RENAMED, RENAMED_OPTIONS
from reference_trainer.trace import metrics
from reference_trainer.trace.engines import cross_engine_idle
from reference_trainer.trace.records import read_json
from reference_trainer.trace.schema import DISPATCH, FORWARD_KINDS
from reference_trainer.trace.steps import worker_capacities
from rlbench.simulate import controller, workload
from rlbench.simulate.cost import fit_run
from rlbench.simulate.modes import SimMode, sim_mode
from rlbench.simulate.scheduler import simulate_mode

WORK = ("measured_forwards", "simulated_forwards", "measured_slot_steps", "simulated_slot_steps")
PREFILL_TOKENS = 8192  # the engine's default (engine/config.py), for a trace without its run's config
TOLERANCE = 0.03  # the verdict's bound on the bubble's and the cross-engine idle's error (3 points)


def read_events(run: str | Path) -> list[dict[str, Any]]:
    path = Path(run)
    path = path / "trace.jsonl" if path.is_dir() else path
    if not path.exists():  # one that exists is read as a regular file (records.read_jsonl says why not)
        raise UserError(f"{path}: no such trace file")
    return workload.read_rows(path)


def run_config(run: str | Path) -> dict[str, Any]:
    """The train_config.json beside the run's trace, or {} for a trace without one (a length log's, an
    imported run's: replayed as the baseline)."""
    path = Path(run)
    config = (path if path.is_dir() else path.parent) / "train_config.json"
    if not config.is_file():
        return {}
    raw = read_json(config)
    if not isinstance(raw, dict) or not isinstance(raw.get("mode_options", {}), dict):
        raise UserError(f"{config}: not a training run's config (a JSON object with mode_options)")
    return raw


def run_mode(run: str | Path) -> tuple[str, dict[str, Any]]:
    """The mode and mode options the run was trained with (the baseline for a trace without a config), a
    former option's name as it is now (a run recorded with placement=least-outstanding dispatched as
    dispatch=least-in-flight does)."""
    raw = run_config(run)
    options = {}
    for key, value in dict(raw.get("mode_options") or {}).items():
        key = RENAMED_OPTIONS.get(key, key)
        options[key] = RENAMED.get(value, value) if key == "dispatch" and isinstance(value, str) else value
    return str(raw.get("mode", "baseline")), options


def _idle_share(idle_s: float, span_s: float) -> float:
    return idle_s / span_s if span_s > 0 else 0.0


def simulated_idle(row: Mapping[str, Any], engines: Sequence[int]) -> tuple[float, float]:
    """A simulated step's (cross-engine idle engine-seconds, engine-seconds of its span), by the trace's
    own definition (trace/engines.py) over the replay's forwards."""
    idle, span, _ = cross_engine_idle(row["forward_events"], engines)
    return idle, span


def run_cross_engine_idle(steps: Sequence[Mapping[str, Any]]) -> float:
    """A run's cross-engine idle over `steps` (metrics' step rows), a ratio of sums (engines.py's)."""
    return _idle_share(sum(s["cross_engine_idle_s"] for s in steps), sum(s["engine_span_s"] for s in steps))


def policy_of(mode: SimMode) -> str:
    """The dispatch the replay used: the mode's dispatch policy (its placement where it has none)."""
    return str(getattr(mode, "dispatch", None) or getattr(mode, "placement", None) or "default")


def _measured_work(events: list[dict[str, Any]]) -> tuple[Counter[tuple[int, int]], Counter[int]]:
    """Forwards per (step, engine) and slot-steps per step, counted in the trace."""
    forwards: Counter[tuple[int, int]] = Counter()
    slot_steps: Counter[int] = Counter()
    for e in events:
        if e.get("kind") in FORWARD_KINDS:
            step = int(e.get("step", 0))
            forwards[step, int(e.get("worker", 0))] += 1
            slot_steps[step] += int(e.get("active_slots", 0))
    return forwards, slot_steps


def _step_row(
    m: dict[str, Any], s: dict[str, Any], engines: list[int], work: tuple[Counter, Counter]
) -> dict:
    """One step measured (metrics' step row, the trace's work) beside the same step simulated."""
    forwards, slot_steps = work
    per_engine = [forwards[m["step"], w] for w in engines]
    idle, span = simulated_idle(s, engines)
    return {
        "step": m["step"],
        "measured_bubble": m["bubble_ratio"],
        "simulated_bubble": s["bubble_ratio"],
        "measured_cross_engine_idle": _idle_share(m["cross_engine_idle_s"], m["engine_span_s"]),
        "simulated_cross_engine_idle": _idle_share(idle, span),
        "simulated_cross_engine_idle_s": idle,
        "simulated_engine_span_s": span,
        "measured_rollout_s": m["timing_s/gen"],
        "simulated_rollout_s": s["rollout_s"],
        "measured_engine_forwards": per_engine,
        "simulated_engine_forwards": s["worker_forwards"],
        "measured_forwards": sum(per_engine),
        "simulated_forwards": s["forwards"],
        "measured_slot_steps": slot_steps[m["step"]],
        "simulated_slot_steps": s["slot_steps"],
    }


def replay_run(run: str | Path) -> dict[str, Any]:
    """The run and its replay, step by step: the measured and simulated bubble, cross-engine idle, rollout
    time, forwards per engine and slot-steps; then the totals (ratios of sums)."""
    events = read_events(run)
    if not any(e.get("kind") in FORWARD_KINDS for e in events):
        raise UserError(f"{run}: the trace has no engine steps to replay")
    name, options = run_mode(run)
    mode = sim_mode(name, options)
    # the engine's admission rule: longest prompt x sequences per batched prefill, at most this many tokens
    prefill = float(run_config(run).get("max_prefill_tokens") or PREFILL_TOKENS)
    caps = worker_capacities(events)  # per worker
    engines, capacity = sorted(caps), max(caps.values())
    measured = metrics.compute(events)
    cost = fit_run(events, source=str(run))
    trace = workload.from_run_trace(events, str(run))
    pred = np.where(np.isnan(trace.predicted), float(trace.response_tokens.mean()), trace.predicted)
    if controller.drives(name, options, len(engines)):  # SortedRL on W engines: the run's own controller
        shape = controller.Shape(options, len(engines), capacity, cost, len(measured["steps"]))
        sim = controller.replay(events, run_config(run), shape)
    else:
        sim = simulate_mode(mode, trace, pred, np.zeros(len(trace)), cost, len(engines), capacity,
                            len(trace.steps), max_prefill_tokens=prefill, per_worker=True)  # fmt: skip
    work = _measured_work(events)
    rows = [_step_row(m, s, engines, work) for m, s in zip(measured["steps"], sim["steps"], strict=False)]
    for row, s in zip(rows, sim["steps"], strict=False):  # the controller's decisions, where it replayed
        if "dispatch" in s:
            step = row["step"]
            row["measured_dispatch"] = [
                e["engines"] for e in events if e.get("kind") == DISPATCH and e["step"] == step
            ]
            row["simulated_dispatch"] = s["dispatch"]
    total = lambda key: sum(r[key] for r in rows)  # noqa: E731
    per_engine = lambda key: [sum(r[key][i] for r in rows) for i in range(len(engines))]  # noqa: E731
    return {
        "run": str(run),
        "mode": name,
        "mode_options": options,
        "dispatch": policy_of(mode),
        "workers": len(engines),
        "capacity": capacity,
        "max_prefill_tokens": prefill,
        "cost_model": cost.describe(),
        "steps": rows,
        "measured_steps": len(measured["steps"]),
        "simulated_steps": len(sim["steps"]),
        "measured_bubble": measured["summary"]["bubble_ratio"],
        "simulated_bubble": sim["bubble_ratio"],
        "measured_cross_engine_idle": run_cross_engine_idle(measured["steps"]),
        "simulated_cross_engine_idle": _idle_share(
            total("simulated_cross_engine_idle_s"), total("simulated_engine_span_s")
        ),
        "measured_rollout_s": measured["summary"]["timing_s/gen"],
        "simulated_rollout_s": sim["rollout_s"],
        "measured_engine_forwards": per_engine("measured_engine_forwards"),
        "simulated_engine_forwards": per_engine("simulated_engine_forwards"),
        **{key: total(key) for key in WORK},
    }


def verdict(doc: Mapping[str, Any], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Whether the replay holds: the run's bubble and cross-engine idle within `tolerance` of the measured
    ones, and every engine's forwards equal in every step (and as many steps); the numbers, and one line."""
    bubble = abs(doc["simulated_bubble"] - doc["measured_bubble"])
    idle = abs(doc["simulated_cross_engine_idle"] - doc["measured_cross_engine_idle"])
    differ = [
        {"step": r["step"], "measured": measured, "simulated": simulated}
        for r in doc["steps"]
        if (measured := r["measured_engine_forwards"]) != (simulated := r["simulated_engine_forwards"])
    ]  # fmt: skip
    same_steps = doc["measured_steps"] == doc["simulated_steps"]
    forwards_equal = not differ and same_steps
    # where the controller was replayed (SortedRL on W engines), its dispatch decisions are compared too
    decided = [r for r in doc["steps"] if "simulated_dispatch" in r]
    dispatch_differ = [r["step"] for r in decided if r["measured_dispatch"] != r["simulated_dispatch"]]
    holds = bubble <= tolerance and idle <= tolerance and forwards_equal and not dispatch_differ
    pts = 100 * tolerance
    parts = [
        f"bubble {doc['measured_bubble']:.1%} measured, {doc['simulated_bubble']:.1%} simulated "
        f"({100 * bubble:.1f} points{'' if bubble <= tolerance else f' > {pts:g}'})",
        f"cross-engine idle {doc['measured_cross_engine_idle']:.1%} measured, "
        f"{doc['simulated_cross_engine_idle']:.1%} simulated "
        f"({100 * idle:.1f} points{'' if idle <= tolerance else f' > {pts:g}'})",
    ]
    if forwards_equal:
        parts.append(f"forwards per engine equal ({', '.join(map(str, doc['measured_engine_forwards']))})")
    elif not same_steps:
        parts.append(f"steps differ: {doc['measured_steps']} measured, {doc['simulated_steps']} simulated")
    else:
        first = differ[0]
        parts.append(
            f"forwards per engine differ in {len(differ)} of {len(doc['steps'])} steps "
            f"(step {first['step']}: measured {first['measured']}, simulated {first['simulated']})"
        )
    if decided:
        parts.append(
            f"dispatch decisions differ in {len(dispatch_differ)} of {len(decided)} steps"
            if dispatch_differ
            else "dispatch decisions equal"
        )
    return {
        "holds": holds,
        "dispatch_equal": None if not decided else not dispatch_differ,
        "tolerance_points": pts,
        "bubble_error_points": 100 * bubble,
        "cross_engine_idle_error_points": 100 * idle,
        "forwards_equal": forwards_equal,
        "forwards_differ": differ,
        "text": ("holds: " if holds else "does not hold: ") + "; ".join(parts),
    }


def validate(run: str | Path, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """One run's replay (`replay_run`) with its verdict."""
    doc = replay_run(run)
    return {**doc, "verdict": verdict(doc, tolerance)}


@dataclass(frozen=True)
class ValidateConfig:
    """`rlbench simulate validate RUN [RUN...]`: the runs (folders or trace.jsonl files) and the bound."""

    runs: tuple[Path, ...]
    tolerance: float = TOLERANCE

    def check(self) -> ValidateConfig:
        if not self.runs:
            raise UserError("give at least one run folder or trace.jsonl to validate")
        check_number("--tolerance", self.tolerance, low=0.0, high=1.0)
        for run in self.runs:
            path = run / "trace.jsonl" if run.is_dir() else run
            if not path.is_file():
                raise UserError(f"{run}: no such run folder or trace file (a run folder holds trace.jsonl)")
        if len(set(map(str, self.runs))) != len(self.runs):
            raise UserError("a run is named twice")
        return self


def validate_runs(cfg: ValidateConfig) -> dict[str, Any]:
    """Every run's validation, and whether it held for all of them."""
    docs = [validate(run, cfg.tolerance) for run in cfg.runs]
    return {
        "tolerance_points": 100 * cfg.tolerance,
        "holds": all(d["verdict"]["holds"] for d in docs),
        "runs": docs,
    }


def table(doc: Mapping[str, Any]) -> list[str]:
    """A terminal table: one row per run, measured / simulated, and the verdict."""
    lines = [
        "| run | mode | dispatch | W | bubble meas / sim | cross-engine idle meas / sim "
        "| forwards per engine | holds |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for d in doc["runs"]:
        v = d["verdict"]
        fw = ", ".join(map(str, d["measured_engine_forwards"]))
        if not v["forwards_equal"]:
            fw += f" (simulated {', '.join(map(str, d['simulated_engine_forwards']))})"
        lines.append(
            f"| {d['run']} | {d['mode']} | {d['dispatch']} | {d['workers']} | "
            f"{d['measured_bubble']:.1%} / {d['simulated_bubble']:.1%} | "
            f"{d['measured_cross_engine_idle']:.1%} / {d['simulated_cross_engine_idle']:.1%} | {fw} | "
            f"{'yes' if v['holds'] else 'no'} |"
        )
    return lines
