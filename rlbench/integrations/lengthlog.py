"""The length log: the smallest thing any RL framework can dump, and the synchronous batch rebuilt from it.

Its format and bounds: docs/integrations.md, "The length log" (the bounds are the constants below, each
refused at the line that passes it; workers x steps is bounded because each step's metrics keep every
worker's busy time).

Rebuilding a step (`rebuild`): every worker runs its samples in log order under continuous batching with
`slots` slots, one token per running sample per decode step (a synchronous rollout: the step waits for its
last sample on any worker). That yields, in decode-step units, when each sample held a slot; the rollout
window the framework measured (or the decode-step count, when no time is known) is spread evenly over those
decode steps. The result is trace events in the contract of docs/metrics.md, so `bubble_ratio` and
`tail_time_share` come from `reference_trainer.trace.metrics` like every other run's. The decode-step
bubble is exact for a synchronous batch with those slots; the time axis assumes equal decode steps.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.trace.records import iter_jsonl, write_jsonl
from reference_trainer.trace.schema import DECODE, ROLLOUT, forward_event, phase_event, sequence_event
from rlbench.simulate.workload import MAX_TOKENS, LengthTrace, _from_rows

# Slot maps ({slot: sequence id}) make the report's slot-occupancy picture. They grow with the square of a
# batch, so a run's rebuilt events carry them only until this many map entries are written (the first steps).
SLOT_MAP_BUDGET = 1 << 20
MAX_WORKERS = 4096  # rollout engines in one log (the what-if's largest count)
MAX_STEPS = 100_000  # RL steps in one log: each becomes a row of metrics.json
MAX_GROUP = 1 << 16  # samples of one prompt group (one line): GRPO groups are 2-64; the rebuild holds each
MAX_WORKER_STEPS = 1 << 20  # workers x steps: every step's metrics hold each worker's busy time
# One line's bytes, refused before it is parsed (a 1 GiB line of "1," would parse into a list of 4 GB):
# MAX_GROUP samples of 2^24 tokens are 9 bytes each, with a group name of 1,024 characters.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Group:
    step: int
    group: str
    lengths: tuple[int, ...]
    prompt_tokens: int = 0
    worker: int = 0

    def row(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "group": self.group,
            "prompt_tokens": self.prompt_tokens,
            "response_tokens": list(self.lengths),
            "worker": self.worker,
        }


def _count(value: Any, low: int) -> bool:
    return type(value) is int and value >= low


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def problem(row: dict[str, Any]) -> str | None:
    """What is wrong with one length-log line (None: nothing)."""
    bounds = {"step": MAX_COUNT, "prompt_tokens": MAX_TOKENS, "worker": MAX_COUNT}
    if not _count(row.get("step"), 0) or row["step"] > MAX_COUNT:
        return f"step is {_shown(row.get('step'))}, not an integer in 0..{MAX_COUNT}"
    if not isinstance(row.get("group"), (str, int)) or isinstance(row.get("group"), bool):
        return f"group is {_shown(row.get('group'))}, not a string or integer"
    if isinstance(row["group"], str) and len(row["group"]) > 1024:
        return f"group is a name of {len(row['group']):,} characters; at most 1,024"
    lengths = row.get("response_tokens")
    if isinstance(lengths, list) and len(lengths) > MAX_GROUP:  # before anything is built from it
        return f"response_tokens holds {len(lengths):,} samples: one group holds at most {MAX_GROUP:,}"
    if not isinstance(lengths, list) or not lengths or not all(_count(n, 1) for n in lengths):
        return "response_tokens is not a non-empty list of integers >= 1"
    if max(lengths) > MAX_TOKENS:
        return f"response_tokens holds {_shown(max(lengths))}: more than {MAX_TOKENS:,} tokens"
    for key in ("prompt_tokens", "worker"):
        if row.get(key) is not None and (not _count(row[key], 0) or row[key] > bounds[key]):
            return f"{key} is {_shown(row[key])}, not an integer in 0..{bounds[key]:,}"
    return None


class _Counted:
    """`problem` plus the log's bounds on distinct workers and steps, said at the line that passes one."""

    def __init__(self) -> None:
        self.steps: set[int] = set()
        self.workers: set[int] = set()

    def __call__(self, row: dict[str, Any]) -> str | None:
        if (why := problem(row)) is not None:
            return why
        self.steps.add(row["step"])
        self.workers.add(row.get("worker") or 0)
        if len(self.workers) > MAX_WORKERS:
            return f"{len(self.workers):,} workers so far: a length log names at most {MAX_WORKERS:,}"
        if len(self.steps) > MAX_STEPS:
            return f"{len(self.steps):,} steps so far: a length log holds at most {MAX_STEPS:,}"
        if len(self.steps) * len(self.workers) > MAX_WORKER_STEPS:
            size = f"{len(self.workers):,} workers x {len(self.steps):,} steps"
            return f"{size}: at most {MAX_WORKER_STEPS:,} (each step's metrics hold every worker's busy time)"
        return None


