"""A run as Chrome trace-event JSON, the format ui.perfetto.dev and chrome://tracing open: the processes,
threads and counters of docs/perfetto.md (its contract), from the run directory's `trace.jsonl` and, when
present, `metrics.json`. Times are microseconds from the trace's start.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_json, write_text
from reference_trainer.trace.schema import (
    DISPATCH,
    ENGINE_LOST,
    FORWARD_KINDS,
    MIGRATE,
    PHASE_KINDS,
    ROLLOUT,
    SEQUENCE,
    Event,
    is_number,
    read_trace,
)

ENGINE_ARGS = ("step", "active_slots", "capacity", "tokens", "drafted", "accepted", "draft_seqs")
ENGINE_ARGS += ("draft_emitted", "width", "waiting", "kv_usage")  # verify extras; observed servers' gauges
REQUEST_ARGS = ("id", "prompt_id", "sample", "step", "status", "finish_reason", "response_tokens")
GAUGES = (("waiting", "waiting requests"), ("kv_usage", "KV cache use (0-1)"))  # observed servers
NVML_COUNTERS = (("util", "GPU {} utilisation (%)"), ("mem_used_mib", "GPU {} memory used (MiB)"))
NVML_COUNTERS += (("power_w", "GPU {} power (W)"),)
RUN_PID = 1  # pid and tid 0 are the idle process and thread ("swapper") to Perfetto: never used
LANES = 100_000  # tid = pid x LANES + lane: unique over the trace (some importers key threads by tid alone)


def _pid(worker: int) -> int:
    return worker + RUN_PID + 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)  # ns resolution is all a perf_counter trace has; keeps files small


def _clean(v: Any) -> Any:
    """JSON that every viewer parses: NaN/Infinity (a diverged loss) become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    return [_clean(x) for x in v] if isinstance(v, list) else v


def _worker(ev: Event, key: str = "worker") -> int:
    return int(ev.get(key) or 0)  # single-worker runs leave `worker` out of sequence events


def _first_fit(busy: dict[tuple[Any, ...], float], prefix: tuple[Any, ...], start: float, end: float) -> int:
    """The first lane under `prefix` free at `start`, then busy until `end`. Fed intervals in start order,
    first fit uses as few lanes as intervals ever overlap (interval partitioning): Perfetto draws spans on
    one thread as a stack, so spans that overlap without nesting must not share a thread."""
    n = 0
    while busy.get((*prefix, n), -math.inf) > start:
        n += 1
    busy[(*prefix, n)] = end
    return n


def _slot_runs(engine: list[Event]) -> dict[tuple[int, str], list[list[Any]]]:
    """Per (worker, sequence id): the [start, end, slot, step starts] runs of consecutive engine steps in
    which it held one KV slot. `t_admit` is when a request was queued, not when it got a slot, so these
    runs, not the sequence event, say when it occupied which slot."""
    runs: dict[tuple[int, str], list[list[Any]]] = defaultdict(list)
    previous: dict[int, dict[str, int]] = {}
    for ev in engine:  # sorted by t_start
        w, now = _worker(ev), {str(seq): int(slot) for slot, seq in (ev.get("slots") or {}).items()}
        for seq, slot in now.items():
            mine = runs[(w, seq)]
            if mine and previous.get(w, {}).get(seq) == slot:
                mine[-1][1] = max(mine[-1][1], ev["t_end"])
                mine[-1][3].append(ev["t_start"])
            else:
                mine.append([ev["t_start"], ev["t_end"], slot, [ev["t_start"]]])
        previous[w] = now
    return runs


def _requests(events: list[Event], engine: list[Event], phases: list[Event]) -> list[Event]:
    """One record per sequence event with an admission time: when it took its slot (`start`), which slot,
    when it left (t_finish; without one, its last engine step, else its step's rollout end) and its lane."""
    runs = _slot_runs(engine)
    rollout_end: dict[Any, float] = {}
    for p in phases:
        if p["kind"] == ROLLOUT:
            rollout_end[p.get("step")] = max(rollout_end.get(p.get("step"), p["t_end"]), p["t_end"])
    reqs = []
    for s in (e for e in events if e.get("kind") == SEQUENCE and e.get("t_admit") is not None):
        w, admit, fin = _worker(s), s["t_admit"], s.get("t_finish")
        held = [r for r in runs.get((w, str(s["id"])), []) if r[1] >= admit and (fin is None or r[0] <= fin)]
        # A partial rollout re-admitted into the slot it left, in the very next engine step, continues that
        # run: it took the slot at the run's first step after its admission.
        start = next((t for t in held[0][3] if t >= admit), max(admit, held[0][0])) if held else admit
        end = fin if fin is not None else held[-1][1] if held else rollout_end.get(s.get("step"), start)
        slot = int(held[0][2]) if held else None
        reqs.append({"seq": s, "worker": w, "admit": admit, "start": start, "end": max(end, start)})
        reqs[-1]["slot"] = slot
    busy: dict[tuple[Any, ...], float] = {}
    for r in sorted(reqs, key=lambda r: (r["start"], r["end"])):
        w, slot = r["worker"], r["slot"]
        if slot is not None and busy.get((w, "slot", slot), -math.inf) <= r["start"]:
            busy[(w, "slot", slot)], r["lane"] = r["end"], ("slot", slot)
        else:  # no slot map, or a clash in the data would make it overlap on its slot's lane
            r["lane"] = ("lane", _first_fit(busy, (w, "lane"), r["start"], r["end"]))
    return reqs


