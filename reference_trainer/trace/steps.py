"""Per-step metrics of the metrics contract (docs/metrics.md), from one step's trace events: the bubble,
the phases' times, the waits, speculation, the workers, staleness and what the update trained on. The
run-level summary is metrics.py's; the ledger is ledger.py's."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from reference_trainer.trace.engines import duration, engine_step
from reference_trainer.trace.schema import (
    DECODE_KINDS,
    DISPATCH,
    ENGINE_LOST,
    FORWARD_KINDS,
    HELDOUT,
    PHASE_KINDS,
    REWARD,
    ROLLOUT,
    ROLLOUT_SIDE,
    ROLLOUT_WAIT,
    SEQUENCE,
    STEP_PHASE_KINDS,
    SYNC,
    TRAINER_WAIT,
    UPDATE,
    VERIFY,
)

Event = dict[str, Any]


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def share(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


# Which side bounds the run (docs/metrics.md): an idle share at or above IDLE_HIGH is high.
IDLE_HIGH = 0.2
ROLLOUT_BOUND, TRAINER_BOUND = "rollout-bound", "trainer-bound"
BALANCED, SYNC_OVERHEAD = "balanced", "sync-overhead"


def bound_label(
    trainer_idle: float | None, rollout_idle: float | None, high: float = IDLE_HIGH
) -> str | None:
    """The one rule: trainer idle high and rollout idle low = rollout-bound (the trainer waits for samples);
    the reverse = trainer-bound; both high = sync-overhead (both sides wait: a synchronous hand-over, weight
    sync, data loading); both low = balanced. Null when either share is unknown."""
    if trainer_idle is None or rollout_idle is None:
        return None
    trainer_waits, rollout_waits = trainer_idle >= high, rollout_idle >= high
    if trainer_waits and rollout_waits:
        return SYNC_OVERHEAD
    if trainer_waits:
        return ROLLOUT_BOUND
    return TRAINER_BOUND if rollout_waits else BALANCED


def _split(events: Iterable[Event]) -> tuple[dict[int, list[Event]], ...]:
    """Each step's engine forwards, phases, sequences and dispatches (the first group a kind is in)."""
    groups = (FORWARD_KINDS, PHASE_KINDS, (SEQUENCE,), (DISPATCH,))
    parts: tuple[dict[int, list[Event]], ...] = tuple(defaultdict(list) for _ in groups)
    for ev in events:
        kind, step = ev.get("kind"), int(ev.get("step", 0))
        for part, kinds in zip(parts, groups, strict=True):
            if kind in kinds:
                part[step].append(ev)
                break
    return parts


def worker_capacities(events: Iterable[Event]) -> dict[int, int]:
    """Largest `capacity` seen per worker over the run (capacity is per worker)."""
    caps: dict[int, int] = {}
    for ev in events:
        if ev.get("kind") in FORWARD_KINDS:
            w = int(ev.get("worker", 0))
            caps[w] = max(caps.get(w, 0), int(ev.get("capacity", 0)))
    return caps


def lost_engines(events: Iterable[Event]) -> dict[int, Event]:
    """Each engine lost in the run (an ENGINE_LOST event): its first such event."""
    lost: dict[int, Event] = {}
    for ev in events:
        if ev.get("kind") == ENGINE_LOST:
            lost.setdefault(int(ev["worker"]), ev)
    return lost


def live_capacities(caps: dict[int, int], lost: dict[int, Event], step: int) -> dict[int, int]:
    """`caps` without the engines lost in a step before `step`: from the step after its loss an engine has
    no slots to leave idle (in the step it is lost it counts, as it held its slots until then)."""
    return {w: c for w, c in caps.items() if w not in lost or int(lost[w].get("step", 0)) >= step}


