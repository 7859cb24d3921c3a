"""Server samples -> rollout phases and a trace in the trace.jsonl contract (docs/metrics.md).

The metrics of an observed server are then computed by `reference_trainer.trace.metrics`, the code that
measures the reference trainer, so "bubble ratio" means the same thing for both. How the samples become a
trace:

- **Phases.** A rollout phase is a stretch of time in which some server runs at least one request (a start
  or end between two scrapes is placed at their midpoint), closed by an idle gap (every server at 0
  running) of at least `idle_gap_s`; shorter gaps stay inside the phase and count as idle slots. Phase k
  becomes a `rollout` event of step k.
- **Occupancy.** Each interval between two scrapes of a server is split at its midpoint, and each half takes
  the running count of the scrape it is nearest to: a trapezoid estimate of slot-time with whole slots. Each
  half with at least one request is a `decode` event on worker = the server's index, with `capacity` = the
  server's slots and `tokens` = the growth of its generation-token counter, plus `waiting` and `kv_usage`.
  A zero-length event opens each phase for each server, so a server idle for a whole phase still counts.
- **Requests.** Each finished request (growth of the success counter) becomes a `sequence` event finished at
  the scrape that saw it (at most one interval late). Its `response_tokens` and `prompt_tokens` come from the
  growth of vLLM's length histograms in that interval, one value per request, the middle of its bucket
  (`length_source: "histogram"`); SGLang has no such histograms, so its requests carry no lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reference_trainer.trace import metrics
from reference_trainer.trace.schema import (
    DECODE,
    ROLLOUT,
    SEQUENCE,
    forward_event,
    phase_event,
    sequence_event,
)

Row = dict[str, Any]


@dataclass
class Phase:
    step: int
    t_start: float
    t_end: float


# A counter read back is the server's word: a success counter that grows by more than this between two
# scrapes is not counting requests (no server finishes 100,000 in one scrape interval), and recording one
# event per request it claims would take memory without bound. Past MAX_SEQUENCES finished requests in one
# observation, requests are still counted in the rates but no longer recorded one by one.
MAX_FINISHED_PER_SCRAPE = 100_000
MAX_SEQUENCES = 500_000


def _bucket_values(
    now: dict[str, float] | None, before: dict[str, float] | None, limit: int
) -> list[tuple[float, float]]:
    """(representative length, upper bound) per request counted between two cumulative histograms, for
    the first `limit` requests (what a histogram claims is bounded by what the success counter says)."""
    if not now:
        return []
    edges = sorted((float(le), n) for le, n in now.items())
    old = {float(le): n for le, n in (before or {}).items()}
    out: list[tuple[float, float]] = []
    lower, below_now, below_old = 0.0, 0.0, 0.0
    for le, cum in edges:
        new = max(0, min(limit - len(out), round((cum - below_now) - (old.get(le, 0.0) - below_old))))
        mid = lower if math.isinf(le) else (lower + le) / 2 if lower else le
        out += [(max(1.0, mid), le)] * new
        lower, below_now, below_old = le, cum, old.get(le, 0.0)
    return out


def _growth(row: Row, last: Row, key: str) -> float:
    """Counter growth between two scrapes; after a restart the counter started again from 0."""
    a, b = last.get(key), row.get(key)
    if a is None or b is None:
        return 0.0
    return float(b) if row.get("restarted") else max(0.0, float(b) - float(a))


def series(rows: list[Row]) -> dict[int, list[Row]]:
    """Each server's successful scrapes in time order."""
    out: dict[int, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r["t"]):
        if "error" not in row and row.get("running") is not None:
            out.setdefault(int(row["server"]), []).append(row)
    return out


def capacities(per_server: dict[int, list[Row]], given: list[int] | None) -> tuple[dict[int, int], list[str]]:
    """Slots per server: given (one value for all, or one per server), else what the server exposes, else
    the peak running count seen (a lower bound: the bubble ratio is then a lower bound too)."""
    caps, notes = {}, []
    for s, rows in per_server.items():
        exposed = next((int(r["capacity"]) for r in reversed(rows) if r.get("capacity")), None)
        if given:
            caps[s] = given[s] if len(given) > 1 else given[0]
        elif exposed:
            caps[s] = exposed
        else:
            caps[s] = max(1, int(max(r["running"] for r in rows)))
            notes.append(
                f"server {s}: capacity not exposed; using the peak running count {caps[s]} "
                "(pass --capacity, e.g. vLLM's --max-num-seqs; the bubble ratio is a lower bound)"
            )
    return caps, notes


