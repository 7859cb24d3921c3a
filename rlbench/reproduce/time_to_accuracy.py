"""Time to accuracy: what a user pays, in training time, for a held-out accuracy in each mode.

baseline, sorted and rhyme (HistoSpec) train interleaved from the same model on the same prompts and seeds,
each until its held-out greedy accuracy (evaluated before every step) gains `gain` over the model's own
start (the step-0 evaluation, the same for every mode) or the step budget ends (`rlbench.training.run_modes`
with `until`). Per mode: the training time before the evaluation that reached the target (held-out
evaluations excluded), the rollout and update time inside it, the trained samples and the rollout tokens
(`reference_trainer.trace.compare.time_to_target`). The full version runs kk and arith over 3 seeds;
`--quick` runs arith over 1 seed with a smaller budget.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from reference_trainer.trace.compare import HELDOUT_ACCURACY, reached, time_to_target
from rlbench.report.page import table
from rlbench.reproduce.base import Context, Outcome
from rlbench.training import build_configs, run_modes

MODES = ("baseline", "sorted", "rhyme")


@dataclass(frozen=True)
class Workload:
    tasks: tuple[str, ...] = ("kk", "arith")
    # the target: the start's held-out greedy accuracy plus this (a few steps of baseline gain 4-7 points
    # from the embedded model's 0.16 on arith and 0.19 on kk, 128 problems)
    gain: float = 0.04
    budget_steps: int = 8
    seeds: int = 3
    seed: int = 0
    prompts_per_step: int = 16
    eval_problems: int = 128

    @classmethod
    def for_context(cls, ctx: Context) -> Workload:
        if ctx.quick:
            return cls(tasks=("arith",), budget_steps=3, seeds=1, seed=ctx.seed, prompts_per_step=8,
                       eval_problems=64)  # fmt: skip
        return cls(seed=ctx.seed)


def run_task_seed(ctx: Context, w: Workload, task: str, seed: int) -> dict[str, Any]:
    """Every mode of one task and seed, interleaved, each until it gains `w.gain` over its start (kept in
    work_dir): per mode, what it spent to get there, and the target."""
    name = f"{task}-seed{seed}/time_to_target.json"
    key = {**asdict(w), "task": task, "seed": seed}
    if (done := ctx.finished(name, key, f"{task} runs of seed {seed}")) is not None:
        return done
    configs = build_configs(
        list(MODES), task=task, seed=seed, steps=w.budget_steps, eval_every=1, model=ctx.model,
        device=ctx.device, prompts_per_step=w.prompts_per_step, eval_problems=w.eval_problems,
        checkpoint_every=10**9,
    )  # fmt: skip
    start: dict[str, float] = {}  # each mode's step-0 evaluation (the same model: the same value)

    def until(mode: str, row: dict[str, Any]) -> bool:
        if row.get(HELDOUT_ACCURACY) is not None:
            start.setdefault(mode, row[HELDOUT_ACCURACY])
        return mode in start and reached(row, start[mode] + w.gain)

    rows = run_modes(
        configs,
        {m: ctx.work_dir / f"{task}-seed{seed}" / m for m in MODES},
        w.budget_steps,
        say=lambda line: ctx.progress(f"{task} seed {seed} {line}"),
        until=until,
    )
    target = start["baseline"] + w.gain
    return ctx.finish(
        name, key, {"target": target, **{m: time_to_target(r, target) for m, r in rows.items()}}
    )


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def pooled(per_seed: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: the means over the seeds that reached the target, and how many did."""
    out = {}
    for mode in MODES:
        hits = [r[mode] for r in per_seed.values() if r[mode]["reached"]]
        out[mode] = {
            "reached": len(hits),
            "seeds": len(per_seed),
            **{k: _mean([h[k] for h in hits]) for k in ("wall_s", "rollout_s", "update_s", "samples")},
            "rollout_tokens": _mean([h["rollout_tokens"] for h in hits]),
        }
    return out


def time_to_accuracy(ctx: Context) -> Outcome:
    w = Workload.for_context(ctx)
    measured: dict[str, Any] = {}
    sections: list[tuple[str, list[Any]]] = []
    heads = []
    every_seed_reached = True
    data: dict[str, Any] = {}
    for task in w.tasks:
        per_seed = {s: run_task_seed(ctx, w, task, s) for s in range(w.seed, w.seed + w.seeds)}
        target = statistics.fmean(r["target"] for r in per_seed.values())
        modes = pooled(per_seed)
        base = modes["baseline"]
        every_seed_reached &= all(m["reached"] == m["seeds"] for m in modes.values())
        rows = []
        for mode, m in modes.items():
            ratio = m["wall_s"] / base["wall_s"] if m["wall_s"] is not None and base["wall_s"] else None
            measured[f"time_vs_baseline.{mode}.{task}"] = ratio
            measured[f"time_to_target_s.{mode}.{task}"] = m["wall_s"]
            rows.append({"mode": mode, "reached": f"{m['reached']}/{m['seeds']}", "training s": m["wall_s"],
                         "rollout s": m["rollout_s"], "update s": m["update_s"], "time ÷ baseline": ratio,
                         "trained samples": m["samples"], "rollout tokens": m["rollout_tokens"]})  # fmt: skip
        said = ", ".join(
            f"{mode} {measured[f'time_vs_baseline.{mode}.{task}']:.2f}x"
            if measured[f"time_vs_baseline.{mode}.{task}"] is not None
            else f"{mode} n/a"
            for mode in MODES[1:]
        )
        heads.append(f"{task} +{100 * w.gain:.0f} pts: {said} baseline's time")
        title = f"{task}: time to +{100 * w.gain:.0f} points of held-out greedy accuracy ({target:.3f})"
        sections.append((title, [table(rows)]))
        data[task] = {"target": target, "per_seed": {str(s): r for s, r in per_seed.items()}}
    measured["every_seed_reached"] = 1.0 if every_seed_reached else 0.0
    measured["headline"] = "; ".join(heads)
    return Outcome(
        measured=measured,
        config={"model": ctx.model_label(), **asdict(w)},
        seeds=list(range(w.seed, w.seed + w.seeds)),
        sections=sections,
        notes=[
            "Training time is the steps' own time (rollout, reward, update, sync) before the held-out "
            "evaluation that first reached the target; the evaluations themselves are left out. Means are "
            "over the seeds that reached the target; `reached` says how many did within the budget.",
            "On this CPU the embedded model's update costs more than its rollout, the reverse of GPU RL, so "
            "a mode that shortens the trained responses (sorted) gains here mostly in the update.",
        ],
        data=data,
    )