def rollout_window(phases: Sequence[Event], engine: Sequence[Event]) -> tuple[float, float, float] | None:
    """(start, end, wall time) of a step's rollout; see the module docstring for the fallback."""
    rollouts = [(float(p["t_start"]), float(p["t_end"])) for p in phases if p["kind"] == ROLLOUT]
    if rollouts:
        return min(s for s, _ in rollouts), max(e for _, e in rollouts), _union_length(rollouts)
    if engine:
        s, e = min(float(x["t_start"]) for x in engine), max(float(x["t_end"]) for x in engine)
        return s, e, e - s
    return None


def _tail_share(seqs: Sequence[Event], window: tuple[float, float, float] | None) -> float | None:
    if window is None or window[2] <= 0:
        return None
    # Only finishes inside this rollout: a partial-rollout buffer hands the update samples that finished in
    # an earlier step, and their old finish times say nothing about this step's tail.
    finishes = sorted(
        float(s["t_finish"])
        for s in seqs
        if s.get("status") == "finished"
        and s.get("t_finish") is not None
        and window[0] <= float(s["t_finish"]) <= window[1]
    )
    if not finishes:
        return None
    t90 = finishes[math.ceil(0.9 * len(finishes)) - 1]
    return min(1.0, max(0.0, (window[1] - t90) / window[2]))


def _phase_field(phases: Sequence[Event], kind: str, key: str) -> Any:
    for p in phases:
        if p["kind"] == kind and p.get(key) is not None:
            return p[key]
    return None


def _staleness(phases: Sequence[Event], consumed: Sequence[Event]) -> tuple[Counter[int], int]:
    hist: Counter[int] = Counter()
    unknown = 0
    update_version = _phase_field(phases, UPDATE, "policy_version")
    rollout_version = _phase_field(phases, ROLLOUT, "policy_version")
    for s in consumed:
        versions = s.get("policy_versions")
        n = int(s.get("response_tokens", 0))
        if update_version is None:
            unknown += len(versions) if versions else n
        elif versions:
            hist.update(int(update_version) - int(v) for v in versions)
        elif rollout_version is not None:
            hist[int(update_version) - int(rollout_version)] += n
        else:
            unknown += n
    return hist, unknown


def _waits(phases: Sequence[Event], wall: float, step_time: float | None) -> tuple[float, float | None]:
    """(trainer wait, rollout wait) of a step, in seconds. Run ahead (the step has a `trainer_wait` phase):
    the update's wait for its samples and the rollout's waits for weights or buffer room before this step's
    rollout began, as traced. Synchronous: the update waits out the whole rollout, and the engine waits out
    the rest of the step (reward, update, sync, the gaps)."""
    if any(p["kind"] == TRAINER_WAIT for p in phases):
        waited = sum(duration(p) for p in phases if p["kind"] == ROLLOUT_WAIT)
        return sum(duration(p) for p in phases if p["kind"] == TRAINER_WAIT), waited
    return wall, None if step_time is None else max(0.0, step_time - wall)


def _draft_counts(engine: Sequence[Event], seqs: Sequence[Event]) -> tuple[int, int]:
    verify = [e for e in engine if e["kind"] == VERIFY and "drafted" in e]
    if verify:
        return sum(int(e["drafted"]) for e in verify), sum(int(e.get("accepted", 0)) for e in verify)
    return sum(int(s.get("drafted", 0)) for s in seqs), sum(int(s.get("accepted", 0)) for s in seqs)


def _verify_num(ev: Event) -> int:
    return int(ev["draft_emitted"]) if "draft_emitted" in ev else int(ev.get("tokens", 0))


def _verify_den(ev: Event) -> int:
    return int(ev.get("draft_seqs", 0)) if "draft_emitted" in ev else int(ev.get("active_slots", 0))