def read(path: str | Path) -> list[Group]:
    """A length log's groups, read line by line (no row is kept as JSON); a malformed line, or one past
    the log's bounds, is a one-line UserError naming the file and line."""
    groups = [
        Group(r["step"], str(r["group"]), tuple(r["response_tokens"]), r.get("prompt_tokens") or 0,
              r.get("worker") or 0)
        for r in iter_jsonl(path, ("step", "group", "response_tokens"), torn_tail=False,
                            check=_Counted(), line_limit=MAX_LINE_BYTES)
    ]  # fmt: skip
    if not groups:
        raise UserError(f"{path}: no groups in the length log")
    return groups


def write(path: str | Path, groups: Iterable[Group]) -> None:
    write_jsonl(path, (g.row() for g in groups))


def by_step(groups: Iterable[Group]) -> dict[int, list[Group]]:
    out: dict[int, list[Group]] = defaultdict(list)
    for g in groups:
        out[g.step].append(g)
    return dict(sorted(out.items()))


def variance_split(groups: list[Group]) -> dict[str, Any]:
    """How much of the response-length variance lies within prompt groups versus between them, pooled over
    steps (deviations from each step's own mean, so drift across steps is not counted). A per-prompt length
    predictor (HistoPipe's history, SortedRL-style length ranking) can only explain the between part."""
    within = between = 0.0
    for step_groups in by_step(groups).values():
        lengths = [n for g in step_groups for n in g.lengths]
        step_mean = sum(lengths) / len(lengths)
        for g in step_groups:
            mean = sum(g.lengths) / len(g.lengths)
            within += sum((n - mean) ** 2 for n in g.lengths)
            between += len(g.lengths) * (mean - step_mean) ** 2
    total = within + between
    return {
        "within_share": within / total if total > 0 else None,
        "between_share": between / total if total > 0 else None,
        "within_ss": within,
        "between_ss": between,
        "group_sizes": sorted({len(g.lengths) for g in groups}),
    }


