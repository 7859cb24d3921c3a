"""A run's own engine schedule replayed through a GPU calibration (calibration.py): a model, not a
measurement. docs/metrics.md ("The GPU replay") says what each forward costs, the shape fallbacks for traces
without `rows`/`input_tokens` (older runs, the vLLM engine's events), and the document it writes.

The rollout's host work outside the forwards comes from one stated source (`HOST_SOURCES`), counted in
engine steps, never timed here: this machine's CPU seconds move with its load, so they are shown beside the
figure, not in it. The reward, the weight sync and the gaps between phases stay as measured. A term the
calibration never measured is swept: every figure is given at each of its values (`Calibration.sweep`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.trace import metrics
from reference_trainer.trace.schema import FORWARD_KINDS, PREFILL, ROLLOUT, SEQUENCE, TRAINER_WAIT, VERIFY
from rlbench.simulate.calibration import Calibration, find_calibration, missing, model_shape

Event = dict[str, Any]
# Where a swept admission cost makes a mode's replayed rollout equal the baseline's, searched up to this.
BREAK_EVEN_MAX_S = 1.0


@dataclass(frozen=True)
class Forward:
    """One forward's shape (sequences in it, tokens fed, and of those the admitted ones') and the seconds the
    run measured for it."""

    step: int
    worker: int
    kind: str
    rows: int
    tokens: int
    admitted_rows: int
    admitted_tokens: int
    seconds: float


def forwards(events: Sequence[Event]) -> list[Forward]:
    """Each forward event's shape, with the fallbacks of the module docstring."""
    prompt = {e["id"]: int(e.get("prompt_tokens") or 0) for e in events if e.get("kind") == SEQUENCE}
    mean_prompt = round(statistics.mean(prompt.values())) if prompt else 1
    seen: dict[int, set[str]] = defaultdict(set)  # per worker: the sequences its earlier forwards held
    out = []
    for e in sorted((e for e in events if e.get("kind") in FORWARD_KINDS), key=lambda e: e["t_start"]):
        worker, kind = int(e.get("worker", 0)), e["kind"]
        held = {str(s) for s in (e.get("slots") or {}).values()}
        new, seen[worker] = held - seen[worker], seen[worker] | held
        rows = int(e["rows"]) if "rows" in e else int(e["tokens"] if kind == PREFILL else e["active_slots"])
        if "input_tokens" in e:
            tokens = int(e["input_tokens"])
        elif kind == PREFILL:
            tokens = sum(prompt.get(s, mean_prompt) for s in new) if new else rows * mean_prompt
        elif kind == VERIFY:
            per_row = e["width"] + 1 if "width" in e else 1 + math.ceil(e.get("drafted", 0) / max(1, rows))
            tokens = rows * per_row
        else:
            tokens = rows
        admitted = (int(e.get("prefill_rows", 0)), int(e.get("prefill_tokens", 0)))
        seconds = float(e["t_end"]) - float(e["t_start"])
        out.append(Forward(int(e["step"]), worker, kind, max(rows, 1), max(tokens, 1), *admitted, seconds))
    return out


def forward_s(cal: Calibration, f: Forward, assumed: dict[str, float]) -> float:
    """Seconds of one forward on the calibration's GPU: an admission forward, or a decode (verify) forward of
    its rows plus what the admissions riding in it add."""
    if f.kind == PREFILL:
        return float(cal.admission_s(f.rows, f.tokens, assumed))
    running = max(1, f.rows - f.admitted_rows)
    if f.kind == VERIFY:
        own = float(cal.verify_s(f.rows, (f.tokens - f.admitted_tokens) / running))
    else:
        own = float(cal.decode_s(f.rows))
    return own + float(cal.riding_s(f.admitted_rows, f.admitted_tokens, assumed))


def beyond(cal: Calibration, f: Forward) -> bool:
    """Whether the calibration's cost of a forward of this shape is extrapolated beyond what it measured."""
    if f.kind == PREFILL:
        return cal.beyond(f.rows, tokens_per_row=f.tokens / f.rows)
    running = max(1, f.rows - f.admitted_rows)
    width = (f.tokens - f.admitted_tokens) / running if f.kind == VERIFY else 1.0
    admitted = f.admitted_rows > 0 and cal.beyond(
        f.admitted_rows, tokens_per_row=f.admitted_tokens / f.admitted_rows
    )
    return cal.beyond(f.rows, width) or admitted


