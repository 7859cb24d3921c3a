"""Running the reference trainer from the CLI: a config from the command's options, and a progress display.

`train` and `profile` build their config with `build_config` and run one trainer with `run_training`;
`compare` builds one config per mode with `build_configs`. `run_modes` is the one runner of several modes,
interleaved (compare, the reproductions, the benchmarks); `open_trainers` holds their trainers open for a
caller that reads them between steps. Validation is not here: `TrainConfig.check()` does all of it, for the
CLI and for code that builds a config directly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reference_trainer.errors import UserError
from reference_trainer.modes import get_mode, parse_option_pairs
from reference_trainer.rollout.slots import WorkerSlots
from reference_trainer.tasks import RUN_TASK_OPTIONS
from reference_trainer.trace.locks import run_lock
from reference_trainer.train.config import TrainConfig
from rlbench.models import default_model_dir, resolve_model

if TYPE_CHECKING:
    from reference_trainer.train.trainer import Trainer


def build_config(**options: Any) -> TrainConfig:
    """A checked TrainConfig from CLI options: None values keep the defaults, `lr`/`kl_coef` go to GRPO,
    `mode_option`/`task_option` (KEY=VALUE strings, parsed here) become `mode_options`/`task_options` (over
    the task's RUN_TASK_OPTIONS). The model name is resolved (imported on first use) only after the check
    passed."""
    mode_options = parse_option_pairs(options.pop("mode_option", None) or [], "--mode-option")
    return _checked_config(options, mode_options)


def build_configs(modes: Sequence[str], **options: Any) -> dict[str, TrainConfig]:
    """One checked config per mode, from one set of CLI options (`rlbench compare`): --mode-option parsed
    once, each mode given the options it takes; an option that no mode takes, or a repeated mode, is one
    line. Every config is checked before any trainer is built."""
    if not modes or len(set(modes)) != len(modes):
        raise UserError(f"--modes needs distinct mode names, got {','.join(modes)!r}")
    wanted = parse_option_pairs(options.pop("mode_option", None) or [], "--mode-option")
    workers, engine = options.get("workers") or 1, options.get("engine") or "reference"
    per_mode = {m: get_mode(m).accepted(wanted, workers, engine) for m in modes}
    if unknown := sorted(wanted.keys() - {k for taken in per_mode.values() for k in taken}):
        raise UserError(f"no selected mode takes option {', '.join(unknown)}")
    return {m: _checked_config({**options, "mode": m}, per_mode[m]) for m in modes}


def _checked_config(options: dict[str, Any], mode_options: dict[str, Any]) -> TrainConfig:
    options = {k: v for k, v in options.items() if v is not None}
    task_pairs = parse_option_pairs(options.pop("task_option", []), "--task-option")
    grpo = {k: options.pop(k) for k in ("lr", "kl_coef") if k in options}
    config = TrainConfig(**options, mode_options=mode_options)
    config.grpo = replace(config.grpo, **grpo)
    config.task_options = {**RUN_TASK_OPTIONS.get(config.task, {}), **task_pairs}
    config.check()
    from reference_trainer.model.loader import resolve_device  # torch: only once the cheap checks passed

    device = resolve_device(config.device)  # --device cuda without a GPU: one line before any run directory
    if note := thread_split_note(config, device.type):  # an impossible split: one line here, too
        print(note, file=sys.stderr)
    if config.model is not None:  # a directory or a model name (rlbench models list), resolved once here
        config.model = str(resolve_model(config.model))
    return config


def thread_split_note(config: TrainConfig, device: str) -> str | None:
    """Where a run ahead's two sides (rollout/ahead.py) get fewer CPU threads than they need, the split
    picked for them, said before the run starts (None where there is nothing to say). The split is the
    trainer's own (`split_threads`), so its one refusal comes here, before any run directory is made."""
    mode = get_mode(config.mode)
    if not mode.ahead or device != "cpu":
        return None
    ahead = mode.resolve(config.mode_options, config.workers, config.engine).ahead
    if ahead is None or ahead.backend != "process":
        return None
    from reference_trainer.model.loader import resolve_threads
    from reference_trainer.rollout.ahead import split_threads  # torch: only once the cheap checks passed

    budget = resolve_threads(config.threads)
    rollout, update = split_threads(budget, ahead.max_staleness, ahead.rollout_threads)
    if rollout + update <= budget or ahead.max_staleness == 0:
        return None
    return (
        f"note: {config.mode} runs rollout and update side by side, and {budget} CPU thread cannot be split: "
        f"each side takes {rollout}, sharing the core (slower than two; --threads 2 on 2 free cores or "
        "more gives each its own)"
    )


def make_trainer(
    config: TrainConfig,
    out_dir: Path,
    trace: Any = None,
    resume: bool = False,
    slots: WorkerSlots | None = None,
) -> Trainer:
    """The trainer of a checked config, its input errors (an unreadable model or tokenizer file) one line;
    its Ray workers in `slots` when given."""
    from reference_trainer.train.trainer import Trainer

    if config.model is None:
        default_model_dir()  # the shipped weights' SHA-256 check, before the trainer starts
    try:
        return Trainer(config, out_dir, trace=trace, resume=resume, slots=slots)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err).splitlines()[0]) from None


def run_training(
    config: TrainConfig, out_dir: Path, trace: Any = None, resume: bool = False
) -> list[dict[str, Any]]:
    """Train with a progress bar (the trainer's own input errors are one-line UserErrors), as the only writer
    of `out_dir` (a second process on it is refused with one line)."""
    with run_lock(out_dir):
        trainer = make_trainer(config, out_dir, trace=trace, resume=resume)
        try:
            return _run_with_progress(trainer)
        finally:
            trainer.close()


