"""Every metric of the metrics contract, computed from trace events alone. The definitions are
docs/metrics.md's; this module and the two it builds on hold to these invariants:

- One clock, one source: every number comes from the events of `trace.jsonl` (plus NVML samples for
  `bubble_ratio_gpu`), grouped by their `step` field; nothing is measured here.
- A value the trace cannot give is null, never 0.
- A run-level ratio is a ratio of sums over the steps, never a mean of per-step ratios.
- A rollout run ahead writes its phases with `side: "rollout"`; a step's time is the span of the others.
- One rule labels which side bounds a run (`steps.bound_label`), for rlbench's runs and audited ones alike.

Per-step metrics are steps.py's (`step_metrics`), the ledger ledger.py's; the run's summary and `compute`,
which puts the three together, are here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from reference_trainer.trace.engines import engine_summary, engines_lost
from reference_trainer.trace.ledger import ledger, ledger_summary
from reference_trainer.trace.schema import TRAINER_WAIT
from reference_trainer.trace.steps import bound_label, lost_engines, mean_of, ratio, share, step_metrics

Event = dict[str, Any]


def summary(events: Sequence[Event], steps: list[Event] | None = None) -> Event:
    """Run-level metrics: ratios of sums over all steps for ratios, means over steps for per-step values."""
    steps = step_metrics(events) if steps is None else steps
    last = steps[-1] if steps else {}
    lengths = [n for s in steps for n in s["update_batch_lengths"]]
    return {
        "steps": len(steps),
        **_slot_sums(steps),
        "step_time_s": mean_of(s["step_time_s"] for s in steps),
        "total_time_s": sum(s["step_time_s"] or 0.0 for s in steps),
        **{k: mean_of(s[k] for s in steps) for k in TIMED},
        "update_s_per_ktoken": _update_cost(steps),
        "tail_time_share": mean_of(s["tail_time_share"] for s in steps),
        **_draft_sums(steps),
        **_worker_and_staleness(steps),
        **engine_summary(steps),
        "engines_lost": engines_lost(lost_engines(events), steps),
        **{k: mean_of(s[k] for s in steps) for k in ("reward_mean", "accuracy", "answer_rate")},
        "reward_mean_last": last.get("reward_mean"),
        "accuracy_last": last.get("accuracy"),
        "response_len_mean": (sum(lengths) / len(lengths)) if lengths else None,
        "response_len_max": max(lengths) if lengths else None,
        **_sides(events, steps),
        **ledger_summary(ledger(events, steps)),
    }


TIMED = ("timing_s/gen", "timing_s/reward", "timing_s/update", "timing_s/sync", "timing_s/heldout")


def _slot_sums(steps: list[Event]) -> Event:
    """The bubble and the tokens over the run's slot-time and rollout wall time."""
    wall = sum(s["timing_s/gen"] for s in steps)
    slot_cap = sum(s["capacity"] * s["timing_s/gen"] for s in steps)
    tokens = _known_sum(s["rollout_tokens"] for s in steps)
    trained = _known_sum(s["trained_tokens"] for s in steps)
    return {
        "bubble_ratio": (1.0 - sum(s["slot_time"] for s in steps) / slot_cap) if slot_cap > 0 else None,
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": None if tokens is None else ratio(tokens, wall),
        "lookahead_tokens": _known_sum(s["lookahead_tokens"] for s in steps),
        "lookahead_slot_share": ratio(sum(s["lookahead_slot_time"] for s in steps), slot_cap),
        "trained_tokens": trained,
        "trained_tokens_per_rollout_s": None if trained is None else ratio(trained, wall),
    }


