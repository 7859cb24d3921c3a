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
        Path | None, typer.Option("--out", help="Output file. Default: RUN/trace.perfetto.json.")
    ] = None,
) -> None:
    """Export a run's trace for ui.perfetto.dev: engine steps, requests on KV slots, phases, counters.

    Tracks: per worker its engine steps, one lane per KV slot with the requests that held it, and active-slot
    and queued-request counters; the RL phases; NVML GPU counters. Docs: docs/perfetto.md."""
    from reference_trainer.errors import UserError

    if format_ not in FORMATS:  # checked before the run is read: a typo costs nothing
        raise UserError(f"--format {format_!r} is not supported; the only format is {', '.join(FORMATS)}")
    from collections import Counter

    from rlbench.perfetto import perfetto_trace, write

    trace = perfetto_trace(run)
    path = write(trace, out or run / "trace.perfetto.json")
    by_ph = dict(sorted(Counter(e["ph"] for e in trace["traceEvents"]).items()))
    names = {"X": "spans", "C": "counter samples", "i": "instants", "M": "metadata"}
    summary = ", ".join(f"{n} {names.get(ph, ph)}" for ph, n in by_ph.items())
    typer.echo(f"wrote {path}: {sum(by_ph.values())} events ({summary})")
    typer.echo("open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing")
