"""`rlbench train`: the reference GRPO trainer on an embedded task."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the command imports it when it runs: --help stays light
    from reference_trainer.train.config import TrainConfig

from rlbench.options import Mode, RunOptions, echo, given_flags, with_run_options


@with_run_options
def train_command(
    ctx: typer.Context,
    run: RunOptions,
    mode: Mode = "baseline",
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Total RL steps (default 20).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (new run).")] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue the run in this directory from its last checkpoint (on --workers W' engines if "
            "given, else as many as it had).",
        ),
    ] = None,
    lr: Annotated[float | None, typer.Option(help="Learning rate.")] = None,
    kl_coef: Annotated[float | None, typer.Option(help="KL penalty to the initial model (k3).")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Steps between checkpoints.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
) -> None:
    """Train with GRPO; writes metrics.jsonl, trace.jsonl and checkpoints/ to the run directory."""
    from reference_trainer.errors import Interrupted
    from reference_trainer.rollout.gate import RolloutDied
    from rlbench.rundirs import check_new_run, claim
    from rlbench.training import build_config, run_training

    if resume is not None:
        config, out_dir = resumed_config(ctx, run, resume, steps), resume
    else:
        config = build_config(
            **run.config_kwargs(
                mode=mode, steps=steps or 20, lr=lr, kl_coef=kl_coef, checkpoint_every=checkpoint_every
            )
        )
        out_dir = out or Path("runs") / f"{run.task}-{mode}-s{run.seed}"
    # One writer, and only into a trainer run: a second writer, or another command's run, is refused.
    with claim(out_dir, "train", accepts=("train",)):
        if resume is None:
            check_new_run(out_dir, "train", overwrite, f"--resume {out_dir} to continue, or --overwrite")
        try:
            rows = run_training(config, out_dir, resume=resume is not None)
        except KeyboardInterrupt:
            hint = f"`rlbench train --resume {out_dir}` continues"
            raise Interrupted(f"interrupted: {out_dir} keeps every finished step; {hint}") from None
        except RolloutDied as err:  # its line says how to resume: with this run's folder
            raise RolloutDied(str(err).replace("RUN_DIR", str(out_dir))) from None
    if rows:
        first, last = rows[0], rows[-1]
        echo(
            f"steps {first['step']}..{last['step']}: reward {first['reward_mean']:.3f} -> "
            f"{last['reward_mean']:.3f}, accuracy {first['accuracy']:.3f} -> {last['accuracy']:.3f}"
        )
    echo(f"run: {out_dir} (metrics.jsonl, trace.jsonl, checkpoints/)")


def resumed_config(ctx: typer.Context, run: RunOptions, resume: Path, steps: int | None) -> TrainConfig:
    """The config `resume` was started with, `steps` extending it and `--workers` moving it onto W' engines
    (no engine state is kept); any other option given is refused, as a resume would drop it."""
    from reference_trainer.errors import UserError
    from reference_trainer.train.config import load_run_config

    if ignored := given_flags(ctx, exclude=("resume", "steps", "workers")):
        raise UserError(
            f"{', '.join(ignored)} with --resume: a resume runs with the settings in "
            f"{resume / 'train_config.json'} (only --steps and --workers may change); leave "
            f"{'it' if len(ignored) == 1 else 'them'} out, or start a new run with --out"
        )
    config = load_run_config(resume)
    config.steps = steps or config.steps  # resuming may extend the run
    source = ctx.get_parameter_source("workers")
    if source is not None and source.name == "COMMANDLINE":
        config.workers = run.workers
    if config.workers <= 1:  # the options of W engines (dispatch, migrate) mean nothing on one: not kept
        from reference_trainer.modes import get_mode

        mode = get_mode(config.mode)
        only_many = set(mode.options()) - set(mode.options(1))
        config.mode_options = {k: v for k, v in config.mode_options.items() if k not in only_many}
    return config