# Where a replay's host time comes from, as its doc and lines name it. Never this machine's seconds: CPU
# seconds measured here moved with its load (sorted's replayed figure 1.07x beside 1.02x with the same seed at
# load 10-14, wall time 0.43x beside 0.22x), so they are shown beside the figure, not in it.
HOST_SOURCES = {
    "calibration": "the host work per engine step as the calibration measured it on its GPU machine "
    "(engine, sampling and, where measured for the mode, its controller), times the run's engine steps",
    "swept": "a host cost per engine step, swept as the header says (the calibration never measured it), "
    "times the run's engine steps: a count, so the figure does not move with this machine's load",
}
# What host work per engine step on a GPU machine is swept over where the calibration never measured it:
# from a lean engine's step (vLLM's scheduler and sampler bookkeeping is in this range) to this CPU's
# sorted engine step before its controller was made cheap (2.4 ms, benchmarks/controller_host.py).
HOST_SWEEP = {
    "values": [0.0, 0.0005, 0.001, 0.0025],
    "unit": "s of host work per engine step (engine, controller, sampling), on the GPU machine",
}


def host_cpu(events: Sequence[Event]) -> dict[int, dict[str, float]]:
    """Per step, the CPU seconds its rollout phases recorded by host part (`host_cpu_s`); a step with a
    rollout phase that recorded none is left out. Shown beside the figure (this machine's), not in it."""
    out: dict[int, dict[str, float]] = {}
    lacking: set[int] = set()
    for e in events:
        if e.get("kind") != ROLLOUT:
            continue
        parts = e.get("host_cpu_s")
        if not isinstance(parts, dict):
            lacking.add(int(e["step"]))
            continue
        into = out.setdefault(int(e["step"]), {})
        for part, seconds in parts.items():
            into[part] = into.get(part, 0.0) + float(seconds)
    return {step: parts for step, parts in out.items() if step not in lacking}


def host_per_step(cal: Calibration, mode: str | None) -> float | None:
    """The calibration's host seconds per engine step for `mode` (its engine's, plus its controller's where
    the calibration measured the mode's: `host["controller_s_per_step"]`); None where it never measured host
    work (the replay sweeps it). A calibration whose decode was timed as whole engine steps has the engine's
    host work in it already."""
    if cal.host is None:
        return None
    engine = 0.0 if cal.decode_scope == "engine_step" else float(cal.host["s_per_step"])
    controller = (cal.host.get("controller_s_per_step") or {}).get(mode or "", 0.0)
    return engine + float(controller)


@dataclass
class StepReplay:
    """One RL step: per worker, its forwards' replayed seconds with admissions free and its admissions (each
    then costs the swept admission value more); its engine steps, whose host work costs the calibration's per
    step (or the swept value); the rest as measured."""

    step: int
    workers: dict[int, tuple[float, int]]
    engine_steps: int
    host_parts: dict[str, float] | None  # this machine's CPU seconds by host part, where the trace has them
    rest_s: float  # reward, weight sync and the gaps between phases
    update_tokens: float | None
    measured_rollout_s: float
    measured_step_s: float | None

    def rollout_s(self, assumed: dict[str, float], per_step: float | None) -> float:
        per = assumed.get("prefill", 0.0)
        host = (per_step if per_step is not None else assumed.get("host", 0.0)) * self.engine_steps
        return max((s + per * n for s, n in self.workers.values()), default=0.0) + host

    def step_s(self, cal: Calibration, assumed: dict[str, float], per_step: float | None) -> float | None:
        if self.measured_step_s is None or self.update_tokens is None:
            return None
        return self.rollout_s(assumed, per_step) + cal.update_s(self.update_tokens, assumed) + self.rest_s


