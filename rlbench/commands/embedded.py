"""`rlbench embedded`: the shipped embedded model: show it, check it, rebuild it from its recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rlbench.options import echo


def measure_card(model_dir: Path, problems: int = 128) -> dict[str, Any]:
    """The recipe's targets, measured on held-out problems of each task (train/heldout.py policy_card)."""
    from reference_trainer.model.loader import load_model
    from reference_trainer.model.tokenizer import load_tokenizer
    from reference_trainer.tasks import (
        RUN_TASK_OPTIONS,  # the tasks and settings RL runs use by default
        get_task,
    )
    from reference_trainer.train.heldout import policy_card

    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    return {
        name: policy_card(model, tokenizer, get_task(name, **options), n=problems)
        for name, options in RUN_TASK_OPTIONS.items()
    }


def build_command(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the model to.")] = Path(
        "embedded-build"
    ),
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="SFT steps (default: the recipe's).")
    ] = None,
    card: Annotated[
        bool, typer.Option("--card/--no-card", help="Measure the recipe's targets after training.")
    ] = True,
    install: Annotated[
        bool,
        typer.Option("--install", help="Also replace the shipped weights in this source tree (development)."),
    ] = False,
) -> None:
    """Train the embedded model from scratch by its recipe (reference_trainer/train/recipe.py): about 45
    minutes on 2 CPU cores. Deterministic for a given torch build and thread count."""
    import shutil

    from reference_trainer.errors import UserError, check_integer
    from reference_trainer.model import embedded
    from reference_trainer.trace.records import write_json
    from reference_trainer.train import recipe

    if steps is not None:
        check_integer("--steps", steps, low=1)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())):
        raise UserError(f"{out} exists and is not a model directory; refusing to replace it")
    build_with_progress(out, steps)
    if card:
        measured = measure_card(out)
        write_json(out / embedded.CARD, {"recipe_version": recipe.RECIPE_VERSION, "tasks": measured})
        echo(json.dumps(measured, indent=1))
        echo(targets_line(measured))
    if install:
        target = embedded.shipped_dir()
        for name in (*embedded.FILES, embedded.CHECKSUMS, *([embedded.CARD] if card else [])):
            shutil.copyfile(out / name, target / name)
        echo(f"installed into {target}")


def build_with_progress(out: Path, steps: int | None) -> None:
    """Build the model into `out` by the recipe, its SFT steps on a progress bar (a line every 5% when the
    output is no terminal): built aside and renamed into place, so a killed build leaves no half-written
    model at `out`."""
    import os
    import shutil
    import time

    from rich.progress import Progress

    from reference_trainer.model import embedded
    from reference_trainer.trace.records import replace_dir, temp_beside
    from reference_trainer.train import recipe

    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task("SFT", total=steps or recipe.RECIPE.sft.steps)

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(bar, completed=step + 1, description=f"SFT, loss {loss:.3f}")
            if not progress.console.is_terminal and (step + 1) % max(1, total // 20) == 0:
                elapsed = time.perf_counter() - start
                echo(f"SFT step {step + 1}/{total}, loss {loss:.3f}, {elapsed:.0f} s", err=True)

        tmp = temp_beside(out, f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            recipe.build(tmp, steps=steps, on_step=on_step)
            embedded.write_checksums(tmp)
            replace_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    echo(f"wrote {out} in {time.perf_counter() - start:.0f} s")


def targets_line(tasks: dict[str, dict[str, float]]) -> str:
    from reference_trainer.train.recipe import card_misses

    misses = card_misses(tasks)
    return "card targets: all met" if not misses else "card targets missed: " + "; ".join(misses)


def show_command() -> None:
    """Where the shipped model is, whether its files match their SHA-256 sums, and its measured card."""
    from reference_trainer.errors import ModelLoadError, UserError
    from reference_trainer.model import embedded
    from reference_trainer.trace.records import read_json

    directory = embedded.shipped_dir()
    try:
        embedded.verify(directory)
    except ModelLoadError as err:
        raise UserError(str(err)) from None
    echo(f"{directory}: SHA-256 verified")
    card = directory / embedded.CARD
    if card.is_file():
        measured = read_json(card)
        echo(card.read_text())
        echo(f"recipe version {measured['recipe_version']}: {targets_line(measured['tasks'])}")
