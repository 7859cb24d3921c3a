"""The length log: the smallest thing any RL framework can dump, and the synchronous batch rebuilt from it.

Format (JSONL, one prompt group of one RL step per line):

    {"step": 3, "group": "q17", "prompt_tokens": 212, "response_tokens": [1874, 402, 977, 3310], "worker": 0}

- `step` (int >= 0), `group` (str or int: the prompt, stable across steps if the same prompt comes back) and
  `response_tokens` (a non-empty list of ints >= 1: every sample of the group) are required.
- `prompt_tokens` (int >= 0, default 0) and `worker` (int >= 0: the rollout engine that ran the group,
  default 0) are optional. Lines of one step are in submission order. Anything else is ignored.

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

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_jsonl, write_jsonl
from reference_trainer.trace.schema import DECODE, ROLLOUT, SEQUENCE
from rlbench.simulate.workload import LengthTrace, _from_rows

# Slot maps ({slot: sequence id}) make the report's slot-occupancy picture. They grow with the square of a
# batch, so a run's rebuilt events carry them only until this many map entries are written (the first steps).
SLOT_MAP_BUDGET = 1 << 20
MAX_TOKENS = 1 << 24  # a response longer than any context window: a corrupt log, not a workload


@dataclass(frozen=True)
class Group:
    step: int
    group: str
    lengths: tuple[int, ...]
    prompt_tokens: int = 0
    worker: int = 0

    def row(self) -> dict[str, Any]:
        return {"step": self.step, "group": self.group, "prompt_tokens": self.prompt_tokens,
                "response_tokens": list(self.lengths), "worker": self.worker}  # fmt: skip


def _count(value: Any, low: int) -> bool:
    return type(value) is int and value >= low


def problem(row: dict[str, Any]) -> str | None:
    """What is wrong with one length-log line (None: nothing)."""
    if not _count(row.get("step"), 0):
        return f"step is {row.get('step')!r}, not an integer >= 0"
    if not isinstance(row.get("group"), (str, int)) or isinstance(row.get("group"), bool):
        return f"group is {row.get('group')!r}, not a string or integer"
    lengths = row.get("response_tokens")
    if not isinstance(lengths, list) or not lengths or not all(_count(n, 1) for n in lengths):
        return "response_tokens is not a non-empty list of integers >= 1"
    if max(lengths) > MAX_TOKENS:
        return f"response_tokens holds {max(lengths):,}: more than {MAX_TOKENS:,} tokens"
    for key in ("prompt_tokens", "worker"):
        if row.get(key) is not None and not _count(row[key], 0):
            return f"{key} is {row[key]!r}, not an integer >= 0"
    return None


def read(path: str | Path) -> list[Group]:
    """A length log's groups; a malformed line is a one-line UserError naming the file and line."""
    rows = read_jsonl(path, ("step", "group", "response_tokens"), torn_tail=False, check=problem)
    if not rows:
        raise UserError(f"{path}: no groups in the length log")
    return [
        Group(r["step"], str(r["group"]), tuple(r["response_tokens"]), r.get("prompt_tokens") or 0,
              r.get("worker") or 0)
        for r in rows
    ]  # fmt: skip


def write(path: str | Path, groups: Iterable[Group]) -> None:
    write_jsonl(path, [g.row() for g in groups])


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
    free = list(range(slots))
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
    windows = windows or {}
    workers = sorted({g.worker for g in groups})
    events: list[dict[str, Any]] = []
    clock, map_entries = 0.0, 0
    for step, step_groups in by_step(groups).items():
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
            events.append({"kind": ROLLOUT, "step": step, "t_start": t0, "t_end": t1, "source": "rebuilt"})
        for w in workers:  # a worker with nothing to do this step still counts as idle slots
            events.append({"kind": DECODE, "step": step, "t_start": t0, "t_end": t0, "active_slots": 0,
                           "capacity": slots, "tokens": 0, "worker": w})  # fmt: skip
        for w, (placed, stretches) in batches.items():
            ids = [f"{step}-{j}-{k}" for j, _, k in samples[w]]  # unique even if a group name repeats
            with_maps = map_entries + sum(n for _, _, n in stretches) <= SLOT_MAP_BUDGET
            maps = _slot_maps(placed, ids, stretches) if with_maps else None
            for a, b, n in stretches:
                event = {"kind": DECODE, "step": step, "t_start": at(a), "t_end": at(b), "active_slots": n,
                         "capacity": slots, "tokens": n * (b - a), "worker": w}  # fmt: skip
                if maps is not None:
                    event["slots"] = next(maps)
                    map_entries += n
                events.append(event)
            for (_, g, k), (a, b, _), sid in zip(samples[w], placed, ids, strict=True):
                events.append({"kind": SEQUENCE, "step": step, "id": sid, "prompt_id": g.group, "sample": k,
                               "prompt_tokens": g.prompt_tokens, "response_tokens": g.lengths[k],
                               "t_admit": at(a), "t_finish": at(b), "status": "finished",
                               "finish_reason": None, "policy_versions": None, "worker": w,
                               "length_source": "log"})  # fmt: skip
    return events


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
