"""The trace's schema: which event kinds exist and the fields every reader relies on (docs/metrics.md).

The writer (writer.py) records these kinds; metrics, reports, the Perfetto export and the simulator read
them through the names here, and `check_events` refuses a malformed trace (a hand-edited or foreign file)
with one line naming the event, before any reader trips over it deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_jsonl

Event = dict[str, Any]

# Engine forwards, one event each on one worker's slots: a batched prefill, a decode step, a speculative
# verification (drafted and accepted tokens).
PREFILL, DECODE, VERIFY = "prefill", "decode", "verify"
FORWARD_KINDS = (PREFILL, DECODE, VERIFY)
DECODE_KINDS = (DECODE, VERIFY)  # forwards that generate tokens for running sequences
# The trainer's phases: the RL step's four, and the held-out evaluation between steps (not part of a step's
# time: it is the same work whatever the mode).
ROLLOUT, REWARD, UPDATE, SYNC, HELDOUT = "rollout", "reward", "update", "sync", "heldout"
# A rollout run ahead of the update (modes async, sorted+async: rollout/ahead.py) adds two waits: the update
# waiting for its samples, and the rollout waiting for the weights it must start from (or buffer room).
TRAINER_WAIT, ROLLOUT_WAIT = "trainer_wait", "rollout_wait"
STEP_PHASE_KINDS = (ROLLOUT, TRAINER_WAIT, REWARD, UPDATE, SYNC)
PHASE_KINDS = (*STEP_PHASE_KINDS, ROLLOUT_WAIT, HELDOUT)
# The `side` of a phase a run ahead's rollout process wrote: its phases of a step overlap the trainer's
# earlier steps, so a step's time is the span of the phases without it (the trainer's; all, synchronous).
ROLLOUT_SIDE = "rollout"
SEQUENCE = "sequence"  # one per sample: admission, finish, tokens, the policy versions that wrote it
MIGRATE = "migrate"  # a request moved between rollout workers (HistoPipe straggler migration)
CAPTURE = "capture"  # an engine capturing its CUDA graphs before its first step: no metric counts it
ENGINE_KINDS = (*FORWARD_KINDS, CAPTURE)  # written by one engine: each names it (`worker`)
# A dispatch policy's decision over a batch of requests (rollout/dispatch.py): the engine of each request,
# and every engine's predicted tokens outstanding once the batch is assigned.
DISPATCH = "dispatch"
# An engine lost mid-run (a dead Ray actor: rollout/rebalance.py): which one, at which step, and how many of
# its requests went to the others. Engine metrics leave it out from this event on (trace/engines.py).
ENGINE_LOST = "engine_lost"

# The numeric fields each kind must carry (a sequence's times may be null: never admitted, never finished).
NUMBERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(FORWARD_KINDS, ("t_start", "t_end", "active_slots", "capacity")),
    **dict.fromkeys(PHASE_KINDS, ("t_start", "t_end")),
    SEQUENCE: ("t_admit", "t_finish"),
    MIGRATE: ("t_start",),
    DISPATCH: ("t_start",),
    ENGINE_LOST: ("t_start", "worker", "requests"),
    CAPTURE: ("t_start", "t_end"),
}
NULLABLE = {SEQUENCE}
# Past this, no number in an event is a time (30,000 years in seconds) or a count a run makes; 1e308 times
# are finite, but their differences are not (a bubble ratio of -inf%).
MAX_MAGNITUDE = 1e12
# Optional counts the readers add up (a forward's tokens, a verify's drafted and accepted tokens).
COUNTS = ("tokens", "drafted", "accepted", "draft_seqs", "lookahead_slots", "lookahead_tokens")
WORKER_FIELDS = ("worker", "from", "to")


def phase_event(kind: str, t_start: float, t_end: float, **fields: Any) -> Event:
    """A phase (PHASE_KINDS, or an engine's CAPTURE, which has a phase's shape but belongs to no step) from
    `t_start` to `t_end`: the one shape every writer of phases uses (the trainer's Trace, the engine's
    capture, a rollout run ahead, and the traces rebuilt from other frameworks' logs)."""
    if kind not in (*PHASE_KINDS, CAPTURE):
        raise ValueError(f"{kind!r} is no phase kind; valid: {', '.join((*PHASE_KINDS, CAPTURE))}")
    return {"kind": kind, "t_start": t_start, "t_end": t_end, **fields}


def forward_event(
    kind: str, t_start: float, t_end: float, active_slots: int, capacity: int, tokens: int, **fields: Any
) -> Event:
    """An engine forward (FORWARD_KINDS) over `active_slots` of a worker's `capacity` slots, emitting
    `tokens`: the one shape of the engine's Trace and of the traces rebuilt from server gauges and logs."""
    if kind not in FORWARD_KINDS:
        raise ValueError(f"{kind!r} is no forward kind; valid: {', '.join(FORWARD_KINDS)}")
    counts = {"active_slots": active_slots, "capacity": capacity, "tokens": tokens}
    return {"kind": kind, "t_start": t_start, "t_end": t_end, **counts, **fields}


def dispatch_event(
    t: float, step: int, policy: str, engines: Sequence[int], tokens_outstanding: Sequence[float]
) -> Event:
    """A dispatch decision at time `t` of step `step`: `engines`, one per request of the batch in the order
    the policy was given them; `tokens_outstanding`, one per engine, the predicted tokens each holds once the
    batch is assigned (what dispatch imbalance is read from). The one shape of every writer of dispatches."""
    outstanding = [float(x) for x in tokens_outstanding]
    head = {"kind": DISPATCH, "t_start": t, "t_end": t, "step": step, "policy": policy}
    return {**head, "engines": [int(w) for w in engines], "tokens_outstanding": outstanding}


def migrate_event(t: float, donor: int, thief: int, requests: int) -> Event:
    """`requests` not-yet-started requests moved at time `t` from engine `donor` to engine `thief`."""
    return {"kind": MIGRATE, "t_start": t, "t_end": t, "from": donor, "to": thief, "requests": requests}


def engine_lost_event(t: float, step: int, worker: int, requests: int) -> Event:
    """Engine `worker` lost at time `t` of step `step`, `requests` of its requests dispatched again."""
    lost = {"worker": worker, "requests": requests, "step": step}
    return {"kind": ENGINE_LOST, "t_start": t, "t_end": t, **lost}


def _dispatch_problem(event: Event) -> str | None:
    engines, tokens = event.get("engines"), event.get("tokens_outstanding")
    if not isinstance(engines, list) or not all(type(w) is int and w >= 0 for w in engines):
        return "engines is not a list of engine indices"
    if not isinstance(tokens, list) or not tokens or not all(is_number(x) and x >= 0 for x in tokens):
        return "tokens_outstanding is not a list of token counts, one per engine"
    if any(w >= len(tokens) for w in engines):
        return f"engines names an engine past the {len(tokens)} of tokens_outstanding"
    return None


SEQUENCE_STATUSES = ("finished", "aborted", "cached", "lookahead")


def sequence_event(
    id: str,
    prompt_id: str,
    sample: int,
    t_admit: float | None,
    t_finish: float | None,
    status: str,
    finish_reason: str | None = None,
    **fields: Any,
) -> Event:
    """One sample (SEQUENCE): its id, its prompt's and its draw's, when it was admitted and finished (null:
    never, or not known), how it ended, then the writer's optional fields (`step`, `prompt_tokens`,
    `response_tokens`, `policy_versions`, `drafted`, `accepted`, `worker`, `length_source`): the one shape
    of the engine's sequences and of the ones rebuilt from server gauges and length logs."""
    if status not in SEQUENCE_STATUSES:
        raise ValueError(f"{status!r} is no sequence status; valid: {', '.join(SEQUENCE_STATUSES)}")
    times = {"t_admit": t_admit, "t_finish": t_finish}
    ids = {"id": id, "prompt_id": prompt_id, "sample": sample}
    return {"kind": SEQUENCE, **ids, **times, "status": status, "finish_reason": finish_reason, **fields}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problem(event: Any) -> str | None:
    """What is wrong with one event for the readers (None: nothing). Unknown kinds pass: readers skip
    them, so a newer writer's events do not break an older reader."""
    if not isinstance(event, dict):
        return f"{type(event).__name__} is not an event object"
    kind = event.get("kind")
    for key in NUMBERS.get(kind, ()):
        value = event.get(key)
        if not is_number(value) and not (kind in NULLABLE and value is None):
            return f"{key} is {value!r}, not a number"
    for key in (*NUMBERS.get(kind, ()), *COUNTS):  # Infinity parses as JSON; 1e308 is finite
        value = event.get(key)
        if value is None and (key in COUNTS or kind in NULLABLE):
            continue
        if not is_number(value) or abs(value) > MAX_MAGNITUDE or (key in COUNTS and value < 0):
            return f"{key} is {value!r}, not a time or count a run makes"
    if kind in NUMBERS and "t_end" in NUMBERS[kind] and event["t_end"] < event["t_start"]:
        return f"t_end {event['t_end']:g} is before t_start {event['t_start']:g}"
    for key in WORKER_FIELDS:
        value = event.get(key)
        if value is not None and not (type(value) is int and value >= 0):
            return f"{key} is {value!r}, not a worker index"
    if kind == SEQUENCE and "id" not in event:
        return "a sequence without an id"
    if kind == DISPATCH and (why := _dispatch_problem(event)) is not None:
        return why
    slots = event.get("slots")
    if slots is not None and not (isinstance(slots, dict) and all(str(k).isdigit() for k in slots)):
        return "slots is not a {slot: sequence id} map"
    return None


def check_events(events: list[Any], source: Any) -> list[Event]:
    """`events` if every one passes `problem`, else a one-line UserError naming `source` and the event."""
    for n, event in enumerate(events, 1):
        if (why := problem(event)) is not None:
            kind = event.get("kind") if isinstance(event, dict) else None
            raise UserError(f"{source}: event {n} ({kind}): {why}")
    return events


def read_trace(path: Any) -> list[Event]:
    """A run's trace.jsonl, read (a torn last line dropped with a note) and checked: every reader's entry."""
    return check_events(read_jsonl(path), path)
