"""Claims about real workloads, on a pretrained model (the spec's `model`, SmolLM2-135M-Instruct) on a GPU.

The same runners as the embedded model's reproductions (sortedrl.py, histospec.py, curves.py) over the task
setting measured to be within the model's reach (`python -m benchmarks.task_reach`, docs/smollm2.md): arith
with one operation, chat style, sampled at T = 0.7. There greedy decoding solves 7.8% of held-out problems
and a group of 8 holds a correct sample for 31% of prompts, so GRPO's groups disagree often enough to learn
from. The learning claim trains one run under a 5-minute budget and compares held-out accuracy before and
after. `--quick` shrinks every workload to a smoke test (a few tokens, a few steps) that says nothing.
"""

from __future__ import annotations

from typing import Any

from rlbench.report.figures import PALETTE
from rlbench.report.page import table
from rlbench.reproduce import histospec, sortedrl
from rlbench.reproduce.base import Context, Outcome
from rlbench.reproduce.curves import run_curve, samples_figure

TASK_OPTIONS = (("min_ops", 1), ("max_ops", 1))
TEMPERATURE = 0.7
MINUTES = 5.0  # the learning claim's training budget on one GPU
LR = 1e-5  # AdamW's rate for every real-model run: measured to learn on this setting (docs/smollm2.md)

REAL_NOTE = (
    "A pretrained model on the setting within its reach (arith, one operation, T = 0.7; docs/smollm2.md): "
    "response lengths are the model's own, capped at the workload's max_tokens, so the tail is real text's."
)


def shared(ctx: Context) -> dict[str, Any]:
    """What every real-model workload sets alike: the task within the model's reach, sampled, trained."""
    sizes = {"group_size": ctx.pick(8, 4), "max_tokens": ctx.pick(512, 24), "seed": ctx.seed}
    return {**sizes, "temperature": TEMPERATURE, "task_options": TASK_OPTIONS, "lr": LR}


def sortedrl_workload(ctx: Context) -> sortedrl.Workload:
    # one seed: a real model's lengths vary little from seed to seed, GPU time is scarce
    return sortedrl.Workload(steps=ctx.pick(6, 2), prompts_per_step=ctx.pick(8, 2), seeds=1, **shared(ctx))


def sortedrl_bubble(ctx: Context) -> Outcome:
    return sortedrl.bubble(ctx, sortedrl_workload(ctx), REAL_NOTE)


def sortedrl_throughput(ctx: Context) -> Outcome:
    return sortedrl.throughput(ctx, sortedrl_workload(ctx), REAL_NOTE)


def histospec_workload(ctx: Context) -> histospec.Workload:
    sizes = {"epochs": ctx.pick(4, 2), "pool": ctx.pick(8, 2), "prompts_per_step": ctx.pick(4, 2)}
    return histospec.Workload(**sizes, seeds=ctx.pick(2, 1), **shared(ctx))


def histospec_speedup(ctx: Context) -> Outcome:
    note = REAL_NOTE + (
        " Whether an earlier epoch's sampled answers to a prompt predict this epoch's is the claim itself."
    )
    return histospec.speedup(ctx, histospec_workload(ctx), note)


def learning_options(ctx: Context) -> dict[str, Any]:
    """`rlbench train` options of the learning run (also its config in result.json)."""
    return {
        "task": "arith",
        "task_option": [f"{k}={v}" for k, v in TASK_OPTIONS],
        "temperature": TEMPERATURE,
        "mode": "baseline",
        "seed": ctx.seed,
        "steps": ctx.pick(400, 2),  # the budget, not the steps, ends a full run
        "prompts_per_step": ctx.pick(8, 2),
        "group_size": ctx.pick(8, 4),
        "max_tokens": ctx.pick(256, 24),
        "lr": LR,
        "eval_every": ctx.pick(20, 1),
        "eval_problems": ctx.pick(256, 8),
        "eval_samples": ctx.pick(8, 2),
        # a checkpoint writes the weights and AdamW's state (three copies of the weights) and a GPU step
        # takes seconds: every 20 steps, a kill loses at most 19, and the run resumes there (run_curve)
        "checkpoint_every": ctx.pick(20, 2),
    }


def lift(run: dict[str, Any]) -> dict[str, Any]:
    """The measured numbers of one learning run: held-out greedy accuracy and pass@1 before and after, and
    the training time."""
    greedy, pass1 = run["held_out_greedy_accuracy"], run["held_out_pass1"]
    return {
        "headline": f"held-out greedy {greedy['before']:.1%} → {greedy['after']:.1%} in "
        f"{run['train_s'] / 60:.1f} min of training ({run['steps']} steps, {run['samples']} samples)",
        "greedy_before": greedy["before"],
        "greedy_after": greedy["after"],
        "greedy_lift": greedy["after"] - greedy["before"],
        "pass1_before": pass1["before"],
        "pass1_after": pass1["after"],
        "train_minutes": run["train_s"] / 60,  # the steps' time, evaluations not included
        "steps": run["steps"],
        "samples": run["samples"],
    }


def _curve_figure(curve: list[dict[str, Any]]) -> Any:
    lines = [("greedy", PALETTE[0], "greedy_acc"), (f"pass@1, T = {TEMPERATURE}", PALETTE[1], "pass1")]
    fig = samples_figure([(name, colour, curve, key) for name, colour, key in lines])
    layout = {"title": "Held-out accuracy against samples consumed", "height": 380, "yaxis_tickformat": ".0%"}
    fig.update_layout(**layout, xaxis_title="samples consumed", yaxis_title="held-out accuracy")
    return fig


def learning(ctx: Context) -> Outcome:
    options = learning_options(ctx)
    key = {**options, "minutes": ctx.pick(MINUTES, None)}
    if (run := ctx.finished("learning.json", key, "learning run")) is None:
        ctx.progress(f"training under a {ctx.pick(MINUTES, 'no')}-minute budget")
        where = {"model": ctx.model, "device": ctx.device}
        budget = ctx.pick(MINUTES, float("inf"))
        run = run_curve(ctx.work_dir / "run", minutes=budget, progress=ctx.progress, **where, **options)
        run = ctx.finish("learning.json", key, run)
    rows = [
        {
            "step": p["step"],
            "samples": p["samples"],
            "held-out greedy": p["greedy_acc"],
            "held-out pass@1": p["pass1"],
            "training reward": p["train_reward"],
            "response length": p["response_len"],
        }
        for p in run["curve"]
    ]
    return Outcome(
        measured=lift(run),
        config={"model": ctx.model_label(), "device": ctx.device, "minutes": key["minutes"], **options},
        seeds=[ctx.seed],
        sections=[("Held-out curve", [table(rows), _curve_figure(run["curve"])])],
        notes=[
            REAL_NOTE,
            f"Held-out problems come from a seed the training prompts never use ({options['eval_problems']} "
            f"of them); pass@1 averages {options['eval_samples']} draws per problem at the training "
            "temperature. The training reward is not the measure: a policy can raise it on its own prompts.",
        ],
        data={"curve": run["curve"]},
    )