def phases(per_server: dict[int, list[Row]], idle_gap_s: float) -> list[Phase]:
    busy: list[tuple[float, float]] = []
    for rows in per_server.values():
        for a, b in zip(rows, rows[1:], strict=False):
            # a change between two scrapes is placed at their midpoint, as the occupancy halves are
            mid = (a["t"] + b["t"]) / 2
            if a["running"] > 0 or b["running"] > 0:
                busy.append((a["t"] if a["running"] > 0 else mid, b["t"] if b["running"] > 0 else mid))
    merged: list[list[float]] = []
    for t0, t1 in sorted(busy):
        if merged and t0 - merged[-1][1] < idle_gap_s:
            merged[-1][1] = max(merged[-1][1], t1)
        else:
            merged.append([t0, t1])
    return [Phase(k, t0, t1) for k, (t0, t1) in enumerate(merged)]


def to_trace(
    rows: list[Row], capacity: list[int] | None = None, idle_gap_s: float = 1.0
) -> tuple[list[Row], list[str]]:
    """The trace events of an observation (phases, engine steps, finished requests) and notes on it."""
    per_server = series(rows)
    caps, notes = capacities(per_server, capacity)
    found = phases(per_server, idle_gap_s)
    events: list[Row] = []
    for p in found:
        events.append(phase_event(ROLLOUT, p.t_start, p.t_end, step=p.step, source="observed"))
        for s in per_server:
            events.append(forward_event(DECODE, p.t_start, p.t_start, 0, caps[s], 0, step=p.step, worker=s))
    notes += _balancer_notes(per_server)
    implausible: set[int] = set()
    recorded, capped = 0, False
    for s, srows in per_server.items():
        for a, b in zip(srows, srows[1:], strict=False):
            mid = (a["t"] + b["t"]) / 2
            p = next((p for p in found if p.t_start <= mid <= p.t_end), None)
            if p is None:
                continue
            events += _interval_forwards(a, b, p, caps[s], s)
            finished = int(min(_growth(b, a, "finished"), MAX_FINISHED_PER_SCRAPE + 1))
            if finished > MAX_FINISHED_PER_SCRAPE:
                if s not in implausible:
                    implausible.add(s)
                    notes.append(
                        f"server {s}: its success counter grew by more than {MAX_FINISHED_PER_SCRAPE:,} "
                        "between two scrapes; not counted as requests"
                    )
                continue
            if recorded + finished > MAX_SEQUENCES:
                if not capped:
                    capped = True
                    notes.append(f"more than {MAX_SEQUENCES:,} finished requests: later ones not recorded")
                continue
            recorded += finished
            events += _finished_requests(a, b, p.step, s, finished)
    return events, notes


def _balancer_notes(per_server: dict[int, list[Row]]) -> list[str]:
    """A note per server whose counters went backwards every few scrapes: a load balancer, not restarts."""
    notes = []
    for s, srows in per_server.items():
        restarts = sum(1 for r in srows[1:] if r.get("restarted"))
        if restarts >= 3 and restarts * 4 >= len(srows):  # a real restart is rare; this is every few scrapes
            notes.append(
                f"server {s}: its counters went backwards in {restarts} of {len(srows)} scrapes, which is "
                "not restarts but one URL in front of several servers (a load balancer): its tokens/s and "
                "requests are not one server's; observe each server's own metrics URL"
            )
    return notes


