"""A run's own engine schedule replayed through a GPU calibration (calibration.py): a model, not a
measurement.

Every forward of the run's trace keeps its kind and shape (rows, tokens, drafts, the admissions riding in it)
and costs what the calibration measured on its GPU for that shape. The rollout's host work outside the
forwards (the engine's bookkeeping, the mode's controller, sampling parameters and uploads) comes from one
stated source (`HOST_SOURCES`): the engine's part from the calibration's measured host seconds per engine step
where it has them, else, as every part without one, the CPU seconds the run's rollout thread spent on it
(the rollout phase's `host_cpu_s`: they do not move with this machine's load the way wall time does); a trace
without them (an older run, another engine) falls back on its rollout's wall time outside its forwards. The
reward, the weight sync and the gaps between phases stay as measured; the update costs the calibration's
update for the tokens it processed. A term the calibration never measured is swept: every figure is given at
each of its values (`Calibration.sweep`).

Forward shapes come from the trace contract (docs/metrics.md, "Engine steps"): `rows` and `input_tokens`, and
`prefill_rows` / `prefill_tokens` for the admissions that rode in a decode or verify forward. Traces without
them (older runs, the vLLM engine's events) fall back on: decode and verify rows = `active_slots`, a verify's
tokens per row = its `width` (drafts) + 1, prefill rows = `tokens` (one per admitted sequence) and a
prefill's tokens = the prompts of the sequences it newly put in slots.
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


# Where a replay's host time comes from, as its doc and lines name it.
HOST_SOURCES = {
    "cpu": "this machine's CPU seconds (the rollout thread's: engine, controller, sampling and uploads)",
    "calibration": "the engine's host work as the calibration measured it on its GPU, the controller's as "
    "this machine's CPU seconds",
    "wall": "this machine's wall time outside the forwards (no CPU seconds in the trace: it moves with load)",
}


def host_cpu(events: Sequence[Event]) -> dict[int, dict[str, float]]:
    """Per step, the CPU seconds its rollout phases recorded by host part (`host_cpu_s`); a step with a
    rollout phase that recorded none is left out."""
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


def host_source(cal: Calibration) -> str:
    """Where the host time of a run whose trace has CPU seconds comes from (`HOST_SOURCES`)."""
    return "calibration" if cal.engine_host_measured else "cpu"


def host_s(cal: Calibration, parts: dict[str, float] | None, engine_steps: int, wall: float) -> float:
    """One rollout's host seconds (`HOST_SOURCES`): its wall time outside forwards without CPU seconds; the
    controller's CPU seconds plus the engine's as the calibration measured it (inside its decode steps, or
    per step) where it did; else every host part's CPU seconds."""
    if parts is None:
        return wall
    if cal.decode_scope == "engine_step":
        return parts.get("controller", 0.0)
    if cal.host is not None:
        return float(cal.host["s_per_step"]) * engine_steps + parts.get("controller", 0.0)
    return sum(parts.values())


@dataclass
class StepReplay:
    """One RL step: per worker, its forwards' replayed seconds with admissions free and its admissions (each
    then costs the swept admission value more); the rest as measured."""

    step: int
    workers: dict[int, tuple[float, int]]
    host_s: float  # the rollout's host work outside its forwards (HOST_SOURCES)
    host_parts: dict[str, float] | None  # this machine's CPU seconds by host part, where the trace has them
    rest_s: float  # reward, weight sync and the gaps between phases
    update_tokens: float | None
    measured_rollout_s: float
    measured_step_s: float | None

    def rollout_s(self, assumed: dict[str, float]) -> float:
        per = assumed.get("prefill", 0.0)
        return max((s + per * n for s, n in self.workers.values()), default=0.0) + self.host_s

    def step_s(self, cal: Calibration, assumed: dict[str, float]) -> float | None:
        if self.measured_step_s is None or self.update_tokens is None:
            return None
        return self.rollout_s(assumed) + cal.update_s(self.update_tokens, assumed) + self.rest_s


