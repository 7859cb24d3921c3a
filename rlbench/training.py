"""Running the reference trainer from the CLI: validation, config building and a rich progress display.

`train`, `profile` and `compare` all go through `run_training`, so they validate and report alike.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from rlbench.errors import UserError


def valid_modes() -> list[str]:
    from reference_trainer.modes import MODES

    return list(MODES)


def valid_tasks() -> list[str]:
    from reference_trainer.tasks import TASKS

    return sorted(TASKS)


def check_mode_and_task(mode: str, task: str) -> None:
    if mode not in valid_modes():
        raise UserError(f"unknown mode {mode!r}; valid modes: {', '.join(valid_modes())}")
    if task not in valid_tasks():
        raise UserError(f"unknown task {task!r}; valid tasks: {', '.join(valid_tasks())}")


def check_engine(engine: str) -> None:
    """A known engine, installed (the engine factory's check): a one-line error before any model is
    loaded."""
    from reference_trainer.engine.factory import check_engine_kind

    try:
        check_engine_kind(engine)
    except ValueError as err:
        raise UserError(str(err)) from None


def check_workers(mode_name: str, workers: int) -> None:
    """--workers > 1: a mode that can spread over workers, and Ray installed."""
    from reference_trainer.modes import get_mode

    if workers <= 1:
        return
    try:
        get_mode(mode_name).strategy_for(workers)
    except ValueError as err:
        raise UserError(str(err)) from None
    from reference_trainer.rollout.workers import require_ray

    try:
        require_ray(workers)
    except ValueError as err:
        raise UserError(str(err)) from None


def check_strategy_options(
    mode_name: str, workers: int, mode_options: dict[str, Any], engine: str = "reference"
) -> None:
    """Check the options' names and types against the mode registry, then build the mode's strategy once
    (cheap) so a bad value fails before any model is loaded."""
    from reference_trainer.modes import get_mode, make_mode_strategy

    strategy_options = {k: v for k, v in mode_options.items() if k != "histospec"}
    try:
        mode = get_mode(mode_name)
        mode.check_options(mode_options, workers, engine)
        make_mode_strategy(mode, workers, strategy_options)
    except (ValueError, TypeError) as err:
        raise UserError(f"mode {mode_name!r}: {str(err).splitlines()[0]}") from None


def parse_mode_options(pairs: list[str], flag: str = "--mode-option") -> dict[str, Any]:
    """["oversubscription=3", "histospec.max_draft=8"] -> {"oversubscription": 3, "histospec": {...}}."""
    import json

    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} needs KEY=VALUE, got {pair!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        head, _, sub = key.partition(".")
        if sub:
            parsed.setdefault(head, {})[sub] = value
        else:
            parsed[key] = value
    return parsed


def accepted_mode_options(
    mode_name: str, options: dict[str, Any], workers: int = 1, engine: str = "reference"
) -> dict[str, Any]:
    """The subset of `options` (as parse_mode_options nests them) that mode `mode_name` takes on `workers`
    rollout workers, by the mode registry: its strategy's options, and `histospec` when the mode drafts."""
    from reference_trainer.modes import get_mode

    try:
        mode = get_mode(mode_name)
        mode.strategy_for(workers)
    except ValueError as err:
        raise UserError(str(err)) from None
    takes = mode.options(workers, engine)
    return {k: v for k, v in options.items() if k in takes or (k == "histospec" and mode.speculative)}


def reject_unknown_mode_options(mode_name: str, wanted: dict[str, Any], accepted: dict[str, Any]) -> None:
    """One line for options the mode does not take (or takes only with --workers > 1)."""
    from reference_trainer.modes import get_mode

    if not (unknown := sorted(wanted.keys() - accepted.keys())):
        return
    if multi := [k for k in unknown if k in get_mode(mode_name).options()]:
        raise UserError(f"mode {mode_name!r} takes option {', '.join(multi)} only with --workers > 1")
    raise UserError(f"mode {mode_name!r} takes no option {', '.join(unknown)}")


# What a run's task is when --task-option says nothing else: kk puzzles of 3 people (the embedded model's
# search traces cover up to 3). The embedded model's card is measured on the same settings.
DEFAULT_TASK_OPTIONS: dict[str, dict[str, Any]] = {"arith": {}, "kk": {"num_people": 3}}


def task_options(task: str, pairs: list[str]) -> dict[str, Any]:
    """The task's constructor options: DEFAULT_TASK_OPTIONS, then --task-option KEY=VALUE pairs, checked by
    building the task once, so a typo fails before any model loads."""
    from reference_trainer.tasks import get_task

    options = {**DEFAULT_TASK_OPTIONS.get(task, {}), **parse_mode_options(pairs, "--task-option")}
    try:
        get_task(task, **options)
    except TypeError as err:
        raise UserError(f"task {task!r} takes no option {str(err).split('argument')[-1].strip()}") from None
    except ValueError as err:
        raise UserError(f"task {task!r}: {err}") from None
    return options


def build_config(**options: Any) -> Any:
    """A TrainConfig from CLI options; None values keep the defaults, `lr`/`kl_coef` go to GRPO and
    `mode_option` (KEY=VALUE strings) becomes `mode_options`."""
    from reference_trainer.train.config import TrainConfig

    options = {k: v for k, v in options.items() if v is not None}
    task_option = options.pop("task_option", [])
    if "mode_option" in options:
        wanted = parse_mode_options(options.pop("mode_option"))
        mode = options.get("mode", "baseline")
        check_mode_and_task(mode, options.get("task", "arith"))
        workers, engine = options.get("workers", 1), options.get("engine", "reference")
        options["mode_options"] = accepted_mode_options(mode, wanted, workers, engine)
        reject_unknown_mode_options(mode, wanted, options["mode_options"])
        check_strategy_options(mode, workers, options["mode_options"], engine)
    check_mode_and_task(options.get("mode", "baseline"), options.get("task", "arith"))
    check_engine(options.get("engine", "reference"))
    check_workers(options.get("mode", "baseline"), options.get("workers", 1))
    config = TrainConfig()
    grpo = {k: options.pop(k) for k in ("lr", "kl_coef") if k in options}
    if "model" in options:  # a directory or a model name (rlbench models list), resolved once here
        from rlbench.models import resolve_model

        options["model"] = str(resolve_model(options["model"]))
    config = replace(config, **options)
    config.grpo = replace(config.grpo, **grpo)
    config.task_options = task_options(config.task, task_option)
    try:
        config.check()
    except ValueError as err:
        raise UserError(str(err)) from None
    return config


def ensure_default_model() -> Path:
    """The shipped embedded model's directory, checked against its SHA-256 sums (one-line error if not)."""
    from reference_trainer.model.embedded import default_model_dir
    from reference_trainer.model.loader import ModelLoadError

    try:
        return default_model_dir()
    except ModelLoadError as err:
        raise UserError(str(err)) from None


def run_training(config: Any, out_dir: Path, trace: Any = None, resume: bool = False) -> list[dict[str, Any]]:
    """Train with a progress bar; turns the trainer's input errors into one-line UserErrors."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from reference_trainer.model.loader import ModelLoadError
    from reference_trainer.train.trainer import Trainer

    if config.model is None:
        ensure_default_model()
    try:
        trainer = Trainer(config, out_dir, trace=trace, resume=resume)
    except (ModelLoadError, FileNotFoundError, ValueError) as err:
        raise UserError(str(err).splitlines()[0]) from None
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

        def on_step(row: dict[str, Any]) -> None:
            info = (
                f"reward {row['reward_mean']:.3f}  acc {row['accuracy']:.3f}  "
                f"len {row['response_len_mean']:.0f}  {row['step_time_s']:.1f}s/step"
            )
            progress.update(bar, completed=row["step"] + 1, info=info)

        try:
            return trainer.run(on_step)
        finally:
            trainer.close()
