"""Time to accuracy: what a user pays, in training time, for a held-out accuracy in each mode, and what each
mode trades for its speed.

The modes (VARIANTS: baseline, sorted, rhyme, sorted-partial, async at k = 1 and 2, and the baseline at one
thread) train interleaved from the same model on the same prompts and seeds, each until its held-out greedy
accuracy (evaluated before every step) gains `gain` over the model's own start (the step-0 evaluation, the
same for every mode) or the step budget ends (`rlbench.training.run_modes` with `until`). Per mode: the
training time before the evaluation that reached the target (held-out evaluations excluded), the rollout and
update time inside it, the trained samples and the rollout tokens
(`reference_trainer.trace.compare.time_to_target`); and from its trace, the step time split, the bubble, the
wait shares and the bound label, the staleness and the ledger (docs/metrics.md). Every mode runs at the same
thread budget (`threads`, 2: an async mode splits it between its rollout and its update) except
`baseline-1t`, the baseline at one thread, which is the fastest synchronous setting on a shared 2-core
machine and is shown as that. The full version runs kk and arith over 3 seeds; `--quick` runs arith over 1
seed with a smaller budget; `measure` takes any Workload (benchmarks/async_compare.py runs a reduced one).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from reference_trainer.trace import ledger, metrics
from reference_trainer.trace.compare import HELDOUT_ACCURACY, reached, time_to_target
from reference_trainer.trace.schema import read_trace
from rlbench.report.page import table
from rlbench.reproduce.base import Context, Outcome
from rlbench.training import build_config, run_modes

# Each mode as it runs here: label -> (registry mode, its --mode-option pairs, threads; None: the workload's).
VARIANTS: dict[str, tuple[str, tuple[str, ...], int | None]] = {
    "baseline": ("baseline", (), None),
    "sorted": ("sorted", (), None),
    "rhyme": ("rhyme", (), None),
    "sorted-partial": ("sorted-partial", (), None),
    "async": ("async", ("max_staleness=1",), None),
    "async-k2": ("async", ("max_staleness=2",), None),
    "baseline-1t": ("baseline", (), 1),
}
MODES = tuple(VARIANTS)
# What each mode's trace says beside its time to the target (summary keys, docs/metrics.md).
TRACED = ("step_time_s", "trainer_wait_s", "timing_s/update", "timing_s/reward", "bubble_ratio",
          "trainer_wait_share", "rollout_wait_share", "bound", "staleness_mean", "staleness_max",
          "trained_vs_generated_ks", "long_decile_trained_share", "oldest_waiting_age_max",
          "reward_completed", "reward_all", "response_len_mean")  # fmt: skip


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
    eval_samples: int = 4
    threads: int = 2  # every mode's budget (an async mode splits it), except baseline-1t's
    modes: tuple[str, ...] = MODES

    @classmethod
    def for_context(cls, ctx: Context) -> Workload:
        if ctx.quick:
            return cls(tasks=("arith",), budget_steps=3, seeds=1, seed=ctx.seed, prompts_per_step=8,
                       eval_problems=64, eval_samples=1)  # fmt: skip
        return cls(seed=ctx.seed)


def run_task_seed(ctx: Context, w: Workload, task: str, seed: int) -> dict[str, Any]:
    """Every mode of one task and seed, interleaved, each until it gains `w.gain` over its start (kept in
    work_dir): per mode, what it spent to get there, and the target."""
    name = f"{task}-seed{seed}/time_to_target.json"
    key = {**asdict(w), "task": task, "seed": seed}
    dirs = {m: ctx.work_dir / f"{task}-seed{seed}" / m for m in w.modes}
    if (done := ctx.finished(name, key, f"{task} runs of seed {seed}")) is not None:
        if all((d / "trace.jsonl").is_file() for d in dirs.values()):  # the metrics code of now, on them
            done["traced"] = traced(dirs)
        return done
    configs = {
        label: build_config(
            mode=mode, mode_option=list(options), threads=threads or w.threads, task=task, seed=seed,
            steps=w.budget_steps, eval_every=1, model=ctx.model, device=ctx.device,
            prompts_per_step=w.prompts_per_step, eval_problems=w.eval_problems, eval_samples=w.eval_samples,
            checkpoint_every=10**9,
        )
        for label, (mode, options, threads) in ((m, VARIANTS[m]) for m in w.modes)
    }  # fmt: skip
    start: dict[str, float] = {}  # each mode's step-0 evaluation (the same model: the same value)

    def until(mode: str, row: dict[str, Any]) -> bool:
        if row.get(HELDOUT_ACCURACY) is not None:
            start.setdefault(mode, row[HELDOUT_ACCURACY])
        return mode in start and reached(row, start[mode] + w.gain)

    rows = run_modes(
        configs,
        dirs,
        w.budget_steps,
        say=lambda line: ctx.progress(f"{task} seed {seed} {line}"),
        until=until,
    )
    target = start["baseline"] + w.gain
    spent = {m: time_to_target(r, target) for m, r in rows.items()}
    return ctx.finish(name, key, {"target": target, **spent, "traced": traced(dirs)})


def traced(dirs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per mode, from its trace: the TRACED summary values, and its trained lengths' KS distance to the
    baseline's on the prompts both trained (ledger.same_prompts_ks)."""
    computed = {m: metrics.compute(read_trace(d / "trace.jsonl")) for m, d in dirs.items()}
    base = computed.get("baseline", {}).get("ledger", {}).get("trained_lengths_by_prompt")
    out = {}
    for mode, doc in computed.items():
        mine = doc["ledger"]["trained_lengths_by_prompt"]
        versus = ledger.same_prompts_ks(mine, base) if base and mode != "baseline" else None
        out[mode] = {**{k: doc["summary"].get(k) for k in TRACED}, "length_ks_vs_baseline": versus}
    return out


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def pooled(per_seed: dict[int, dict[str, Any]], modes: tuple[str, ...] = MODES) -> dict[str, dict[str, Any]]:
    """Per mode: the means over the seeds that reached the target, and how many did; the traced values'
    means over every seed (the bound label: the seeds' labels, joined)."""
    out = {}
    for mode in modes:
        hits = [r[mode] for r in per_seed.values() if r[mode]["reached"]]
        seen = [r["traced"][mode] for r in per_seed.values() if "traced" in r]
        out[mode] = {
            "reached": len(hits),
            "seeds": len(per_seed),
            **{k: _mean([h[k] for h in hits]) for k in ("wall_s", "rollout_s", "update_s", "samples")},
            "rollout_tokens": _mean([h["rollout_tokens"] for h in hits]),
            **{
                k: _mean([t[k] for t in seen if t.get(k) is not None])
                for k in (*TRACED, "length_ks_vs_baseline")
                if k != "bound"
            },
            "bound": "/".join(sorted({str(t.get("bound")) for t in seen})) or None,
        }
    return out