def _slots(engine: list[Event], capacity: int, wall: float, step_time: float | None) -> Event:
    """The slot-time figures: the bubble, the tokens, lookahead's share, the rollout's idle share."""
    slot_time = sum(int(e.get("active_slots", 0)) * duration(e) for e in engine)
    tokens = sum(int(e.get("tokens", 0)) for e in engine) if engine else None  # no engine: unknown, not 0
    lookahead_slot_time = sum(int(e.get("lookahead_slots", 0)) * duration(e) for e in engine)
    return {
        "bubble_ratio": (1.0 - slot_time / (capacity * wall)) if capacity and wall > 0 else None,
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": None if tokens is None else ratio(tokens, wall),
        "lookahead_tokens": sum(int(e.get("lookahead_tokens", 0)) for e in engine) if engine else None,
        "lookahead_slot_share": ratio(lookahead_slot_time, capacity * wall),
        "rollout_idle_share": (1.0 - slot_time / (capacity * step_time))
        if engine and capacity and step_time
        else None,
        # kept for the overall ratios in summary(); cheap and useful to re-derive by hand
        "slot_time": slot_time,
        "lookahead_slot_time": lookahead_slot_time,
        "capacity": capacity,
    }


def _step_time(phases: list[Event], window: tuple[float, float, float] | None) -> tuple[float | None, bool]:
    """The step's time (first phase start to last phase end, the trainer's phases) and whether it has any
    step phase of the trainer's."""
    # The trainer's side: every phase of a synchronous step; of a step run ahead, the phases the trainer
    # wrote (its rollout ran earlier, beside the updates of earlier steps).
    step_phases = [p for p in phases if p.get("side") != ROLLOUT_SIDE and p["kind"] in STEP_PHASE_KINDS]
    spans = [(float(p["t_start"]), float(p["t_end"])) for p in step_phases] or (
        [(window[0], window[1])] if window else []
    )
    return (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else None, bool(step_phases)


def _times(phases: list[Event], wall: float, step_time: float | None, timed: bool) -> Event:
    """The phases' times, the trainer's busy and idle share, the two sides' waits."""
    trainer = [p for p in phases if p.get("side") != ROLLOUT_SIDE]
    timing = {k: sum(duration(p) for p in trainer if p["kind"] == k) for k in PHASE_KINDS}
    trainer_busy = _union_length(
        (float(p["t_start"]), float(p["t_end"])) for p in phases if p["kind"] in (REWARD, UPDATE)
    )
    trainer_wait, rollout_wait = _waits(phases, wall, step_time)
    return {
        "step_time_s": step_time,
        "trainer_busy_s": trainer_busy if timed else None,
        "trainer_idle_share": 1.0 - trainer_busy / step_time if timed and step_time else None,
        "timing_s/gen": wall,  # the union, so overlapping per-worker rollout phases count once
        **{f"timing_s/{k}": timing[k] for k in (REWARD, UPDATE, SYNC, HELDOUT)},
        "trainer_wait_s": trainer_wait,
        "rollout_wait_s": rollout_wait,
        "trainer_wait_share": share(trainer_wait, step_time),
        "rollout_wait_share": share(rollout_wait, step_time),
    }


def _drafts(engine: list[Event], seqs: list[Event]) -> Event:
    """Speculation: drafted and accepted tokens, acceptance, accepted length, coverage."""
    drafted, accepted = _draft_counts(engine, seqs)
    verify = [e for e in engine if e["kind"] == VERIFY]
    verify_seqs = sum(_verify_den(e) for e in verify)
    verify_tokens = sum(_verify_num(e) for e in verify)
    drafted_seqs = sum(int(e.get("draft_seqs", e.get("active_slots", 0))) for e in verify)
    decode_seq_steps = sum(
        int(e.get("active_slots", 0)) - int(e.get("lookahead_tokens", 0))
        for e in engine
        if e["kind"] in DECODE_KINDS
    )
    return {
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": ratio(accepted, drafted),
        "mean_accepted_len": ratio(verify_tokens, verify_seqs) if verify else None,
        "draft_coverage": ratio(drafted_seqs, decode_seq_steps),
        "verify_seqs": verify_seqs,
        "verify_tokens": verify_tokens,
        "drafted_seqs": drafted_seqs,
        "decode_seq_steps": decode_seq_steps,
    }


def _workers(engine: list[Event], caps: dict[int, int]) -> Event:
    """Each worker's busy time and idle share (against the slowest)."""
    busy: dict[int, float] = {w: 0.0 for w in caps}
    for e in engine:
        busy[int(e.get("worker", 0))] = busy.get(int(e.get("worker", 0)), 0.0) + duration(e)
    slowest = max(busy.values(), default=0.0)
    return {
        "worker_busy_s": {str(w): b for w, b in sorted(busy.items())},
        "worker_idle_share": {
            str(w): (1.0 - b / slowest) if slowest > 0 else None for w, b in sorted(busy.items())
        },
    }


def _trained(phases: list[Event], seqs: list[Event]) -> Event:
    """What the update trained on: staleness, reward, lengths, the sequences' fates."""
    consumed = [s for s in seqs if s.get("status") == "finished"]
    lengths = sorted(int(s.get("response_tokens", 0)) for s in consumed)
    hist, unknown = _staleness(phases, consumed)
    return {
        "update_tokens": _phase_field(phases, UPDATE, "tokens"),
        "staleness": {str(k): v for k, v in sorted(hist.items())},
        "staleness_unknown_tokens": unknown,
        "reward_mean": _phase_field(phases, REWARD, "reward_mean"),
        "accuracy": _phase_field(phases, REWARD, "accuracy"),
        "answer_rate": _phase_field(phases, REWARD, "answer_rate"),
        "loss": _phase_field(phases, UPDATE, "loss"),
        "policy_version": _phase_field(phases, UPDATE, "policy_version"),
        "response_len_mean": (sum(lengths) / len(lengths)) if lengths else None,
        "response_len_max": lengths[-1] if lengths else None,
        "update_batch_lengths": lengths,
        "trained_tokens": sum(lengths) if seqs else None,
        "sequences": dict(sorted(Counter(str(s.get("status")) for s in seqs).items())),
    }


def _step(
    step: int,
    engine: list[Event],
    phases: list[Event],
    seqs: list[Event],
    dispatches: list[Event],
    caps: dict[int, int],
    lost: dict[int, Event],
) -> Event:
    window = rollout_window(phases, engine)
    wall = window[2] if window else 0.0
    step_time, timed = _step_time(phases, window)
    return {
        "step": step,
        **_slots(engine, sum(caps.values()), wall, step_time),
        **_times(phases, wall, step_time, timed),
        "tail_time_share": _tail_share(seqs, window),
        **_drafts(engine, seqs),
        **_workers(engine, caps),
        **engine_step(engine, dispatches, caps, wall, {w: float(e["t_start"]) for w, e in lost.items()}),
        **_trained(phases, seqs),
        "rollout_start": window[0] if window else None,
        "rollout_end": window[1] if window else None,
    }


def step_metrics(events: Sequence[Event], capacities: dict[int, int] | None = None) -> list[Event]:
    """One dict per RL step (sorted by step) with every per-step metric of the contract. `capacities`
    (per-worker slot capacity) defaults to what the events show; a caller that sees only part of a run
    (the trainer, one step at a time) passes the run's so every worker counts in every step, and the
    run's ENGINE_LOST events so far with the step's, so an engine lost earlier counts in none."""
    engine, phases, seqs, dispatches = _split(events)
    caps = worker_capacities(events) if capacities is None else capacities
    lost = lost_engines(events)
    steps = sorted(set(engine) | set(phases) | set(seqs))
    return [
        _step(
            s,
            *(part.get(s, []) for part in (engine, phases, seqs, dispatches)),
            live_capacities(caps, lost, s),
            lost,
        )
        for s in steps
    ]


def mean_of(values: Iterable[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
