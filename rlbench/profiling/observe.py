"""`rlbench observe` and `rlbench profile --engine-metrics`: sample servers, derive, write, report.

A run directory holds `samples.jsonl` (the raw scrapes, appended every round, so a killed observation keeps
them and `rlbench observe --from-samples DIR` rebuilds the rest), `trace.jsonl` (the derived trace),
`metrics.json` and `report.html`, the same files as a profile of the reference trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_COUNT, UserError, check_integer, check_number
from reference_trainer.inputs import open_input
from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_json, read_jsonl, write_json, write_jsonl
from reference_trainer.trace.schema import DECODE, ROLLOUT, is_number
from rlbench.observe.derive import server_stats, to_trace
from rlbench.observe.nvml import NvmlSampler
from rlbench.observe.sampler import ServerSampler
from rlbench.observe.scrape import MAX_SERVERS, row_problem
from rlbench.observe.whatif import predict
from rlbench.report.profile_report import render_profile
from rlbench.rundirs import OVERWRITE_HINT, check_new_run


@dataclass
class ObserveOptions:
    urls: list[str]
    interval_s: float = 0.1
    capacity: list[int] = field(default_factory=list)  # empty: exposed by the server, else the peak seen
    idle_gap_s: float | None = None  # None: 1 s (a rebuild: the observation's own)
    request_log: Path | None = None
    gpu: str = "h100"  # the simulator's presets for "what would SortedRL/RhymeRL buy here"
    model_size: str = "7b"

    @classmethod
    def from_cli(
        cls, urls: str | None, capacity: str | None, request_log: Path | None, **rest: Any
    ) -> ObserveOptions:
        """The options `observe` and `profile --engine-metrics` take, checked: comma-separated URLs (None: a
        rebuild, whose servers come from the run), --capacity, an existing --request-log."""
        if request_log is not None:  # read when the observation ends: a regular file, checked now
            try:
                open_input(request_log).close()
            except UserError as err:
                raise UserError(f"--request-log: {err}") from None
        parsed = server_urls(urls) if urls is not None else []
        caps = server_capacities(capacity, len(parsed) if urls is not None else None)
        return cls(urls=parsed, capacity=caps, request_log=request_log, **rest).check()

    def check(self) -> ObserveOptions:
        """Self, if every number is finite and in range (a NaN interval would never sample)."""
        check_number("--interval", self.interval_s, low=0.01, high=3600.0)
        if self.idle_gap_s is not None:
            check_number("--idle-gap", self.idle_gap_s, low=0.0, high=1e6)
        return self


def check_new_observation(out: Path, overwrite: bool) -> None:
    """Refuse to observe into a folder whose samples.jsonl would be replaced, unless `overwrite`: it is the
    only input `--from-samples` has (a killed observation is rebuilt from it, not observed again)."""
    rebuild = f"`rlbench observe --from-samples {out}` rebuilds its report"
    check_new_run(out, "observe", overwrite, f"{rebuild}; {OVERWRITE_HINT}")


def start_sampler(
    opts: ObserveOptions, out: Path, now: Callable[[], float], say: Callable[[str], None]
) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.jsonl").unlink(missing_ok=True)
    return ServerSampler(opts.urls, now, opts.interval_s, out / "samples.jsonl", say).start()


def finish(
    out: Path,
    rows: list[dict[str, Any]],
    opts: ObserveOptions,
    base: dict[str, Any],
    notes: list[str],
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Derive the trace and metrics from the scrapes, merge them into `base` (a profile document: run,
    summary, gpu, pyspy), write trace.jsonl, metrics.json and report.html; return the document. What the
    derivation doubts (counters of several servers behind one URL, implausible jumps) is said, not only
    written into the report."""
    opts.idle_gap_s = 1.0 if opts.idle_gap_s is None else opts.idle_gap_s
    events, derive_notes = to_trace(rows, opts.capacity or None, opts.idle_gap_s)
    for note in derive_notes:
        say(f"note: {note}")
    notes = [*notes, *derive_notes]
    write_jsonl(out / "trace.jsonl", events)
    computed = metrics.compute(events, base.get("gpu")) if events else {"summary": {}, "steps": []}
    caps = {int(e["worker"]): int(e["capacity"]) for e in events if e["kind"] == DECODE}
    if not any(e["kind"] == ROLLOUT for e in events):
        notes.append("no rollout phase seen: no server ran a request while observed")
    whatif: dict[str, Any] = {"available": False, "reason": "no rollout phase observed"}
    if caps:
        try:
            whatif = predict(
                events, max(caps.values()), len(caps), opts.request_log, opts.gpu, opts.model_size
            )
        except Exception as err:  # the prediction is an extra: it must never lose the observation
            whatif = {"available": False, "reason": f"{type(err).__name__}: {err}"}
    readable = {r["server"] for r in rows if "error" not in r}
    doc = {
        **base,
        "run": {
            **base.get("run", {}),
            "capacity_given": opts.capacity,
            "servers": opts.urls,
            "capacity": caps,
            "interval_s": opts.interval_s,
            "idle_gap_s": opts.idle_gap_s,
        },
        "summary": {**base.get("summary", {}), **computed["summary"]},
        "steps": computed["steps"],
        "engine_metrics": {
            "servers": server_stats(events, rows),
            "notes": notes,
            "whatif": whatif,
            "samples": len(rows),
            "failed_scrapes": sum(1 for r in rows if "error" in r),
            "unreadable": [u for i, u in enumerate(opts.urls) if i not in readable],
        },
    }
    write_json(out / "metrics.json", doc)
    render_profile(out, doc, events)
    return doc