def _batch(lengths: list[int], slots: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Continuous batching in decode-step units: (start, end, slot) per sample, and (start, end, running)
    for each stretch with a constant number of running samples."""
    placed: list[tuple[int, int, int]] = [(0, 0, 0)] * len(lengths)
    running: list[tuple[int, int, int]] = []  # heap of (end, slot, sample)
    free = list(range(min(slots, len(lengths))))  # never more slots in use than samples (--slots 2^31-1)
    heapq.heapify(free)
    nxt, now, stretches = 0, 0, []
    while nxt < len(lengths) or running:
        while free and nxt < len(lengths):
            slot = heapq.heappop(free)
            placed[nxt] = (now, now + lengths[nxt], slot)
            heapq.heappush(running, (now + lengths[nxt], slot, nxt))
            nxt += 1
        end = running[0][0]
        stretches.append((now, end, len(running)))
        while running and running[0][0] == end:
            heapq.heappush(free, heapq.heappop(running)[1])
        now = end
    return placed, stretches


def _slot_maps(
    placed: list[tuple[int, int, int]], ids: list[str], stretches: list[tuple[int, int, int]]
) -> Iterator[dict[str, str]]:
    """{slot: sequence id} during each stretch, updated from one stretch to the next."""
    by_start = sorted(range(len(placed)), key=lambda i: placed[i][0])
    by_end = sorted(range(len(placed)), key=lambda i: placed[i][1])
    held: dict[str, str] = {}
    s = e = 0
    for a, _, _ in stretches:
        while e < len(by_end) and placed[by_end[e]][1] <= a:
            held.pop(str(placed[by_end[e]][2]), None)
            e += 1
        while s < len(by_start) and placed[by_start[s]][0] <= a:
            held[str(placed[by_start[s]][2])] = ids[by_start[s]]
            s += 1
        yield dict(held)


def rebuild(
    groups: list[Group],
    slots: int,
    windows: dict[int, tuple[float, float]] | None = None,
    phases: bool = True,
) -> list[dict[str, Any]]:
    """Trace events (rollout phases, decode stretches, sequences) of the synchronous batches the log
    describes. `windows[step]` = (start, end) of the step's measured rollout; a step without one takes as
    many time units as decode steps, after the previous step. `phases=False` leaves the rollout phases out
    (the caller has the framework's own)."""
    return [e for step in rebuild_steps(groups, slots, windows, phases) for e in step]


def capacities(groups: Iterable[Group], slots: int) -> dict[int, int]:
    """Every worker's slots over the run: what the rebuilt steps' metrics count as capacity."""
    return {w: slots for w in sorted({g.worker for g in groups})}


def rebuild_steps(
    groups: list[Group],
    slots: int,
    windows: dict[int, tuple[float, float]] | None = None,
    phases: bool = True,
) -> Iterator[list[dict[str, Any]]]:
    """`rebuild`'s events one step at a time, so a long log is never held as events all at once. A worker
    with nothing to do in a step is idle for the whole step: its capacity is on the trace once, in the first
    step (trace metrics count every worker's capacity in every step)."""
    windows = windows or {}
    workers = sorted({g.worker for g in groups})
    clock, map_entries = 0.0, 0
    for step, step_groups in by_step(groups).items():
        events: list[dict[str, Any]] = []
        samples: dict[int, list[tuple[int, Group, int]]] = defaultdict(list)  # (line in step, group, sample)
        for j, g in enumerate(step_groups):
            samples[g.worker].extend((j, g, k) for k in range(len(g.lengths)))
        batches = {w: _batch([g.lengths[k] for _, g, k in s], slots) for w, s in samples.items()}
        decode_steps = max(stretches[-1][1] for _, stretches in batches.values())
        t0, t1 = windows.get(step, (clock, clock + decode_steps))
        clock = t1
        scale = (t1 - t0) / decode_steps

        def at(k: int, t0: float = t0, scale: float = scale) -> float:
            return t0 + k * scale

        if phases:
            events.append(phase_event(ROLLOUT, t0, t1, step=step, source="rebuilt"))
        for w in workers:  # a worker with nothing to do still counts as idle slots: its capacity, once
            events.append(forward_event(DECODE, t0, t0, 0, slots, 0, step=step, worker=w))
        workers = []
        for w, (placed, stretches) in batches.items():
            ids = [f"{step}-{j}-{k}" for j, _, k in samples[w]]  # unique even if a group name repeats
            with_maps = map_entries + sum(n for _, _, n in stretches) <= SLOT_MAP_BUDGET
            maps = _slot_maps(placed, ids, stretches) if with_maps else None
            for a, b, n in stretches:
                event = forward_event(DECODE, at(a), at(b), n, slots, n * (b - a), step=step, worker=w)
                if maps is not None:
                    event["slots"] = next(maps)
                    map_entries += n
                events.append(event)
            for (_, g, k), (a, b, _), sid in zip(samples[w], placed, ids, strict=True):
                lengths = {"prompt_tokens": g.prompt_tokens, "response_tokens": g.lengths[k]}
                event = sequence_event(sid, g.group, k, at(a), at(b), "finished", step=step, **lengths)
                events.append({**event, "policy_versions": None, "worker": w, "length_source": "log"})
        yield events


def decode_step_bubble(groups: list[Group], slots: int) -> float | None:
    """The rebuilt batches' bubble over decode steps: 1 - busy sample-steps / (slots x workers x decode
    steps), summed over steps. It needs no clock, so a run read with one (the TRL callback) and without
    (`rlbench import trl` of its output_dir) gives the same figure: the headline of an imported run."""
    workers = {g.worker for g in groups}
    busy = capacity = 0
    for step_groups in by_step(groups).values():
        lengths: dict[int, list[int]] = defaultdict(list)
        for g in step_groups:
            lengths[g.worker].extend(g.lengths)
        decode_steps = max(_batch(ls, slots)[1][-1][1] for ls in lengths.values())
        busy += sum(sum(ls) for ls in lengths.values())
        capacity += slots * len(workers) * decode_steps
    return 1.0 - busy / capacity if capacity else None


def to_length_trace(groups: list[Group], source: str) -> LengthTrace:
    """The simulator's length trace (rlbench.simulate.workload) of a length log."""
    rows = [{"step": g.step, "prompt_id": g.group, "sample": k, "prompt_tokens": g.prompt_tokens,
             "response_tokens": n} for g in groups for k, n in enumerate(g.lengths)]  # fmt: skip
    return _from_rows(rows, source)
