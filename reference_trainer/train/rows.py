"""The per-step row of `metrics.jsonl`, named once.

A row is the step's trace-derived metrics, computed by `reference_trainer.trace.metrics.step_metrics` (the
code behind `rlbench profile` and `rlbench report`, so a training run and a profile never disagree on a
definition), plus what only the updater knows. docs/metrics.md defines every field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reference_trainer.trace import metrics
from reference_trainer.trace.schema import ROLLOUT

# Updater statistic (grpo.policy_loss / GRPOUpdater.update) -> row field. The KL terms carry verl's names:
# actor/ppo_kl is the k3 estimate of KL(old || new) over the batch's tokens, actor/kl_loss the k3 KL of the
# policy to the reference model (the penalty's value; only with kl_coef > 0, as in verl).
# The loss itself comes from the trace's update phase (reference_trainer.trace.metrics reads it there).
UPDATER_FIELDS: dict[str, str] = {
    "grad_norm": "grad_norm",
    "clip_frac": "clip_frac",
    "entropy": "entropy",
    "approx_kl": "actor/ppo_kl",
    "kl_ref": "actor/kl_loss",
    "tis_weight_mean": "tis_weight_mean",
    "tis_clip_frac": "tis_clip_frac",
}

# Fields present only under a condition; every other schema field is in every row.
CONDITIONAL_FIELDS: dict[str, str] = {
    "actor/kl_loss": "kl_coef > 0",
    "tis_weight_mean": "off-policy correction (a tis_cap, e.g. mode sorted-partial)",
    "tis_clip_frac": "off-policy correction (a tis_cap, e.g. mode sorted-partial)",
    "val/heldout_greedy_acc": "held-out evaluation steps: step 0 and every eval_every",
    "val/heldout_pass1": "held-out evaluation steps: step 0 and every eval_every",
}

# Trace-derived fields dropped from the row: the full length list belongs to the trace, not a log line.
_DROPPED = frozenset({"update_batch_lengths"})

# The names come from the metrics code itself (a step with one empty rollout phase), so they cannot drift.
TRACE_FIELDS: tuple[str, ...] = tuple(
    k for k in metrics.step_metrics([{"kind": ROLLOUT, "t_start": 0.0, "t_end": 0.0}])[0] if k not in _DROPPED
)
VAL_FIELDS: tuple[str, ...] = ("val/heldout_greedy_acc", "val/heldout_pass1")  # train/heldout.py
ROW_FIELDS: tuple[str, ...] = (*TRACE_FIELDS, "samples", *UPDATER_FIELDS.values(), *VAL_FIELDS)

# Fields that depend on the wall clock: two runs with the same seed agree on every other field, except on
# W > 1 Ray engines, where the order of the engines' reports (their speed) steers the controller's dispatch
# and which groups complete first (docs/metrics.md).
TIMING_FIELDS = frozenset(
    {
        "bubble_ratio",
        "rollout_tokens_per_s",
        "step_time_s",
        "timing_s/gen",
        "timing_s/reward",
        "timing_s/update",
        "timing_s/sync",
        "tail_time_share",
        "worker_busy_s",
        "worker_idle_share",
        "trainer_busy_s",
        "trainer_idle_share",
        "rollout_idle_share",
        "rollout_start",
        "rollout_end",
        "slot_time",
        "lookahead_slot_share",
        "lookahead_slot_time",
        "trainer_wait_s",
        "rollout_wait_s",
        "trainer_wait_share",
        "rollout_wait_share",
        "engine_bubble",
        "cross_engine_idle_s",
        "engine_span_s",
        "cross_engine_idle_share",
        "straggler_engine",
        "dispatches",
        "dispatch_imbalance",
    }
)


def step_row(
    step_events: Sequence[Mapping[str, Any]],
    capacities: Mapping[int, int],
    samples: int,
    stats: Mapping[str, float],
) -> dict[str, Any]:
    """The row of one step from its trace events (all of one step), the run's per-worker slot
    capacities (so a worker idle for a whole step still counts) and the updater's statistics."""
    steps = metrics.step_metrics(list(step_events), capacities=dict(capacities))
    if len(steps) != 1:
        raise ValueError(f"step_row needs the events of exactly one step, got {len(steps)}")
    row = {k: v for k, v in steps[0].items() if k not in _DROPPED}
    row["samples"] = samples
    row.update({name: float(stats[key]) for key, name in UPDATER_FIELDS.items() if key in stats})
    return row
