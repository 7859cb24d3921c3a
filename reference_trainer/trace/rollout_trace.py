"""The open rollout trace: one JSON line per rollout request, in a schema any framework can write
(rollout_trace.schema.json beside this file; docs/metrics.md, "The open rollout trace").

`check` validates records against the schema (jsonschema) and a file's clock; `from_events` turns an rlbench
trace's sequence events into records. Converters from other frameworks' files live in
rlbench.integrations.convert; `records_by_step` and `occupancy` are what `rlbench audit` reads.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import FORWARD_KINDS, MAX_MAGNITUDE, SEQUENCE

SCHEMA_ID = "rlbench-rollout-trace/1"
SCHEMA_PATH = Path(__file__).with_name("rollout_trace.schema.json")
Record = dict[str, Any]


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def prompt_hash(prompt: Any) -> str:
    """sha1 hex (12 digits) of a prompt: its text, or the JSON of a chat's messages or a prompt id."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def check(records: Sequence[Any], source: Any) -> list[Record]:
    """`records` if each one matches the schema and its times are in order, else a one-line UserError
    naming `source`, the record and the first problem."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema())
    for n, record in enumerate(records, 1):
        error = next(iter(sorted(validator.iter_errors(record), key=lambda e: list(e.path))), None)
        if error is not None:
            where = "/".join(map(str, error.path)) or "the record"
            raise UserError(f"{source}: record {n}: {where}: {error.message}")
        if (why := _bounds(record) or _times(record)) is not None:
            raise UserError(f"{source}: record {n}: {why}")
    return list(records)


TIMES = ("t_admit", "t_first_token", "t_finish", "t_abort")
COUNTS = ("step", "sample", "prompt_tokens", "response_tokens")
# A record's optional fields, in the order a record lists them.
DRAFTS = ("drafted", "accepted")  # a request's speculation counts
OPTIONAL = ("sample", "engine", "prompt_tokens", *TIMES, "finish_reason", "policy_versions", *DRAFTS)


def _bounds(record: Record) -> str | None:
    """The readers' bounds, which the schema cannot say: times finite and within MAX_MAGNITUDE seconds,
    counts within MAX_COUNT (JSON allows NaN, Infinity, 1e400 and integers of any size)."""
    for key in TIMES:
        value = record.get(key)
        if value is not None and (
            isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_MAGNITUDE
        ):
            return f"{key} is {str(value)[:24]}, not a finite time within {MAX_MAGNITUDE:g} s"
    for key in COUNTS:
        value = record.get(key)
        if isinstance(value, int) and value > MAX_COUNT:
            return f"{key} is {str(value)[:24]}, past {MAX_COUNT}"
    return None


def _times(record: Record) -> str | None:
    admit, first, finish = record.get("t_admit"), record.get("t_first_token"), record.get("t_finish")
    if admit is not None and first is not None and first < admit:
        return f"t_first_token {first:g} is before t_admit {admit:g}"
    if admit is not None and finish is not None and finish < admit:
        return f"t_finish {finish:g} is before t_admit {admit:g}"
    if record.get("t_abort") is not None and record["status"] != "aborted":
        return f"t_abort is set but status is {record['status']!r}"
    return None


def read(path: str | Path) -> list[Record]:
    """An open rollout trace file, read and checked."""
    rows = read_jsonl(path, torn_tail=False)
    if not rows:
        raise UserError(f"{path}: no records")
    return check(rows, path)


def record(**fields: Any) -> Record:
    """One record with every optional field present (null where the source says nothing)."""
    return {"schema": SCHEMA_ID, **dict.fromkeys(OPTIONAL), **fields}


def spans(versions: Iterable[Any] | None) -> list[dict[str, Any]] | None:
    """Per-token policy versions as consecutive spans [{version, tokens}]."""
    if versions is None:
        return None
    out: list[dict[str, Any]] = []
    for v in versions:
        if out and out[-1]["version"] == v:
            out[-1]["tokens"] += 1
        else:
            out.append({"version": v, "tokens": 1})
    return out


def from_events(events: Sequence[dict[str, Any]], source: str = "rlbench") -> list[Record]:
    """An rlbench trace's sequence events as records; the first token is the end of the first engine forward
    whose slot map holds the sequence (null where the trace has no slot maps)."""
    first: dict[str, float] = {}
    for e in events:
        if e.get("kind") in FORWARD_KINDS and e.get("slots"):
            for sid in e["slots"].values():
                if sid not in first or e["t_end"] < first[sid]:
                    first[sid] = float(e["t_end"])
    out = []
    for e in events:
        if e.get("kind") != SEQUENCE:
            continue
        rebuilt = e.get("length_source") == "log"
        aborted = e.get("status") == "aborted"
        out.append(
            record(
                source=source,
                step=int(e.get("step", 0)),
                request_id=str(e["id"]),
                prompt_hash=prompt_hash(e.get("prompt_id", e["id"])),
                group=str(e.get("prompt_id", e["id"])),
                sample=e.get("sample"),
                engine=e.get("worker"),
                prompt_tokens=e.get("prompt_tokens"),
                response_tokens=int(e.get("response_tokens", 0)),
                t_admit=e.get("t_admit"),
                t_first_token=first.get(str(e["id"])),
                t_finish=e.get("t_finish"),
                t_abort=e.get("t_finish") if aborted else None,
                status=e.get("status", "finished"),
                finish_reason=e.get("finish_reason"),
                policy_versions=spans(e.get("policy_versions")),
                drafted=e.get("drafted"),
                accepted=e.get("accepted"),
                time_source="rebuilt" if rebuilt else "measured",
            )
        )
    return out


def records_by_step(records: Iterable[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        out[r["step"]].append(r)
    return dict(sorted(out.items()))


def occupancy(records: Sequence[Record], slots: int | None) -> dict[str, Any]:
    """A step's requests on the engines: the rollout window (first admission to last finish), the busy
    request-seconds (admission to finish: a queued request counts as busy, so this is a lower bound on the
    idle slots), the most requests running at once, and the slot bubble over the window with `slots` slots
    per engine (else with that peak as the capacity: a lower bound). Null without times."""
    timed = [r for r in records if r.get("t_admit") is not None and r.get("t_finish") is not None]
    if not timed:
        return {"window_s": None, "busy_s": None, "peak": None, "bubble": None, "capacity": None}
    start = min(r["t_admit"] for r in timed)
    end = max(r["t_finish"] for r in timed)
    busy = sum(r["t_finish"] - r["t_admit"] for r in timed)
    edges = sorted(
        [(r["t_admit"], 1) for r in timed] + [(r["t_finish"], -1) for r in timed], key=lambda x: (x[0], x[1])
    )
    running = peak = 0
    for _, d in edges:
        running += d
        peak = max(peak, running)
    engines = len({r.get("engine") for r in timed})
    capacity = slots * engines if slots else peak
    window = end - start
    bubble = 1.0 - busy / (capacity * window) if capacity and window > 0 else None
    return {"window_s": window, "busy_s": busy, "peak": peak, "bubble": bubble, "capacity": capacity}
