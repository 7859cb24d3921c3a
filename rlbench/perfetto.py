"""A run as Chrome trace-event JSON, the format ui.perfetto.dev and chrome://tracing open.

Reads only the run directory's `trace.jsonl` (docs/metrics.md) and, when present, `metrics.json` (NVML
samples, the run's description, observed servers' URLs). One process per rollout worker (or observed
server) holds an `engine` thread of engine steps, one thread per KV slot with the requests that held it,
and counters of active slots (plus waiting requests and KV use for observed servers); a `run` process
holds the RL phases, migrations and NVML counters. Times are microseconds from the trace's start.
Contract: docs/perfetto.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbench.errors import UserError

ENGINE_KINDS = ("prefill", "decode", "verify")
PHASE_KINDS = ("rollout", "reward", "update", "sync")
RUN_PID = 0
US = 1e6
NVML_COUNTERS = (
    ("util", "GPU {} utilisation (%)"),
    ("mem_used_mib", "GPU {} memory (MiB)"),
    ("power_w", "GPU {} power (W)"),
)


def _meta(pid: int, tid: int | None, kind: str, value: Any) -> dict[str, Any]:
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"name" if "name" in kind else "sort_index": value}}
    if tid is not None:
        event["tid"] = tid
    return event


def _lanes(sequences: list[dict[str, Any]], engine: list[dict[str, Any]]) -> dict[str, int]:
    """A lane (thread) per request: its KV slot where the engine's slot maps say, else the first lane free at
    its admission (interval partitioning), so no two requests on one lane overlap."""
    slot_of: dict[str, int] = {}
    for ev in engine:
        for slot, seq in (ev.get("slots") or {}).items():
            slot_of.setdefault(str(seq), int(slot))
    lanes: dict[str, int] = {}
    busy_until: dict[tuple[int, int], float] = {}
    for seq in sorted(sequences, key=lambda s: s["_start"]):
        worker = int(seq.get("worker") or 0)
        lane = slot_of.get(str(seq["id"]))
        if lane is None or busy_until.get((worker, lane), -1.0) > seq["_start"]:
            lane = next(n for n in range(10**6) if busy_until.get((worker, n), -1.0) <= seq["_start"])
        busy_until[(worker, lane)] = seq["_end"]
        lanes[str(seq["id"])] = lane
    return lanes


def perfetto_trace(run_dir: Path) -> dict[str, Any]:
    from rlbench.records import read_json, read_jsonl

    trace_path = run_dir / "trace.jsonl"
    if not run_dir.is_dir():
        raise UserError(f"no run directory {run_dir}")
    if not trace_path.is_file():
        raise UserError(f"{run_dir} has no trace.jsonl (a run of train, profile, compare or observe has one)")
    events = read_jsonl(trace_path)
    doc = read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else {}
    run = doc.get("run") or {}
    servers = run.get("servers") or []
    engine = [e for e in events if e.get("kind") in ENGINE_KINDS]
    phases = [e for e in events if e.get("kind") in PHASE_KINDS]
    rollout_end = {e["step"]: e["t_end"] for e in phases if e["kind"] == "rollout"}
    last_seen: dict[str, float] = {}
    for ev in engine:
        for seq in (ev.get("slots") or {}).values():
            last_seen[str(seq)] = max(last_seen.get(str(seq), 0.0), float(ev["t_end"]))
    sequences = []
    for s in events:
        if s.get("kind") == "sequence" and s.get("t_admit") is not None:
            end = s.get("t_finish") or last_seen.get(str(s["id"])) or rollout_end.get(s.get("step"))
            sequences.append(
                {**s, "_start": float(s["t_admit"]), "_end": max(float(s["t_admit"]), float(end or 0))}
            )
    workers = sorted({int(e.get("worker") or 0) for e in engine + sequences})
    lanes = _lanes(sequences, engine)

    out: list[dict[str, Any]] = [
        _meta(RUN_PID, None, "process_name", "run"),
        _meta(RUN_PID, None, "process_sort_index", 0),
        _meta(RUN_PID, 0, "thread_name", "RL phases"),
    ]
    for w in workers:
        label = f"server {w}: {servers[w]}" if w < len(servers) else f"rollout worker {w}"
        out += [
            _meta(w + 1, None, "process_name", label),
            _meta(w + 1, None, "process_sort_index", w + 1),
            _meta(w + 1, 0, "thread_name", "engine steps"),
            _meta(w + 1, 0, "thread_sort_index", 0),
        ]
    for w, lane in sorted({(int(s.get("worker") or 0), lanes[str(s["id"])]) for s in sequences}):
        out += [
            _meta(w + 1, lane + 1, "thread_name", f"slot {lane}"),
            _meta(w + 1, lane + 1, "thread_sort_index", lane + 1),
        ]

    timed: list[dict[str, Any]] = []
    for ev in engine:
        pid, t0, t1 = int(ev.get("worker") or 0) + 1, float(ev["t_start"]), float(ev["t_end"])
        args = {
            k: ev[k] for k in ("step", "active_slots", "capacity", "tokens", "drafted", "accepted") if k in ev
        }
        timed.append(
            {
                "ph": "X",
                "name": ev["kind"],
                "cat": "engine",
                "pid": pid,
                "tid": 0,
                "ts": t0 * US,
                "dur": max(0.0, t1 - t0) * US,
                "args": args,
            }
        )
        for key, name in (
            ("active_slots", "active slots"),
            ("waiting", "waiting requests"),
            ("kv_usage", "KV use"),
        ):
            if ev.get(key) is not None:
                timed.append({"ph": "C", "name": name, "pid": pid, "ts": t0 * US, "args": {name: ev[key]}})
                timed.append({"ph": "C", "name": name, "pid": pid, "ts": t1 * US, "args": {name: 0}})
    for s in sequences:
        args = {
            k: s.get(k) for k in ("prompt_id", "sample", "status", "finish_reason", "response_tokens", "step")
        }
        timed.append(
            {
                "ph": "X",
                "name": f"{s.get('prompt_id')}/{s.get('sample')}",
                "cat": "request",
                "pid": int(s.get("worker") or 0) + 1,
                "tid": lanes[str(s["id"])] + 1,
                "ts": s["_start"] * US,
                "dur": (s["_end"] - s["_start"]) * US,
                "args": args,
            }
        )
    for p in phases:
        args = {
            k: v
            for k, v in p.items()
            if k not in ("kind", "t_start", "t_end") and not isinstance(v, (dict, list))
        }
        timed.append(
            {
                "ph": "X",
                "name": p["kind"],
                "cat": "phase",
                "pid": RUN_PID,
                "tid": 0,
                "ts": float(p["t_start"]) * US,
                "dur": max(0.0, float(p["t_end"]) - float(p["t_start"])) * US,
                "args": args,
            }
        )
    for m in (e for e in events if e.get("kind") == "migrate"):
        timed.append(
            {
                "ph": "i",
                "s": "p",
                "name": "migrate",
                "cat": "placement",
                "pid": int(m.get("from") or 0) + 1,
                "tid": 0,
                "ts": float(m["t_start"]) * US,
                "args": {"to": m.get("to"), "requests": m.get("requests")},
            }
        )
    for sample in (doc.get("gpu") or {}).get("samples") or []:
        for key, name in NVML_COUNTERS:
            if sample.get(key) is not None:
                label = name.format(sample["gpu"])
                timed.append(
                    {
                        "ph": "C",
                        "name": label,
                        "pid": RUN_PID,
                        "ts": float(sample["t"]) * US,
                        "args": {label: sample[key]},
                    }
                )
    timed.sort(key=lambda e: e["ts"])  # stable: a counter's 0 at t and a new value at the same t keep order
    other = {k: v for k, v in run.items() if not isinstance(v, (dict, list))}
    return {
        "traceEvents": out + timed,
        "displayTimeUnit": "ms",
        "otherData": {**other, "source": str(trace_path), "servers": servers},
    }


def export(run_dir: Path, out: Path | None = None) -> tuple[Path, dict[str, int]]:
    """Write the run's trace-event JSON (default RUN/trace.perfetto.json); returns it and counts per `ph`."""
    import json
    from collections import Counter

    from rlbench.records import write_text

    trace = perfetto_trace(run_dir)
    path = out or run_dir / "trace.perfetto.json"
    write_text(path, json.dumps(trace, separators=(",", ":")))  # compact: traces run to many MB
    return path, dict(Counter(e["ph"] for e in trace["traceEvents"]))
