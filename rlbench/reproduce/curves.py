"""Held-out learning curves: one GRPO run evaluated as it trains, and the arithmetic of comparing them.

`run_curve` trains from the embedded model (or --model) with `rlbench train`'s defaults plus the given
options, evaluating held-out greedy accuracy and pass@1 at step 0 and every eval_every steps
(train/heldout.py), until `steps` or a training-time budget (resumable). Curves of several runs are
compared at equal samples consumed (`accuracy_at`) and by the samples needed to reach a target accuracy
(`samples_to_reach`). benchmarks/learning_curves.py and the sortedrl-accuracy reproduction build on these.
"""

from __future__ import annotations

import fcntl
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json, read_jsonl, write_json
from rlbench.reproduce.base import as_json
from rlbench.training import build_config


def parity_plan(task: str) -> list[tuple[str, str, int]]:
    """SortedRL's accuracy comparison: 3 seeds of the length-aware modes and baseline, 1 of HistoSpec's."""
    return [
        *[(task, m, s) for m in ("baseline", "sorted", "sorted-partial") for s in (0, 1, 2)],
        (task, "rhyme", 0),
        (task, "sorted+rhyme", 0),
    ]


class _Budget(Exception):
    pass


def run_curve(
    out: Path,
    minutes: float = float("inf"),
    progress: Callable[[str], None] = print,
    **options: Any,
) -> dict[str, Any]:
    """Train one run (`options`: TrainConfig fields as `rlbench train` takes them: task, mode, seed, steps,
    eval_every, ...) into `out`; its held-out curve with the training reward and response length over the
    steps since each evaluation.

    `minutes` budgets training time: the steps' own time (rollout, reward, update, sync; `step_time_s`),
    not held-out evaluations or loading. A run killed midway (a time limit, Ctrl-C) continues from its
    latest checkpoint when called again with the same options; the budget counts the logged steps, so the
    resumed run stops at the step the whole run would have stopped at."""
    from reference_trainer.train.trainer import Trainer

    config = build_config(**options)
    saved = out / "train_config.json"
    resume = saved.is_file() and read_json(saved) == as_json(config.to_json())
    trainer = Trainer(config, out, resume=resume)
    start = time.perf_counter()
    label = f"{config.task} {config.mode} s{config.seed}"
    spent = _spent(out / "metrics.jsonl", trainer.step)  # 0 unless resumed
    if trainer.step:
        progress(f"{label}: resuming at step {trainer.step} ({spent / 60:.1f} min of training done)")

    def on_step(row: dict[str, Any]) -> None:
        nonlocal spent
        spent += row["step_time_s"]
        progress(_step_line(label, row))
        if spent > minutes * 60:
            raise _Budget

    try:
        if spent > minutes * 60:  # the budget ran out before the kill: only the final evaluation is left
            raise _Budget
        trainer.run(on_step)
    except _Budget:  # the budget ends the run; finished steps are kept, and the final policy is evaluated
        if not (out / "heldout.json").is_file():
            trainer.write_heldout_summary()
    rows = read_jsonl(out / "metrics.jsonl")
    curve = _curve(read_json(out / "heldout.json")["curve"], rows, config.eval_every)
    trainer.close()
    return {
        "task": config.task,
        "mode": config.mode,
        "seed": config.seed,
        "steps": trainer.step,
        "samples": curve[-1]["samples"],
        "train_s": round(math.fsum(r["step_time_s"] for r in rows), 1),  # what `minutes` budgets
        "wall_s": round(time.perf_counter() - start, 1),  # this call's, evaluations included
        "held_out_greedy_accuracy": {"before": curve[0]["greedy_acc"], "after": curve[-1]["greedy_acc"]},
        "held_out_pass1": {"before": curve[0]["pass1"], "after": curve[-1]["pass1"]},
        # what the rollouts generated for those samples: modes that oversubscribe or discard spend more
        "rollout_tokens": sum(r["rollout_tokens"] for r in rows),
        "curve": curve,
    }


def _step_line(label: str, row: dict[str, Any]) -> str:
    val = f" held-out {row['val/heldout_greedy_acc']:.3f}" if "val/heldout_greedy_acc" in row else ""
    return (
        f"{label} step {row['step']:3d} reward {row['reward_mean']:.3f} "
        f"len {row['response_len_mean']:.0f} {row['step_time_s']:.1f}s{val}"
    )


