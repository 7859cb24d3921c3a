"""`rlbench compare`: several modes on the same prompts and seeds in one process, with ratios to baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import UserError, check_number
from rlbench.options import GpuCalibration, OutDir, RunOptions, Steps, echo, with_run_options


@with_run_options
def compare_command(
    *,
    modes: Annotated[
        str, typer.Option("--modes", help="Comma-separated modes; baseline is the reference.")
    ] = "baseline,sorted,sorted-partial,rhyme",
    run: RunOptions,
    steps: Steps = 4,
    out: OutDir = Path("runs/compare"),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace runs already in --out (their checkpoints too).")
    ] = False,
    target_accuracy: Annotated[
        float | None,
        typer.Option(
            "--target-accuracy",
            help="Run each mode until its held-out greedy accuracy reaches this (--steps: the budget; "
            "held-out evaluation every step unless --eval-every says otherwise) and report the time, "
            "samples and rollout tokens it took.",
        ),
    ] = None,
    calibration: GpuCalibration = None,
) -> None:
    """Run the modes side by side, one step of each in turn (same prompts, seeds, model); print each mode's
    bubble, its step time split into rollout, update, reward and other, its rollout throughput, and its
    schedule replayed through a GPU calibration (a model); write compare.json and a side-by-side page. With
    --target-accuracy, also the time each mode took to reach it."""
    from rlbench.profiling.compare import run_compare
    from rlbench.report.compare_summary import drift_note, summary_lines
    from rlbench.report.verdict import verdict_block
    from rlbench.training import build_configs

    names = [m.strip() for m in modes.split(",") if m.strip()]
    eval_every = run.eval_every
    if target_accuracy is not None:
        check_number("--target-accuracy", target_accuracy, low=0.0, high=1.0, low_open=True)
        if eval_every == 0:
            raise UserError("--target-accuracy needs held-out evaluations: leave --eval-every out or >= 1")
        eval_every = eval_every or 1
    configs = build_configs(names, **run.config_kwargs(steps=steps, eval_every=eval_every))  # all checked
    doc = run_compare(configs, out, overwrite=overwrite, say=echo, target_accuracy=target_accuracy,
                      calibration=calibration)  # fmt: skip
    if message := drift_note(doc["drift"]):  # before the speed-ups it invalidates
        echo(f"warning: {message}", err=True)
    for line in [*summary_lines(doc), *verdict_block(doc)]:  # the verdict last: read where the output ends
        echo(line)
    echo(f"report: {out / 'report.html'}")
