"""The `rlbench` command line. Commands live in rlbench.commands.*; heavy imports happen inside them."""

from __future__ import annotations

import sys

import typer

from rlbench.commands import COMMAND_MODULES
from rlbench.errors import UserError

app_ = typer.Typer(
    name="rlbench",
    help="Profile, speed up and evaluate LLM RL rollouts (SortedRL, RhymeRL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in COMMAND_MODULES:
    _module.register(app_)


def app() -> None:
    """Entry point: run the Typer app, turning UserError into one line on stderr and exit code 2."""
    try:
        rc = app_(standalone_mode=False)
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as err:
        # Usage errors (bad option values, unknown options) come from click, or from the copy of click
        # that newer typer versions vendor, so they are recognised by shape rather than by class.
        format_message = getattr(err, "format_message", None)
        exit_code = getattr(err, "exit_code", None)
        if callable(format_message) and isinstance(exit_code, int):
            if message := format_message():  # empty after no-args help, which is already printed
                typer.echo(f"error: {message}", err=True)
            sys.exit(exit_code)
        if isinstance(exit_code, int):  # click/typer Exit
            sys.exit(exit_code)
        raise
    if isinstance(rc, int) and rc != 0:
        sys.exit(rc)


if __name__ == "__main__":
    app()