def _names(pid: int, lane: int | None, name: str, sort: int) -> list[Event]:
    """Metadata naming and ordering a process (lane None) or a thread: Perfetto sorts tracks by these."""
    what = "process" if lane is None else "thread"
    evs = [{"ph": "M", "pid": pid, "name": f"{what}_name", "args": {"name": name}}]
    evs.append({"ph": "M", "pid": pid, "name": f"{what}_sort_index", "args": {"sort_index": sort}})
    return evs if lane is None else [{**e, "tid": pid * LANES + lane} for e in evs]


def _span(name: str, cat: str, pid: int, lane: int, t0: float, t1: float, args: Event) -> Event:
    """A complete event; `dur` is the difference of the rounded ends, so it is never negative and adjacent
    spans that touch in the trace touch in the viewer."""
    ts = _us(t0)
    span = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": pid * LANES + lane, "ts": ts}
    return span | {"dur": max(0.0, _us(t1) - ts), "args": _clean(args)}


def _counter(pid: int, name: str, t: float, value: float) -> Event:
    """A process counter sample; the arg is `value` as Chrome's TRACE_COUNTER1 writes it (Perfetto names the
    track "<name> value")."""
    return {"ph": "C", "name": name, "pid": pid, "ts": _us(t), "args": {"value": value}}


def _engine_tracks(engine: list[Event]) -> list[Event]:
    """Engine steps on each worker's `engine steps` thread, and its counters: active slots from each step's
    start (slots stay held between one step's forwards, so it drops to 0 only after a step's last forward)
    and, for observed servers, the waiting and KV-use gauges."""
    out: list[Event] = []
    by_worker: dict[int, list[Event]] = defaultdict(list)
    for ev in engine:
        by_worker[_worker(ev)].append(ev)
    for w, evs in by_worker.items():
        for ev, nxt in zip(evs, [*evs[1:], None], strict=True):
            args = {k: ev[k] for k in ENGINE_ARGS if k in ev}
            out.append(_span(ev["kind"], "engine", _pid(w), 0, ev["t_start"], ev["t_end"], args))
            out.append(_counter(_pid(w), "active slots", ev["t_start"], ev["active_slots"]))
            out += [
                _counter(_pid(w), name, ev["t_start"], ev[k]) for k, name in GAUGES if is_number(ev.get(k))
            ]
            if nxt is None or nxt.get("step") != ev.get("step"):
                out.append(_counter(_pid(w), "active slots", ev["t_end"], 0))
    return out


def _request_tracks(reqs: list[Event], lane: Callable[[Event], int]) -> list[Event]:
    """Each request on its lane from when it took its KV slot to when it left, named by prompt so a GRPO
    group shares a colour; and per worker a `queued requests` counter: admitted, no slot yet."""
    out: list[Event] = []
    queue: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in reqs:
        s, queued_ms = r["seq"], round((r["start"] - r["admit"]) * 1e3, 3)
        args = {**{k: s.get(k) for k in REQUEST_ARGS}, "slot": r["slot"], "queued_ms": queued_ms}
        name = str(s.get("prompt_id") or s["id"])
        out.append(_span(name, "request", _pid(r["worker"]), lane(r), r["start"], r["end"], args))
        if r["start"] > r["admit"]:
            queue[r["worker"]] += [(r["admit"], 1), (r["start"], -1)]
    for w, changes in sorted(queue.items()):
        changes.sort()
        totals = accumulate(d for _, d in changes)
        out += [_counter(_pid(w), "queued requests", t, n) for (t, _), n in zip(changes, totals, strict=True)]
    return out


def _instant(name: str, cat: str, pid: int, t: float, args: Event) -> Event:
    """An instant mark on a process's first thread (a worker's engine steps, the run's RL phases)."""
    mark = {"ph": "i", "s": "p", "name": name, "cat": cat, "pid": pid, "tid": pid * LANES}
    return mark | {"ts": _us(t), "args": _clean(args)}


def _marks(migrations: list[Event], losses: list[Event], events: list[Event]) -> list[Event]:
    """Each straggler migration on the engine thread of the worker the requests left; each engine lost on its
    own engine thread (where its track stops); each dispatch decision on the run's phase track: the policy,
    the requests it sent to each engine and the engines' predicted tokens outstanding after it."""
    out: list[Event] = []
    for m in migrations:
        args = {k: m.get(k) for k in ("from", "to", "requests")}
        out.append(_instant("migrate", "migration", _pid(_worker(m, "from")), m["t_start"], args))
    for m in losses:
        args = {k: m.get(k) for k in ("step", "requests")}
        out.append(_instant("engine lost", "engine", _pid(_worker(m)), m["t_start"], args))
    for d in (e for e in events if e.get("kind") == DISPATCH):
        tokens, sent = d["tokens_outstanding"], Counter(d["engines"])
        args = {
            "policy": d.get("policy"),
            "requests per engine": ", ".join(str(sent[w]) for w in range(len(tokens))),
            "tokens outstanding": ", ".join(f"{x:g}" for x in tokens),
        }
        out.append(_instant("dispatch", "dispatch", RUN_PID, d["t_start"], args))
    return out