@dataclass
class RunReplay:
    cal: Calibration
    steps: list[StepReplay]
    counts: Counter[str]  # forwards by kind, and admissions, beyond_measured
    source: str = "wall"  # where host_s comes from (HOST_SOURCES)

    def rollout_s(self, assumed: dict[str, float]) -> float | None:
        return _mean([s.rollout_s(assumed) for s in self.steps])

    def step_s(self, assumed: dict[str, float]) -> float | None:
        return _mean([s.step_s(self.cal, assumed) for s in self.steps])

    def doc(self) -> dict[str, Any]:
        """The replay's JSON: its calibration, what the run measured, and each sweep point's figures."""
        n = max(1, len(self.steps))
        return {
            "calibration": self.cal.describe(),
            "steps": len(self.steps),
            "measured": {
                "rollout_s": _mean([s.measured_rollout_s for s in self.steps]),
                "step_s": _mean([s.measured_step_s for s in self.steps]),
            },
            "host_s": _mean([s.host_s for s in self.steps]),
            "host": self.host_doc(),
            "per_step": {key: self.counts[key] / n for key in (*FORWARD_KINDS, "admissions")},
            "beyond_measured": self.counts["beyond_measured"],
            "points": [
                {"assumed": a, "rollout_s": self.rollout_s(a), "step_s": self.step_s(a)}
                for a in self.cal.sweep()
            ],
        }

    def host_doc(self) -> dict[str, Any]:
        """The host time's source, its mean per RL step and per engine step, this machine's CPU seconds by
        part (where the trace has them) and its share of the replayed rollout at each sweep point."""
        host = _mean([s.host_s for s in self.steps])
        n = max(1, len(self.steps))
        engine_steps = sum(self.counts[k] for k in FORWARD_KINDS) / n
        parts = [s.host_parts for s in self.steps]
        by_part = (
            {k: statistics.mean(p.get(k, 0.0) for p in parts if p) for k in parts[0]}
            if parts and all(parts)
            else None
        )
        shares = [_ratio(host, self.rollout_s(a)) for a in self.cal.sweep()]
        return {
            "source": self.source,
            "label": HOST_SOURCES[self.source],
            "s_per_rl_step": host,
            "s_per_engine_step": host / engine_steps if host is not None and engine_steps else None,
            "cpu_s_by_part": by_part,
            "share_of_rollout": shares,
        }


def _mean(values: list[float | None]) -> float | None:
    """The mean over steps; None where there are none or one is unknown."""
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known and len(known) == len(values) else None


def replay(events: Sequence[Event], cal: Calibration) -> RunReplay:
    """A run's trace through `cal`: its steps with a rollout phase, each forward at the calibration's cost."""
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
    # One source for the whole run: CPU seconds only where every replayed step recorded them.
    source = host_source(cal) if rows and all(row["step"] in cpu for row in rows) else "wall"
    steps = []
    for row in rows:
        gen = row["timing_s/gen"]
        busy = max((row.get("worker_busy_s") or {}).values(), default=0.0)
        step, update = row.get("step_time_s"), row.get("timing_s/update") or 0.0
        workers = {w: (s, int(n)) for w, (s, n) in per_step.get(row["step"], {}).items()}
        rest = 0.0 if step is None else step - gen - update
        parts = cpu.get(row["step"]) if source != "wall" else None
        host = host_s(cal, parts, engine_steps[row["step"]], max(0.0, gen - busy))
        steps.append(StepReplay(row["step"], workers, host, parts, rest, row.get("update_tokens"), gen, step))
    return RunReplay(cal, steps, counts, source)


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
                mode: replay(events, self.calibration)
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
    cal = next(iter(replays.values())).cal
    base = replays.get(baseline)
    speedup: dict[str, list[dict[str, Any]]] = {}
    for mode, run in replays.items():
        speedup[mode] = [
            {
                "assumed": a,
                "rollout": _ratio(base.rollout_s(a), run.rollout_s(a)) if base else None,
                "step": _ratio(base.step_s(a), run.step_s(a)) if base else None,
            }
            for a in cal.sweep()
        ]
    return {
        "baseline": baseline,
        "calibration": cal.describe(),
        "runs": {
            mode: {k: v for k, v in run.doc().items() if k != "calibration"} for mode, run in replays.items()
        },
        "speedup": speedup,
        "break_even_prefill_s": {m: break_even(r, base) if base else None for m, r in replays.items()},
    }