@dataclass
class RunReplay:
    cal: Calibration
    steps: list[StepReplay]
    counts: Counter[str]  # forwards by kind, and admissions, beyond_measured
    mode: str | None = None  # the run's mode, where known (the calibration may have its controller's cost)

    @property
    def source(self) -> str:
        """Where the replay's host time comes from (`HOST_SOURCES`)."""
        return "calibration" if self.cal.host is not None else "swept"

    def sweep(self) -> list[dict[str, float]]:
        """The calibration's swept assumptions, each at every swept host value where it never measured
        host work."""
        points = self.cal.sweep()
        if self.cal.host is None:
            points = [{**a, "host": h} for a in points for h in HOST_SWEEP["values"]]
        if (residual := self.cal.update_residual_s()) is not None:  # the step figure's range from the fit
            points = [{**a, "update_residual": r} for a in points for r in (-residual, 0.0, residual)]
        return points

    def host_s(self, assumed: dict[str, float]) -> float | None:
        """The replayed host seconds per RL step at `assumed`."""
        per_step = host_per_step(self.cal, self.mode)
        return _mean([(per_step if per_step is not None else assumed.get("host", 0.0)) * s.engine_steps
                      for s in self.steps])  # fmt: skip

    def rollout_s(self, assumed: dict[str, float]) -> float | None:
        per_step = host_per_step(self.cal, self.mode)
        return _mean([s.rollout_s(assumed, per_step) for s in self.steps])

    def step_s(self, assumed: dict[str, float]) -> float | None:
        per_step = host_per_step(self.cal, self.mode)
        return _mean([s.step_s(self.cal, assumed, per_step) for s in self.steps])

    def doc(self) -> dict[str, Any]:
        """The replay's JSON: its calibration, what the run measured, and each sweep point's figures."""
        n = max(1, len(self.steps))
        return {
            "calibration": describe(self.cal),
            "steps": len(self.steps),
            "measured": {
                "rollout_s": _mean([s.measured_rollout_s for s in self.steps]),
                "step_s": _mean([s.measured_step_s for s in self.steps]),
            },
            "host": self.host_doc(),
            "per_step": {key: self.counts[key] / n for key in (*FORWARD_KINDS, "admissions")},
            "beyond_measured": self.counts["beyond_measured"],
            "points": [
                {"assumed": a, "rollout_s": self.rollout_s(a), "step_s": self.step_s(a)} for a in self.sweep()
            ],
        }

    def host_doc(self) -> dict[str, Any]:
        """The host time's source, its values per RL step over the sweep, its share of the replayed rollout
        at each sweep point, and, beside it, this machine's CPU seconds by part (where the trace has them:
        not in the figure)."""
        n = max(1, len(self.steps))
        engine_steps = sum(s.engine_steps for s in self.steps) / n
        points = self.sweep()
        hosts = [self.host_s(a) for a in points]
        parts = [s.host_parts for s in self.steps]
        by_part = (
            {k: statistics.mean(p.get(k, 0.0) for p in parts if p) for k in parts[0]}
            if parts and all(parts)
            else None
        )
        known = [h for h in hosts if h is not None]
        cpu = sum(by_part.values()) if by_part else None
        return {
            "source": self.source,
            "label": HOST_SOURCES[self.source],
            "s_per_rl_step": max(known) if known else None,
            "s_per_rl_step_range": [min(known), max(known)] if known else None,
            "engine_steps_per_rl_step": engine_steps,
            "this_cpu_s_by_part": by_part,
            "this_cpu_s_per_engine_step": cpu / engine_steps if cpu is not None and engine_steps else None,
            "share_of_rollout": [_ratio(h, self.rollout_s(a)) for h, a in zip(hosts, points, strict=True)],
        }


def describe(cal: Calibration) -> dict[str, Any]:
    """The calibration as a replay's JSON names it: with the host sweep among its swept terms where it never
    measured host work, and the update fit's residual (the step figure's range from the fit) where it has
    one."""
    doc = cal.describe()
    if cal.host is None:
        doc["swept"] = {**doc["swept"], "host": HOST_SWEEP}
    if (residual := cal.update_residual_s()) is not None:
        fit = {
            "values": [-residual, 0.0, residual],
            "unit": "s of the update fit's residual (RMS over its points)",
        }
        doc["swept"] = {**doc["swept"], "update_residual": fit}
    return doc


def _mean(values: list[float | None]) -> float | None:
    """The mean over steps; None where there are none or one is unknown."""
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known and len(known) == len(values) else None


def replay(events: Sequence[Event], cal: Calibration, mode: str | None = None) -> RunReplay:
    """A run's trace through `cal`: its steps with a rollout phase, each forward at the calibration's cost,
    its host work per engine step from the calibration or swept (`HOST_SOURCES`)."""
    swept = "prefill" in cal.swept
    free = {name: 0.0 for name in cal.swept}
    per_step: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    counts: Counter[str] = Counter()
    engine_steps: Counter[int] = Counter()
    for f in forwards(events):
        admits = f.kind == PREFILL or f.admitted_rows > 0
        cell = per_step[f.step][f.worker]
        cell[0] += forward_s(cal, f, free)
        cell[1] += int(admits and swept)
        counts[f.kind] += 1
        counts["admissions"] += admits
        counts["beyond_measured"] += beyond(cal, f)
        engine_steps[f.step] += 1
    cpu = host_cpu(events)
    rows = [row for row in metrics.step_metrics(events) if row.get("timing_s/gen")]
    steps = []
    for row in rows:
        gen, step = row["timing_s/gen"], row.get("step_time_s")
        workers = {w: (s, int(n)) for w, (s, n) in per_step.get(row["step"], {}).items()}
        rest = 0.0 if step is None else step - gen - (row.get("timing_s/update") or 0.0)
        steps.append(StepReplay(row["step"], workers, engine_steps[row["step"]], cpu.get(row["step"]), rest,
                                row.get("update_tokens"), gen, step))  # fmt: skip
    return RunReplay(cal, steps, counts, mode)