def _interval_forwards(a: Row, b: Row, p: Phase, capacity: int, s: int) -> list[Row]:
    """The decode steps of server `s` between two scrapes inside phase `p`: a half interval per scrape
    with requests running, the interval's tokens given to its busy halves by slot-time, so none is lost at
    a phase edge."""
    mid = (a["t"] + b["t"]) / 2
    halves = [
        (max(t0, p.t_start), min(t1, p.t_end), row)
        for t0, t1, row in ((a["t"], mid, a), (mid, b["t"], b))
        if row["running"] > 0 and min(t1, p.t_end) > max(t0, p.t_start)
    ]
    tokens = int(_growth(b, a, "generation_tokens"))
    weights = [row["running"] * (t1 - t0) for t0, t1, row in halves]
    shares = [int(tokens * w / sum(weights)) for w in weights]
    if shares:
        shares[-1] = tokens - sum(shares[:-1])
    events = []
    for (t0, t1, row), n in zip(halves, shares, strict=True):
        where = {"step": p.step, "worker": s, "waiting": row.get("waiting"), "kv_usage": row.get("kv_usage")}
        events.append(forward_event(DECODE, t0, t1, int(row["running"]), capacity, n, **where))
    return events


def _finished_requests(a: Row, b: Row, step: int, s: int, finished: int) -> list[Row]:
    """The `finished` requests server `s` completed between two scrapes, their lengths (and prompts')
    drawn from the histograms' growth where the server exports them."""
    since = None if b.get("restarted") else a
    lengths = _bucket_values(b.get("response_hist"), since and since.get("response_hist"), finished)
    prompts = _bucket_values(b.get("prompt_hist"), since and since.get("prompt_hist"), finished)
    events = []
    for k in range(finished):
        sid = f"s{s}-{b['t']:.3f}-{k}"
        seq = sequence_event(sid, sid, 0, None, b["t"], "finished", step=step, worker=s, length_source="none")
        if k < len(lengths):
            tokens, bound = lengths[k]
            seq.update(response_tokens=int(tokens), response_tokens_max=bound, length_source="histogram")
        if k < len(prompts):
            seq["prompt_tokens"] = int(prompts[k][0])
        events.append(seq)
    return events


def server_stats(events: list[Row], rows: list[Row]) -> dict[str, Any]:
    """Per server and overall: the metrics of docs/metrics.md from the derived trace, plus queueing and
    the long-tail indicator max response tokens / rollout wall time (slime's
    longest_sample_tokens_per_sec)."""
    phase_events = [e for e in events if e["kind"] == ROLLOUT]
    workers = sorted({int(e["worker"]) for e in events if "worker" in e and e["kind"] == DECODE})
    wall = sum(p["t_end"] - p["t_start"] for p in phase_events)
    out: dict[str, Any] = {}
    for label, keep in [("all", None), *((f"server {w}", w) for w in workers)]:
        mine = [e for e in events if keep is None or e.get("worker", keep) == keep]
        summary = metrics.compute(mine)["summary"] if phase_events else {}
        engine = [e for e in mine if e["kind"] == DECODE and e["t_end"] > e["t_start"]]
        span = wall * (len(workers) if keep is None else 1)  # slot-holder time: every server's phases
        queued = [e for e in engine if (e.get("waiting") or 0) > 0]
        waited = sum((e.get("waiting") or 0) * (e["t_end"] - e["t_start"]) for e in engine)
        per_phase = []  # slime's longest_sample_tokens_per_sec: the longest response / rollout wall time
        for p in phase_events:
            bounds = [e["response_tokens_max"] for e in mine if e["kind"] == SEQUENCE
                      and e["step"] == p["step"] and e.get("response_tokens_max") is not None]  # fmt: skip
            if bounds and not math.isinf(max(bounds)) and p["t_end"] > p["t_start"]:
                per_phase.append((max(bounds), max(bounds) / (p["t_end"] - p["t_start"])))
        rates = [r for _, r in per_phase]
        out[label] = {
            "bubble_ratio": summary.get("bubble_ratio"),
            "tail_time_share": summary.get("tail_time_share"),
            "rollout_tokens_per_s": summary.get("rollout_tokens_per_s"),
            "phases": len(phase_events),
            "rollout_time_s": wall,
            "finished_requests": sum(1 for e in mine if e["kind"] == SEQUENCE),
            "waiting_mean": waited / span if span else None,
            "waiting_max": max((e.get("waiting") or 0 for e in engine), default=0),
            "queued_time_share": sum(e["t_end"] - e["t_start"] for e in queued) / span if span else None,
            # upper bounds where lengths come from histogram buckets (the bucket's upper edge)
            "longest_response_tokens": max((b for b, _ in per_phase), default=None),
            "longest_sample_tokens_per_s": sum(rates) / len(rates) if rates else None,
        }
    return out