def _run_with_progress(trainer: Trainer) -> list[dict[str, Any]]:
    config = trainer.config
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns) as progress:
        bar = progress.add_task(
            f"{config.mode} / {config.task}", total=config.steps, completed=trainer.step, info=""
        )

        # Without a terminal (a log file, CI) the bar is drawn only at the end: say each event on a line.
        plain = not progress.console.is_terminal

        def on_evaluate(step: int) -> None:
            problems = len(trainer.heldout.problems) if trainer.heldout else 0
            info = f"held-out evaluation of step {step} ({problems} problems)"
            progress.update(bar, info=info)
            if plain:
                progress.console.print(info)

        def on_step(row: dict[str, Any]) -> None:
            info = (
                f"reward {row['reward_mean']:.3f}  acc {row['accuracy']:.3f}  "
                f"len {row['response_len_mean']:.0f}  {row['step_time_s']:.1f}s/step"
            )
            if "val/heldout_greedy_acc" in row:
                info += f"  held-out {row['val/heldout_greedy_acc']:.3f}"
            progress.update(bar, completed=row["step"] + 1, info=info)
            if plain:
                # the step's own number, as the trace, metrics.jsonl and the pages name it (from 0)
                progress.console.print(f"step {row['step']} ({row['step'] + 1}/{config.steps})  {info}")

        trainer.on_evaluate = on_evaluate
        rows = trainer.run(on_step)
        progress.update(bar, info="done")  # not the final evaluation's line, which has finished
        return rows


@contextmanager
def open_trainers(
    configs: Mapping[str, TrainConfig], dirs: Mapping[str, Path], traces: Mapping[str, Any] | None = None
) -> Iterator[dict[str, Trainer]]:
    """The trainers of several checked configs (`dirs[name]`: each run's folder, `traces[name]`: a trace
    to write into instead of the run's own), all closed on the way out, whatever ends the block, the ones
    built before a failing one included. Their Ray worker pools share one set of places (`shared_slots`)."""
    trainers: dict[str, Trainer] = {}
    slots = shared_slots(configs.values())
    try:
        for name, config in configs.items():
            trainers[name] = make_trainer(config, dirs[name], trace=(traces or {}).get(name), slots=slots)
        yield trainers
    finally:
        for trainer in trainers.values():
            trainer.close()
        if slots is not None:
            slots.close()


def shared_slots(configs: Iterable[TrainConfig]) -> WorkerSlots | None:
    """One set of Ray places for the worker pools of runs that take their steps in turn: worker w of every
    run in place w, so the cluster needs W CPUs (GPUs) rather than W per run, and every run's worker w is
    on the same hardware. None when fewer than two runs have a Ray pool, or they disagree on the device or
    the cluster (each pool then places its own)."""
    pooled = [c for c in configs if c.workers > 1 and c.worker_backend == "ray" and c.engine == "reference"]
    # A rollout run ahead builds its pool (and, without an address, its own local Ray) in its own process:
    # no shared places for it (docs/modes.md).
    pooled = [c for c in pooled if not get_mode(c.mode).ahead]
    if len(pooled) < 2:
        return None
    from reference_trainer.model.loader import resolve_device

    gpu = {str(resolve_device(c.device)).startswith("cuda") for c in pooled}
    address = {c.ray_address for c in pooled}
    if len(gpu) > 1 or len(address) > 1:
        return None
    return WorkerSlots(max(c.workers for c in pooled), gpu.pop(), len(pooled), address.pop())


def run_modes(
    configs: Mapping[str, TrainConfig],
    dirs: Mapping[str, Path],
    steps: int,
    say: Callable[[str], None] = print,
    around: Mapping[str, Callable[[], AbstractContextManager[Any]]] | None = None,
    traces: Mapping[str, Any] | None = None,
    until: Callable[[str, dict[str, Any]], bool] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run several modes, interleaved: one trainer per config, `steps` steps each, one step of each in turn
    (`interleave`; `until` stops one early), every trainer closed at the end. Returns each run's rows."""
    with open_trainers(configs, dirs, traces) as trainers:
        return interleave(trainers, steps, say, around, until)


def interleave(
    trainers: Mapping[str, Trainer],
    steps: int,
    say: Callable[[str], None] = print,
    around: Mapping[str, Callable[[], AbstractContextManager[Any]]] | None = None,
    until: Callable[[str, dict[str, Any]], bool] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Train every trainer for `steps` more steps, one step of each in turn, so a drift in the machine's load
    hits all of them alike (comparisons of modes, reproductions, benchmarks). `around[name]()` wraps each of
    that trainer's steps (a profile session's clock); a trainer stops early once `until(name, row)` holds
    for its latest row (a target reached). Returns each trainer's metrics rows."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trainers}
    stopped: set[str] = set()
    for k in range(steps):
        for name, trainer in trainers.items():
            if name in stopped:
                continue
            with around[name]() if around else nullcontext():
                row = trainer.train_step()
            rows[name].append(row)
            if until is not None and until(name, row):
                stopped.add(name)
            say(
                f"step {row['step']} {name:>14}: {row['step_time_s']:.1f} s, "
                f"reward {row['reward_mean']:.3f}, len {row['response_len_mean']:.0f} ({k + 1}/{steps})"
            )
    return rows