def break_even(mode: RunReplay, base: RunReplay) -> float | None:
    """The swept admission cost at which a mode's replayed rollout equals the baseline's (None: not swept,
    or no crossing up to BREAK_EVEN_MAX_S)."""
    if "prefill" not in mode.cal.swept or mode is base:
        return None

    def gap(a: float) -> float:
        return (mode.rollout_s({"prefill": a}) or 0.0) - (base.rollout_s({"prefill": a}) or 0.0)

    lo, hi = 0.0, BREAK_EVEN_MAX_S
    if gap(lo) * gap(hi) > 0:
        return None
    for _ in range(50):  # bisection to well below a microsecond
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) * gap(lo) > 0 else (lo, mid)
    return (lo + hi) / 2


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass(frozen=True)
class GpuReplay:
    """The calibration a run's model replays through (None: none measured for its shape), and the replays."""

    calibration: Calibration | None
    shape: dict[str, int] | None

    @classmethod
    def for_model(cls, model_dir: str | Path, source: str | Path | None = None) -> GpuReplay:
        """The calibration for a model directory's shape (`find_calibration`: `source` first)."""
        shape = model_shape(model_dir)
        return cls(find_calibration(shape, source), shape)

    def run_doc(self, events: Sequence[Event]) -> dict[str, Any]:
        """metrics.json's `gpu_replay`: the run replayed, or why there is no calibration for it (or why it
        is not modelled)."""
        if self.calibration is None:
            return {"calibration": None, "why": missing(self.shape)}
        if ran_ahead(events):
            return {"calibration": None, "why": RAN_AHEAD}
        return replay(events, self.calibration).doc()

    def comparison(self, traces: dict[str, Sequence[Event]], baseline: str) -> dict[str, Any]:
        """compare.json's `gpu_replay`: each mode's replay, its speed-ups over the baseline's replay at every
        sweep point (baseline time / mode time, as compare's own), and the break-even admission cost."""
        if self.calibration is None:
            return {"calibration": None, "why": missing(self.shape)}
        doc = comparison(
            {
                mode: replay(events, self.calibration, mode)
                for mode, events in traces.items()
                if not ran_ahead(events)
            },
            baseline,
        )
        return doc | {
            "not_modelled": {mode: RAN_AHEAD for mode, events in traces.items() if ran_ahead(events)}
        }


# A rollout run ahead of its updates (modes async, sorted+async): its phases overlap, and the replay puts a
# step's replayed rollout and measured rest one after the other, so it would not model such a run.
RAN_AHEAD = "the rollout ran beside the updates (a run ahead): the replay models phases one after another"


def ran_ahead(events: Sequence[Event]) -> bool:
    return any(e.get("kind") == TRAINER_WAIT for e in events)


def comparison(replays: dict[str, RunReplay], baseline: str) -> dict[str, Any]:
    """The comparison of replays through one calibration (`GpuReplay.comparison`)."""
    first = next(iter(replays.values()))
    cal = first.cal
    base = replays.get(baseline)
    speedup: dict[str, list[dict[str, Any]]] = {}
    for mode, run in replays.items():
        speedup[mode] = [
            {
                "assumed": a,
                "rollout": _ratio(base.rollout_s(a), run.rollout_s(a)) if base else None,
                "step": _ratio(base.step_s(a), run.step_s(a)) if base else None,
            }
            for a in first.sweep()
        ]
    return {
        "baseline": baseline,
        "calibration": describe(cal),
        "runs": {
            mode: {k: v for k, v in run.doc().items() if k != "calibration"} for mode, run in replays.items()
        },
        "speedup": speedup,
        "break_even_prefill_s": {m: break_even(r, base) if base else None for m, r in replays.items()},
    }