def time_to_accuracy(ctx: Context) -> Outcome:
    return measure(ctx, Workload.for_context(ctx))


def _row(mode: str, m: dict[str, Any], ratio: float | None) -> dict[str, Any]:
    def pct(key: str) -> float | None:
        return None if m.get(key) is None else 100 * m[key]

    return {"mode": mode, "reached": f"{m['reached']}/{m['seeds']}", "training s": m["wall_s"],
            "time ÷ baseline": ratio, "step s": m["step_time_s"], "rollout wait s": m["trainer_wait_s"],
            "update s": m["timing_s/update"], "bubble %": pct("bubble_ratio"),
            "trainer waits %": pct("trainer_wait_share"), "rollout waits %": pct("rollout_wait_share"),
            "bound": m["bound"], "staleness mean / max": _pair(m["staleness_mean"], m["staleness_max"]),
            "KS trained vs generated": m["trained_vs_generated_ks"],
            "KS vs baseline": m["length_ks_vs_baseline"],
            "longest 10% trained %": pct("long_decile_trained_share"),
            "oldest waiting (versions)": m["oldest_waiting_age_max"],
            "reward completed / all": _pair(m["reward_completed"], m["reward_all"]),
            "trained samples": m["samples"], "rollout tokens": m["rollout_tokens"]}  # fmt: skip


def _pair(a: float | None, b: float | None) -> str:
    return " / ".join("n/a" if v is None else f"{v:.3g}" for v in (a, b))


def measure(ctx: Context, w: Workload) -> Outcome:
    """Every mode of `w.modes` on every task and seed of `w` (module docstring)."""
    measured: dict[str, Any] = {}
    sections: list[tuple[str, list[Any]]] = []
    heads = []
    every_seed_reached = True
    data: dict[str, Any] = {}
    for task in w.tasks:
        per_seed = {s: run_task_seed(ctx, w, task, s) for s in range(w.seed, w.seed + w.seeds)}
        target = statistics.fmean(r["target"] for r in per_seed.values())
        modes = pooled(per_seed, w.modes)
        base = modes["baseline"]
        every_seed_reached &= all(m["reached"] == m["seeds"] for m in modes.values())
        rows = []
        for mode, m in modes.items():
            ratio = m["wall_s"] / base["wall_s"] if m["wall_s"] is not None and base["wall_s"] else None
            measured[f"time_vs_baseline.{mode}.{task}"] = ratio
            measured[f"time_to_target_s.{mode}.{task}"] = m["wall_s"]
            step = m["step_time_s"]
            measured[f"step_speedup.{mode}.{task}"] = base["step_time_s"] / step if step else None
            rows.append(_row(mode, m, ratio))
        ratios = {mode: measured[f"time_vs_baseline.{mode}.{task}"] for mode in w.modes[1:]}
        said = ", ".join(f"{mode} n/a" if r is None else f"{mode} {r:.2f}x" for mode, r in ratios.items())
        heads.append(f"{task} +{100 * w.gain:.0f} pts: {said} baseline's time")
        title = f"{task}: time to +{100 * w.gain:.0f} points of held-out greedy accuracy ({target:.3f})"
        sections.append((title, [table(rows)]))
        data[task] = {"target": target, "per_seed": {str(s): r for s, r in per_seed.items()}, "modes": modes}
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
            "a mode that shortens the trained responses (sorted) gains here mostly in the update, and async "
            "can hide only the (smaller) rollout behind it.",
            f"Every mode runs at {w.threads} CPU threads, the async modes split between their two sides; "
            "baseline-1t is the baseline at 1 thread, the fastest synchronous setting where other processes "
            "share the cores (OpenMP's spinning threads wait on each other): the async gain over it is the "
            "overlap's own, over the baseline at the same budget it includes that contention.",
            "step s and its parts are means over the steps each mode ran; rollout wait s is what the update "
            "waited for (the whole rollout in a synchronous mode); the ledger's columns: docs/metrics.md.",
        ],
        data=data,
    )