def _spent(metrics: Path, steps: int) -> float:
    """The training time of the first `steps` logged steps: what a resumed run's checkpoint holds."""
    before = read_jsonl(metrics)[:steps] if metrics.is_file() else []
    return math.fsum(r["step_time_s"] for r in before)


def _curve(curve: list[dict[str, Any]], rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The held-out curve, each point with the training reward and response length over the (up to
    `every`) steps since the previous point."""
    for point in curve:
        window = [r for r in rows if r["step"] < point["step"]][-every:]
        point["train_reward"] = statistics.fmean(r["reward_mean"] for r in window) if window else None
        point["response_len"] = statistics.fmean(r["response_len_mean"] for r in window) if window else None
    return curve


def save_run(results: Path, run: dict[str, Any], target: float) -> list[dict[str, Any]]:
    """Merge `run` into the results file under a lock: several invocations may run curves in parallel."""
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        runs = read_json(results)["runs"] if results.is_file() else []
        key = (run["task"], run["mode"], run["seed"])
        runs = [r for r in runs if (r["task"], r["mode"], r["seed"]) != key] + [run]
        write_json(results, {"target": target, "runs": runs})
    return runs


def accuracy_at(curve: list[dict[str, Any]], samples: float) -> float:
    """Held-out greedy accuracy at `samples` consumed, linear between evaluations."""
    for a, b in zip(curve, curve[1:], strict=False):
        if a["samples"] <= samples <= b["samples"]:
            w = (samples - a["samples"]) / max(1, b["samples"] - a["samples"])
            return a["greedy_acc"] + w * (b["greedy_acc"] - a["greedy_acc"])
    return curve[-1]["greedy_acc"]


def samples_to_reach(curve: list[dict[str, Any]], target: float) -> float | None:
    """Samples consumed when held-out greedy accuracy first reaches `target`, linear between evaluations."""
    if curve[0]["greedy_acc"] >= target:
        return 0.0
    for a, b in zip(curve, curve[1:], strict=False):
        if b["greedy_acc"] >= target:
            share = (target - a["greedy_acc"]) / (b["greedy_acc"] - a["greedy_acc"])
            return a["samples"] + share * (b["samples"] - a["samples"])
    return None


def samples_figure(lines: list[tuple[str, str, list[dict[str, Any]], str]]) -> Any:
    """Held-out curves against samples consumed: a line per (name, colour, curve, the key it plots)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, colour, curve, key in lines:
        x, y = [p["samples"] for p in curve], [p[key] for p in curve]
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers", line={"color": colour}))
    return fig


def parity(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Per mode: accuracy at the samples every run reached (mean, sd, difference to baseline); rollout
    tokens generated (mean, ratio to baseline; None for curves saved without them); samples to `target`
    (mean over the runs that reached it; against baseline only where every run of both did: a mean over
    the runs that got there would flatter the mode whose slow seeds never did)."""
    common = min(r["samples"] for r in runs)
    modes: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        accs = [accuracy_at(r["curve"], common) for r in mine]
        reach = [samples_to_reach(r["curve"], target) for r in mine]
        reached = [x for x in reach if x is not None]
        tokens = [r.get("rollout_tokens") for r in mine]
        modes[mode] = {
            "seeds": [r["seed"] for r in mine],
            "accuracy": statistics.fmean(accs),
            "accuracy_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "samples_to_target": statistics.fmean(reached) if reached else None,
            "reached": len(reached),
            "all_reached": len(reached) == len(reach),
            "rollout_tokens": None if None in tokens else statistics.fmean(tokens),
        }
    base = modes.get("baseline")
    for row in modes.values():
        row["accuracy_vs_baseline"] = row["accuracy"] - base["accuracy"] if base else None
        both = base and base["all_reached"] and row["all_reached"] and base["samples_to_target"]
        fewer = 1 - row["samples_to_target"] / base["samples_to_target"] if both else None
        row["fewer_samples_share"] = fewer
        known = base and base["rollout_tokens"] and row["rollout_tokens"] is not None
        row["rollout_tokens_vs_baseline"] = row["rollout_tokens"] / base["rollout_tokens"] if known else None
    return {"samples": common, "target": target, "modes": modes}
