"""`rlbench trace export RUN --format perfetto`: a run as Chrome trace-event JSON (ui.perfetto.dev)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

FORMATS = ("perfetto",)


def export_command(
    run: Annotated[Path, typer.Argument(help="A run directory (train, profile, compare or observe).")],
    format_: Annotated[
        str,
        typer.Option(
            "--format", help="perfetto: Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing)."
        ),
    ] = "perfetto",
    out: Annotated[
        Path | None, typer.Option("--out", help="Output file (default RUN/trace.perfetto.json).")
    ] = None,
) -> None:
    """Export a run's trace: engine steps, requests per KV slot, RL phases and counters as tracks."""
    from rlbench.errors import UserError

    if format_ not in FORMATS:
        raise UserError(f"--format {format_!r} is not supported; formats: {', '.join(FORMATS)}")
    from rlbench.perfetto import export

    path, counts = export(run, out)
    summary = ", ".join(f"{n} {ph}" for ph, n in sorted(counts.items()))
    typer.echo(f"{path} ({summary} events); open it in https://ui.perfetto.dev")


def register(app: typer.Typer) -> None:
    trace = typer.Typer(help="Export run traces to other viewers.", no_args_is_help=True)
    trace.command("export")(export_command)
    app.add_typer(trace, name="trace")
