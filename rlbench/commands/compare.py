"""`rlbench compare`: several modes on the same prompts and seeds in one process, with ratios to baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import OutDir, RunOptions, Steps, with_run_options


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
) -> None:
    """Run the modes side by side, one step of each in turn (same prompts, seeds, model); print each mode's
    bubble, its step time split into rollout, update, reward and other, and its rollout throughput; write
    compare.json and a side-by-side page."""
    from rlbench.profiling.compare import run_compare
    from rlbench.report.compare_report import drift_note, summary_lines
    from rlbench.training import build_configs

    names = [m.strip() for m in modes.split(",") if m.strip()]
    configs = build_configs(names, **run.config_kwargs(steps=steps))  # every mode checked before any runs
    doc = run_compare(configs, out, overwrite=overwrite, say=typer.echo)
    for line in summary_lines(doc):
        typer.echo(line)
    if message := drift_note(doc["drift"]):
        typer.echo(f"warning: {message}", err=True)
    typer.echo(f"report: {out / 'report.html'}")