def observe(
    opts: ObserveOptions, out: Path, duration_s: float, say: Callable[[str], None] = print, nvml: Any = None
) -> dict[str, Any]:
    """Sample the servers (and the GPUs) for `duration_s` seconds (Ctrl-C stops early) and write the run."""
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    gpu_sampler = NvmlSampler(now=now, interval_s=opts.interval_s, nvml=nvml).start()
    sampler = start_sampler(opts, out, now, say)
    try:
        while now() < duration_s:
            time.sleep(min(0.2, max(0.0, duration_s - now())))
    except KeyboardInterrupt:
        say("interrupted: writing what was observed")
    rows = sampler.stop()
    gpu = gpu_sampler.stop()
    base = {"run": {"kind": "observe", "wall_time_s": now()}, "summary": {}, "gpu": gpu, "pyspy": None}
    return finish(out, rows, opts, base, sampler.notes, say)


def samples_to_rebuild(out: Path) -> Path:
    """`out`/samples.jsonl, or a one-line refusal when there is none (checked before `out` is locked,
    which would create it)."""
    if not (out / "samples.jsonl").is_file():
        raise UserError(f"{out}: no samples.jsonl to rebuild from")
    return out / "samples.jsonl"


def observed_run_problem(run: Any) -> str | None:
    """What is wrong with an earlier metrics.json's `run` for a rebuild (None: nothing): the settings it
    carries over (servers, interval, idle gap, capacities) must be what observe wrote."""
    if not isinstance(run, dict):
        return "not an observation's metrics"
    servers, caps = run.get("servers"), run.get("capacity_given")
    if servers is not None and not (isinstance(servers, list) and all(isinstance(u, str) for u in servers)):
        return "run.servers is not a list of URLs"
    for key, low, high in (("interval_s", 0.01, 3600.0), ("idle_gap_s", 0.0, 1e6)):
        value = run.get(key)
        if value is not None and not (is_number(value) and low <= value <= high):
            return f"run.{key} is {value!r}, not a number in {low:g}..{high:g}"
    if caps is not None and not (
        isinstance(caps, list) and all(type(c) is int and 1 <= c <= MAX_COUNT for c in caps)
    ):
        return "run.capacity_given is not a list of slot counts"
    return None


def from_samples(opts: ObserveOptions, out: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Rebuild trace, metrics and report from a run directory's samples.jsonl (a killed observation)."""
    path = samples_to_rebuild(out)
    rows = read_jsonl(path, check=row_problem)  # a hand-edited or foreign file: one line naming file:line
    if not rows:  # an observation stopped before its first scrape: nothing to rebuild, said in one line
        raise UserError(f"{path}: no samples to rebuild from (the observation ended before its first scrape)")
    old = read_json(out / "metrics.json") if (out / "metrics.json").is_file() else {}
    run = old.get("run", {"kind": "observe"}) if isinstance(old, dict) else None
    if (why := observed_run_problem(run)) is not None:
        raise UserError(f"{out / 'metrics.json'}: {why}; remove it to rebuild from samples.jsonl alone")
    servers = max((int(r["server"]) for r in rows), default=-1) + 1
    opts.urls = opts.urls or run.get("servers") or [f"server {i}" for i in range(servers)]
    opts.interval_s = run.get("interval_s", opts.interval_s)
    if opts.idle_gap_s is None:
        opts.idle_gap_s = run.get("idle_gap_s")
    if not opts.capacity and run.get("capacity_given"):  # the capacity the observation was given
        opts.capacity = list(run["capacity_given"])
    summary = {k: v for k, v in old.get("summary", {}).items() if k in ("wall_time_s", "exit_code")}
    base = {"run": run, "summary": summary, "gpu": old.get("gpu"), "pyspy": old.get("pyspy")}
    return finish(out, rows, opts, base, [], say)


def server_urls(text: str) -> list[str]:
    """Comma-separated Prometheus endpoints; a bare host:port gets http:// and /metrics. A URL given more
    than once is one server, sampled once (a second sampler would count its requests twice)."""
    urls = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "://" not in part:
            part = "http://" + part
        if not part.startswith(("http://", "https://")):
            raise UserError(f"engine metrics URL must be http(s): {part!r}")
        if part.rstrip("/").count("/") == 2:  # scheme://host[:port] alone
            part = part.rstrip("/") + "/metrics"
        urls.append(part)
    urls = list(dict.fromkeys(urls))
    if not urls:
        raise UserError("no engine metrics URL given")
    if len(urls) > MAX_SERVERS:  # each server is sampled in a thread of its own
        raise UserError(f"{len(urls)} metrics URLs: at most {MAX_SERVERS} servers in one observation")
    return urls


def server_capacities(text: str | None, servers: int | None) -> list[int]:
    """--capacity: one value for every server or one per server (`servers`; None: not known yet)."""
    if not text:
        return []
    try:
        caps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--capacity: expected integers, got {text!r}") from None
    if not caps or min(caps) < 1 or (servers is not None and len(caps) not in (1, servers)):
        raise UserError(f"--capacity: give one positive value or one per server ({servers}), got {text!r}")
    return [check_integer("--capacity", cap, low=1) for cap in caps]