def _draft_sums(steps: list[Event]) -> Event:
    drafted = sum(s["drafted_tokens"] for s in steps)
    verify_seqs = sum(s["verify_seqs"] for s in steps)
    return {
        "acceptance_rate": ratio(sum(s["accepted_tokens"] for s in steps), drafted),
        "mean_accepted_len": ratio(sum(s["verify_tokens"] for s in steps), verify_seqs),
        "draft_coverage": ratio(
            sum(s["drafted_seqs"] for s in steps), sum(s["decode_seq_steps"] for s in steps)
        ),
    }


def _worker_and_staleness(steps: list[Event]) -> Event:
    busy: Counter[str] = Counter()
    slowest = 0.0
    hist: Counter[int] = Counter()
    for s in steps:
        busy.update(s["worker_busy_s"])
        slowest += max(s["worker_busy_s"].values(), default=0.0)
        hist.update({int(k): v for k, v in s["staleness"].items()})
    n_tok = sum(hist.values())
    return {
        "worker_idle_share": {
            w: (1.0 - b / slowest) if slowest > 0 else None for w, b in sorted(busy.items())
        },
        "staleness": {str(k): v for k, v in sorted(hist.items())},
        "staleness_mean": (sum(k * v for k, v in hist.items()) / n_tok) if n_tok else None,
        "staleness_max": max(hist) if hist else None,
    }


def _sides(events: Sequence[Event], steps: list[Event]) -> Event:
    """The two sides' idle and wait shares, and which side bounds the run."""
    timed = [s for s in steps if s["trainer_busy_s"] is not None and s["step_time_s"]]
    step_s = sum(s["step_time_s"] for s in timed)
    trainer_idle = 1.0 - sum(s["trainer_busy_s"] for s in timed) / step_s if step_s else None
    slotted = [s for s in steps if s["rollout_idle_share"] is not None]
    slot_step = sum(s["capacity"] * s["step_time_s"] for s in slotted)
    rollout_idle = 1.0 - sum(s["slot_time"] for s in slotted) / slot_step if slot_step else None
    waits = _wait_shares(steps)
    run_ahead = any(e.get("kind") == TRAINER_WAIT for e in events)  # the rollout ran beside the updates
    # One label by one rule: a run ahead (modes async, sorted+async) is labelled by its wait shares, whose
    # phases overlap; every other run by its idle shares, as rlbench audit labels any run.
    waited = (waits["trainer_wait_share"], waits["rollout_wait_share"])
    shares = waited if run_ahead else (trainer_idle, rollout_idle)
    return {
        "trainer_idle_share": trainer_idle,
        "rollout_idle_share": rollout_idle,
        **waits,
        "bound": bound_label(*shares),
        "run_ahead": run_ahead,
    }


def _known_sum(values: Iterable[Any]) -> Any:
    """The sum of the values that are known (not None); None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _wait_shares(steps: list[Event]) -> Event:
    """The run's trainer and rollout wait shares (of the summed step time)."""
    timed = [s for s in steps if s["step_time_s"]]
    total = sum(s["step_time_s"] for s in timed)
    trainer = share(sum(s["trainer_wait_s"] for s in timed), total) if timed else None
    known = [s for s in timed if s["rollout_wait_s"] is not None]
    rollout = share(sum(s["rollout_wait_s"] for s in known), sum(s["step_time_s"] for s in known))
    return {
        "trainer_wait_s": mean_of(s["trainer_wait_s"] for s in steps),
        "rollout_wait_s": mean_of(s["rollout_wait_s"] for s in steps),
        "trainer_wait_share": trainer,
        "rollout_wait_share": rollout if known else None,
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
    """{"summary": ..., "steps": [...], "ledger": ...} for a trace, with `bubble_ratio_gpu` when GPU samples
    are given."""
    steps = step_metrics(events)
    summ = summary(events, steps)
    per_step, overall = gpu_bubble(steps, gpu)
    for s, b in zip(steps, per_step, strict=True):
        s["bubble_ratio_gpu"] = b
    summ["bubble_ratio_gpu"] = overall
    return {"summary": summ, "steps": steps, "ledger": ledger(events, steps)}
