"""Every metric of the metrics contract (docs/metrics.md), computed from trace events alone (one place).

Inputs are the dicts of `trace.jsonl` (engine steps, phases, sequences). Per-step values are grouped by the
events' `step` field. Definitions that the contract leaves open are fixed here:

- rollout wall time of a step: total length of the union of its `rollout` phase intervals; when a step has
  no rollout phase, the span of its engine events (first t_start to last t_end).
- `bubble_ratio` = 1 - sum(active_slots * (t_end - t_start)) over the step's engine events (prefill, decode,
  verify) / (capacity * rollout wall time). Capacity is each worker's largest `capacity` over the whole
  run, summed over every worker seen in the run, so a worker that sat out a step counts as idle slots.
  Not clipped: a value below 0 means engine events lie outside the rollout phase (a tracing bug to see).
  Overall: the same ratio over all steps' slot-time (a ratio of sums, not a mean of ratios).
- `rollout_tokens_per_s` = sum of engine events' `tokens` (accepted tokens only) / rollout wall time.
- `step_time_s`: from the first phase start to the last phase end of the step (rollout, reward, update,
  sync and the gaps between them). `timing_s/gen|reward|update|sync`: summed durations of those phases.
- `tail_time_share`: let t90 be the time at which ceil(0.9 * n) of the step's n finished sequences
  (sequence events with status "finished" and this step, whose t_finish lies in the step's rollout window:
  samples a partial-rollout buffer carried over from an earlier step do not count) had finished; tail = (end
  of the rollout phase - t90) / rollout wall time, clipped to [0, 1]. Null when the step finished none.
- `acceptance_rate` = accepted / drafted draft tokens, from verify events' `drafted`/`accepted` when they
  carry them, else from the step's sequence events. Null when nothing was drafted.
- `mean_accepted_len` = tokens emitted by verify events / sequences in them (sum of `active_slots`): tokens
  per sequence per verification forward, bonus token included. Null without verify events. When a verify
  event carries `draft_emitted` (tokens emitted by its sequences that had a draft), only those sequences
  count (`draft_emitted` / `draft_seqs`): a sequence riding along with no draft emits 1 token and says
  nothing about drafts.
- `draft_coverage` = sequences that had a non-empty draft (verify events' `draft_seqs`, else all of a
  verify event's sequences) / sequence-steps of all decode and verify events. Null without decode events.
- `worker_idle_share[w]` = 1 - busy_w / max_v busy_v, busy = summed engine-event time of a worker in the
  step (the slowest worker is the one with the most busy time). Overall: summed busy over summed maximum.
- staleness of a token = `policy_version` of the step's update phase - the version that sampled it, over
  the sequences the update consumed (status "finished", same step). A sequence with null
  `policy_versions` takes the rollout phase's `policy_version` when present, else its tokens are counted
  in `staleness_unknown_tokens`.
- `bubble_ratio_gpu` = 1 - mean NVML utilisation of the samples inside rollout phases (null without samples).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from reference_trainer.trace.schema import (
    DECODE_KINDS,
    FORWARD_KINDS,
    PHASE_KINDS,
    REWARD,
    ROLLOUT,
    SEQUENCE,
    STEP_PHASE_KINDS,
    UPDATE,
    VERIFY,
)

Event = dict[str, Any]


def _dur(ev: Event) -> float:
    return max(0.0, float(ev["t_end"]) - float(ev["t_start"]))


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


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _split(
    events: Iterable[Event],
) -> tuple[dict[int, list[Event]], dict[int, list[Event]], dict[int, list[Event]]]:
    engine: dict[int, list[Event]] = defaultdict(list)
    phases: dict[int, list[Event]] = defaultdict(list)
    seqs: dict[int, list[Event]] = defaultdict(list)
    for ev in events:
        kind = ev.get("kind")
        step = int(ev.get("step", 0))
        if kind in FORWARD_KINDS:
            engine[step].append(ev)
        elif kind in PHASE_KINDS:
            phases[step].append(ev)
        elif kind == SEQUENCE:
            seqs[step].append(ev)
    return engine, phases, seqs


def worker_capacities(events: Iterable[Event]) -> dict[int, int]:
    """Largest `capacity` seen per worker over the run (capacity is per worker)."""
    caps: dict[int, int] = {}
    for ev in events:
        if ev.get("kind") in FORWARD_KINDS:
            w = int(ev.get("worker", 0))
            caps[w] = max(caps.get(w, 0), int(ev.get("capacity", 0)))
    return caps


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


def _draft_counts(engine: Sequence[Event], seqs: Sequence[Event]) -> tuple[int, int]:
    verify = [e for e in engine if e["kind"] == VERIFY and "drafted" in e]
    if verify:
        return sum(int(e["drafted"]) for e in verify), sum(int(e.get("accepted", 0)) for e in verify)
    return sum(int(s.get("drafted", 0)) for s in seqs), sum(int(s.get("accepted", 0)) for s in seqs)


def _verify_num(ev: Event) -> int:
    return int(ev["draft_emitted"]) if "draft_emitted" in ev else int(ev.get("tokens", 0))


def _verify_den(ev: Event) -> int:
    return int(ev.get("draft_seqs", 0)) if "draft_emitted" in ev else int(ev.get("active_slots", 0))


def _step(
    step: int, engine: list[Event], phases: list[Event], seqs: list[Event], caps: dict[int, int]
) -> Event:
    window = rollout_window(phases, engine)
    wall = window[2] if window else 0.0
    capacity = sum(caps.values())
    slot_time = sum(int(e.get("active_slots", 0)) * _dur(e) for e in engine)
    tokens = sum(int(e.get("tokens", 0)) for e in engine)

    timing = {k: sum(_dur(p) for p in phases if p["kind"] == k) for k in PHASE_KINDS}
    timing["rollout"] = wall  # union, so overlapping per-worker rollout phases are not double counted
    step_phases = [p for p in phases if p["kind"] in STEP_PHASE_KINDS]
    spans = [(float(p["t_start"]), float(p["t_end"])) for p in step_phases] or (
        [(window[0], window[1])] if window else []
    )
    step_time = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else None

    drafted, accepted = _draft_counts(engine, seqs)
    verify = [e for e in engine if e["kind"] == VERIFY]
    decode_like = [e for e in engine if e["kind"] in DECODE_KINDS]
    verify_seqs = sum(_verify_den(e) for e in verify)
    verify_tokens = sum(_verify_num(e) for e in verify)
    drafted_seqs = sum(int(e.get("draft_seqs", e.get("active_slots", 0))) for e in verify)
    decode_seq_steps = sum(int(e.get("active_slots", 0)) for e in decode_like)

    busy: dict[int, float] = {w: 0.0 for w in caps}
    for e in engine:
        busy[int(e.get("worker", 0))] = busy.get(int(e.get("worker", 0)), 0.0) + _dur(e)
    slowest = max(busy.values(), default=0.0)

    consumed = [s for s in seqs if s.get("status") == "finished"]
    lengths = sorted(int(s.get("response_tokens", 0)) for s in consumed)
    hist, unknown = _staleness(phases, consumed)
    status_counts = Counter(str(s.get("status")) for s in seqs)

    return {
        "step": step,
        "bubble_ratio": (1.0 - slot_time / (capacity * wall)) if capacity and wall > 0 else None,
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": _ratio(tokens, wall),
        "step_time_s": step_time,
        "timing_s/gen": wall,
        "timing_s/reward": timing["reward"],
        "timing_s/update": timing["update"],
        "timing_s/sync": timing["sync"],
        "timing_s/heldout": timing["heldout"],
        "update_tokens": _phase_field(phases, UPDATE, "tokens"),
        "tail_time_share": _tail_share(seqs, window),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_accepted_len": _ratio(verify_tokens, verify_seqs) if verify else None,
        "draft_coverage": _ratio(drafted_seqs, decode_seq_steps),
        "worker_busy_s": {str(w): b for w, b in sorted(busy.items())},
        "worker_idle_share": {
            str(w): (1.0 - b / slowest) if slowest > 0 else None for w, b in sorted(busy.items())
        },
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
        "sequences": dict(sorted(status_counts.items())),
        "rollout_start": window[0] if window else None,
        "rollout_end": window[1] if window else None,
        # kept for the overall ratios in summary(); cheap and useful to re-derive by hand
        "slot_time": slot_time,
        "capacity": capacity,
        "verify_seqs": verify_seqs,
        "verify_tokens": verify_tokens,
        "drafted_seqs": drafted_seqs,
        "decode_seq_steps": decode_seq_steps,
    }


def step_metrics(events: Sequence[Event], capacities: dict[int, int] | None = None) -> list[Event]:
    """One dict per RL step (sorted by step) with every per-step metric of the contract. `capacities`
    (per-worker slot capacity) defaults to what the events show; a caller that sees only part of a run
    (the trainer, one step at a time) passes the run's so every worker counts in every step."""
    engine, phases, seqs = _split(events)
    caps = worker_capacities(events) if capacities is None else capacities
    steps = sorted(set(engine) | set(phases) | set(seqs))
    return [_step(s, engine.get(s, []), phases.get(s, []), seqs.get(s, []), caps) for s in steps]


