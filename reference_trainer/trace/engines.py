"""The metrics of a rollout over several engines (docs/metrics.md), from one step's forward and dispatch
events: each engine's bubble, cross-engine idle with the step's straggler engine, and dispatch imbalance.
The global bubble is steps.py's `bubble_ratio` (every engine's slots together); the run's totals are
`engine_summary`'s, ratios of sums over the steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Event = dict[str, Any]


def duration(ev: Event) -> float:
    """An event's seconds (0 for one whose end precedes its start)."""
    return max(0.0, float(ev["t_end"]) - float(ev["t_start"]))


def engine_bubbles(engine: Sequence[Event], caps: dict[int, int], wall: float) -> dict[str, float | None]:
    """Per engine, 1 - its slot-time / (its slots x the step's rollout wall time): the bubble of one engine
    over the same window as the global bubble (so the global one is their slot-weighted mean)."""
    slot_time: dict[int, float] = {w: 0.0 for w in caps}
    for e in engine:
        w = int(e.get("worker", 0))
        slot_time[w] = slot_time.get(w, 0.0) + int(e.get("active_slots", 0)) * duration(e)
    return {
        str(w): (1.0 - t / (caps[w] * wall)) if caps.get(w) and wall > 0 else None
        for w, t in sorted(slot_time.items())
    }


def cross_engine_idle(engine: Sequence[Event], engines: Iterable[int]) -> tuple[float, float, int | None]:
    """(idle engine-seconds while another engine runs a forward, engine-seconds of the step's engine span,
    the straggler engine). The span is the first forward's start to the last forward's end; at each moment
    some engine runs, every engine that runs none is idle while another runs. The straggler is the engine
    whose last forward ends last (lowest id on a tie); None without forwards."""
    names = sorted(set(engines) | {int(e.get("worker", 0)) for e in engine})
    if not engine:
        return 0.0, 0.0, None
    edges = sorted(
        [(float(e["t_start"]), 1, int(e.get("worker", 0))) for e in engine]
        + [(float(e["t_end"]), -1, int(e.get("worker", 0))) for e in engine]
    )  # at one instant, ends (-1) sort before starts: back-to-back forwards leave no gap
    running: Counter[int] = Counter()  # forwards in progress per engine (one, unless a trace overlaps them)
    idle, last_t, busy = 0.0, edges[0][0], 0  # busy: engines running a forward
    for t, delta, w in edges:
        if busy:
            idle += (len(names) - busy) * (t - last_t)
        before = running[w] > 0
        running[w] += delta
        busy += (running[w] > 0) - before
        last_t = t
    span = edges[-1][0] - edges[0][0]
    ends: dict[int, float] = {}
    for e in engine:
        w = int(e.get("worker", 0))
        ends[w] = max(ends.get(w, float("-inf")), float(e["t_end"]))
    straggler = min(ends, key=lambda w: (-ends[w], w))
    return idle, len(names) * span, straggler


def imbalance(tokens: Sequence[float]) -> float:
    """Max over mean of the engines' predicted tokens outstanding (1.0 = even, and when none holds any)."""
    mean = sum(tokens) / len(tokens) if tokens else 0.0
    return max(tokens) / mean if mean > 0 else 1.0


def live_tokens(dispatch: Event, lost: Mapping[int, float]) -> list[float]:
    """A dispatch's tokens outstanding of the engines not lost by then (`lost`: engine -> time of its loss):
    a lost engine's zero is no engine left idle."""
    t = float(dispatch["t_start"])
    tokens = dispatch["tokens_outstanding"]
    return [x for w, x in enumerate(tokens) if w not in lost or t < lost[w]]


def engine_step(
    engine: Sequence[Event],
    dispatches: Sequence[Event],
    caps: dict[int, int],
    wall: float,
    lost: Mapping[int, float] | None = None,
) -> Event:
    """One step's multi-engine metrics (docs/metrics.md); `caps` holds the engines that count in the step,
    `lost` when each engine lost in the run was lost (its share of a later dispatch is left out)."""
    idle, span, straggler = cross_engine_idle(engine, caps)
    values = [imbalance(live_tokens(d, lost or {})) for d in dispatches]
    return {
        "engine_bubble": engine_bubbles(engine, caps, wall),
        "cross_engine_idle_s": idle,
        "engine_span_s": span,
        "cross_engine_idle_share": idle / span if span > 0 else None,
        "straggler_engine": straggler,
        "dispatches": len(dispatches),
        "dispatch_imbalance": sum(values) / len(values) if values else None,
    }


def engine_summary(steps: Sequence[Event]) -> Event:
    """The run's multi-engine metrics: each engine's bubble and cross-engine idle as ratios of sums over the
    steps, the steps each engine was the straggler in, the mean dispatch imbalance over dispatches."""
    slot_idle: Counter[str] = Counter()
    window: Counter[str] = Counter()
    for s in steps:
        for w, b in s["engine_bubble"].items():
            if b is not None:  # an engine's slots are the run's in every step: they cancel in the ratio
                slot_idle[w] += b * s["timing_s/gen"]
                window[w] += s["timing_s/gen"]
    idle, span = sum(s["cross_engine_idle_s"] for s in steps), sum(s["engine_span_s"] for s in steps)
    weighted = [
        (s["dispatch_imbalance"], s["dispatches"]) for s in steps if s["dispatch_imbalance"] is not None
    ]
    n = sum(k for _, k in weighted)
    stragglers = Counter(str(s["straggler_engine"]) for s in steps if s["straggler_engine"] is not None)
    return {
        "engine_bubble": {w: slot_idle[w] / window[w] if window[w] else None for w in sorted(window)},
        "cross_engine_idle_share": idle / span if span > 0 else None,
        "straggler_steps": dict(sorted(stragglers.items())),
        "dispatch_imbalance": sum(v * k for v, k in weighted) / n if n else None,
    }


def engines_lost(lost: Mapping[int, Event], steps: Sequence[Event]) -> list[Event]:
    """Each engine lost in the run (`lost`: its ENGINE_LOST event), in the order lost: which engine, in which
    step, when (the trace's clock, and seconds into that step's rollout), and how many of its requests were
    dispatched again to the others."""
    starts = {s["step"]: s.get("rollout_start") for s in steps}
    out = []
    for w, ev in sorted(lost.items(), key=lambda item: float(item[1]["t_start"])):
        t, step = float(ev["t_start"]), int(ev.get("step", 0))
        into = t - starts[step] if starts.get(step) is not None else None
        out.append({"engine": w, "step": step, "t": t, "into_rollout_s": into, "requests": ev["requests"]})
    return out