def perfetto_trace(run_dir: Path) -> dict[str, Any]:
    """The run's trace-event JSON object (see the module docstring and docs/perfetto.md)."""
    trace_path = run_dir / "trace.jsonl"
    if not run_dir.is_dir():
        raise UserError(f"no run directory {run_dir}")
    if not trace_path.is_file():
        if modes := sorted(p.parent.name for p in run_dir.glob("*/trace.jsonl")):
            raise UserError(  # a compare run: one trace per mode, in its subfolder
                f"{run_dir} holds its traces in subfolders, one per mode: export {run_dir / modes[0]} "
                f"({', '.join(modes)})"
            )
        raise UserError(f"{run_dir} has no trace.jsonl (a run of train, profile, compare or observe has one)")
    events = read_trace(trace_path)  # unreadable or malformed: one-line errors
    doc = read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else {}
    if not isinstance(doc, dict):
        raise UserError(f"{run_dir / 'metrics.json'}: not a JSON object")
    run = doc["run"] if isinstance(doc.get("run"), dict) else {}
    servers = run.get("servers") if isinstance(run.get("servers"), list) else []
    engine = sorted((e for e in events if e.get("kind") in FORWARD_KINDS), key=lambda e: e["t_start"])
    phases = [e for e in events if e.get("kind") in PHASE_KINDS]
    migrations = [e for e in events if e.get("kind") == MIGRATE]
    losses = [e for e in events if e.get("kind") == ENGINE_LOST]
    reqs = _requests(events, engine, phases)
    workers = {_worker(e) for e in engine} | {r["worker"] for r in reqs}
    workers |= {_worker(m, k) for m in migrations for k in ("from", "to")} | {_worker(m) for m in losses}
    n_slots: dict[int, int] = defaultdict(int)  # per worker: lanes 1..n are its slots, extra lanes follow
    for e in engine:
        n_slots[_worker(e)] = max([n_slots[_worker(e)], *(int(k) + 1 for k in e.get("slots") or {})])

    def lane_of(r: Event) -> int:
        kind, n = r["lane"]
        return 1 + n + (n_slots[r["worker"]] if kind == "lane" else 0)

    out = _names(RUN_PID, None, "run", 0) + _names(RUN_PID, 0, "RL phases", 0)
    for w in sorted(workers):
        label = f"server {w}: {servers[w]}" if w < len(servers) else f"rollout worker {w}"
        out += _names(_pid(w), None, label, _pid(w)) + _names(_pid(w), 0, "engine steps", 0)
    for w, t, kind, n in sorted({(r["worker"], lane_of(r), *r["lane"]) for r in reqs}):
        name = f"slot {n}" if kind == "slot" else f"extra lane {n}" if n_slots[w] else f"requests {n}"
        out += _names(_pid(w), t, name, t)

    timed = _engine_tracks(engine) + _request_tracks(reqs, lane_of)
    busy: dict[tuple[Any, ...], float] = {}
    for p in sorted(phases, key=lambda p: p["t_start"]):  # overlapping phases (per-worker rollouts) get lanes
        args = {k: v for k, v in p.items() if k not in ("kind", "t_start", "t_end")}
        args = {k: v for k, v in args.items() if not isinstance(v, (dict, list))}
        row = _first_fit(busy, (), p["t_start"], p["t_end"])
        timed.append(_span(p["kind"], "phase", RUN_PID, row, p["t_start"], p["t_end"], args))
    for row in range(1, len(busy)):
        out += _names(RUN_PID, row, f"RL phases {row}", row)
    timed += _marks(migrations, losses, events)
    gpu = doc["gpu"] if isinstance(doc.get("gpu"), dict) else {}
    for sample in (x for x in gpu.get("samples") or [] if isinstance(x, dict) and is_number(x.get("t"))):
        for k, name in NVML_COUNTERS:
            if is_number(sample.get(k)):
                timed.append(_counter(RUN_PID, name.format(sample.get("gpu") or 0), sample["t"], sample[k]))
    timed.sort(key=lambda e: e["ts"])  # stable: one track's events at one ts keep their order
    other = _clean({**run, "trace": str(trace_path)})
    return {"traceEvents": out + timed, "displayTimeUnit": "ms", "otherData": other}


def write(trace: dict[str, Any], path: Path) -> Path:
    """Write atomically as compact JSON (traces of long runs reach tens of MB; indenting adds a third)."""
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: no directory {path.parent}")
    try:
        write_text(path, json.dumps(trace, separators=(",", ":"), allow_nan=False))
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    return path