def _mean(values: Iterable[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summary(events: Sequence[Event], steps: list[Event] | None = None) -> Event:
    """Run-level metrics: ratios of sums over all steps for ratios, means over steps for per-step values."""
    steps = step_metrics(events) if steps is None else steps
    wall = sum(s["timing_s/gen"] for s in steps)
    slot_cap = sum(s["capacity"] * s["timing_s/gen"] for s in steps)
    tokens = sum(s["rollout_tokens"] for s in steps)
    drafted = sum(s["drafted_tokens"] for s in steps)
    accepted = sum(s["accepted_tokens"] for s in steps)
    verify_seqs = sum(s["verify_seqs"] for s in steps)

    busy: Counter[str] = Counter()
    slowest = 0.0
    for s in steps:
        busy.update(s["worker_busy_s"])
        slowest += max(s["worker_busy_s"].values(), default=0.0)
    hist: Counter[int] = Counter()
    for s in steps:
        hist.update({int(k): v for k, v in s["staleness"].items()})
    n_tok = sum(hist.values())
    lengths = [n for s in steps for n in s["update_batch_lengths"]]
    last = steps[-1] if steps else {}

    return {
        "steps": len(steps),
        "bubble_ratio": (1.0 - sum(s["slot_time"] for s in steps) / slot_cap) if slot_cap > 0 else None,
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": _ratio(tokens, wall),
        "step_time_s": _mean(s["step_time_s"] for s in steps),
        "total_time_s": sum(s["step_time_s"] or 0.0 for s in steps),
        "timing_s/gen": _mean(s["timing_s/gen"] for s in steps),
        "timing_s/reward": _mean(s["timing_s/reward"] for s in steps),
        "timing_s/update": _mean(s["timing_s/update"] for s in steps),
        "timing_s/sync": _mean(s["timing_s/sync"] for s in steps),
        "timing_s/heldout": _mean(s["timing_s/heldout"] for s in steps),
        "update_s_per_ktoken": _update_cost(steps),
        "tail_time_share": _mean(s["tail_time_share"] for s in steps),
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_accepted_len": _ratio(sum(s["verify_tokens"] for s in steps), verify_seqs)
        if verify_seqs
        else None,
        "draft_coverage": _ratio(
            sum(s["drafted_seqs"] for s in steps), sum(s["decode_seq_steps"] for s in steps)
        ),
        "worker_idle_share": {
            w: (1.0 - b / slowest) if slowest > 0 else None for w, b in sorted(busy.items())
        },
        "staleness": {str(k): v for k, v in sorted(hist.items())},
        "staleness_mean": (sum(k * v for k, v in hist.items()) / n_tok) if n_tok else None,
        "staleness_max": max(hist) if hist else None,
        "reward_mean": _mean(s["reward_mean"] for s in steps),
        "accuracy": _mean(s["accuracy"] for s in steps),
        "answer_rate": _mean(s["answer_rate"] for s in steps),
        "reward_mean_last": last.get("reward_mean"),
        "accuracy_last": last.get("accuracy"),
        "response_len_mean": (sum(lengths) / len(lengths)) if lengths else None,
        "response_len_max": max(lengths) if lengths else None,
        "trained_tokens": sum(lengths),
        "trained_tokens_per_rollout_s": _ratio(sum(lengths), wall),
    }


def _update_cost(steps: list[Event]) -> float | None:
    """Seconds of update per 1,000 trained tokens over the steps that recorded their tokens: the same work
    per token whatever the mode, so modes measured side by side should agree (compare's drift check)."""
    counted = [s for s in steps if s.get("update_tokens")]
    tokens = sum(s["update_tokens"] for s in counted)
    return 1000.0 * sum(s["timing_s/update"] for s in counted) / tokens if tokens else None


def gpu_bubble(steps: list[Event], gpu: dict[str, Any] | None) -> tuple[list[float | None], float | None]:
    """`bubble_ratio_gpu` per step and overall: 1 - mean utilisation of NVML samples inside rollout phases."""
    samples = (gpu or {}).get("samples") or []
    if not (gpu or {}).get("available") or not samples:
        return [None] * len(steps), None
    per_step: list[float | None] = []
    inside: list[float] = []
    for s in steps:
        if s["rollout_start"] is None:
            per_step.append(None)
            continue
        utils = [
            float(x["util"])
            for x in samples
            if x.get("util") is not None and s["rollout_start"] <= x["t"] <= s["rollout_end"]
        ]
        inside.extend(utils)
        per_step.append(1.0 - sum(utils) / len(utils) / 100.0 if utils else None)
    return per_step, (1.0 - sum(inside) / len(inside) / 100.0) if inside else None


def compute(events: Sequence[Event], gpu: dict[str, Any] | None = None) -> Event:
    """{"summary": ..., "steps": [...]} for a trace, with `bubble_ratio_gpu` when GPU samples are given."""
    steps = step_metrics(events)
    summ = summary(events, steps)
    per_step, overall = gpu_bubble(steps, gpu)
    for s, b in zip(steps, per_step, strict=True):
        s["bubble_ratio_gpu"] = b
    summ["bubble_ratio_gpu"] = overall
    return {"summary": summ, "steps": steps}
