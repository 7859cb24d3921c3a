"""`rlbench trace export RUN --format perfetto`: a run as Chrome trace-event JSON (ui.perfetto.dev)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import OverwriteFile, echo

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
    echo(f"wrote {path}: {sum(by_ph.values())} events ({summary})")
    echo("open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing")


def validate_command(
    file: Annotated[Path, typer.Argument(help="An open rollout trace: one JSON request per line.")],
) -> None:
    """Check a file against the open rollout-trace schema (reference_trainer/trace/rollout_trace.schema.json):
    one line naming the first bad record, or a count of the good ones."""
    from reference_trainer.trace import rollout_trace

    records = rollout_trace.read(file)
    steps = len(rollout_trace.records_by_step(records))
    echo(f"{file}: {len(records)} request(s) in {steps} step(s) match {rollout_trace.SCHEMA_ID}")


def convert_command(
    source: Annotated[
        Path,
        typer.Argument(
            help="An rlbench run folder, TRL's output_dir, verl's rollout dumps (their folder; needs "
            "--tokenizer), a length log or slime's .pt."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="The open rollout trace to write (JSONL).")],
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="The run's tokenizer folder: required for verl's rollout dumps (texts, no token counts); "
            "TRL's texts are counted with it too.",
        ),
    ] = None,
    trust_pickle: Annotated[
        bool,
        typer.Option("--trust-pickle", help="Load a .pt that needs a full unpickle (it can run code in it)."),
    ] = False,
    overwrite: OverwriteFile = False,
) -> None:
    """Write another framework's per-sample file as an open rollout trace (docs/integrations.md). verl's
    rollout dumps hold texts, not token counts: they need the run's tokenizer folder, --tokenizer DIR."""
    from reference_trainer.trace import rollout_trace
    from reference_trainer.trace.records import write_jsonl
    from rlbench.integrations.convert import to_records
    from rlbench.integrations.imports import load_tokenizer
    from rlbench.rundirs import check_output_file

    check_output_file(out, (source,), overwrite)
    loader = (lambda: load_tokenizer(tokenizer)) if tokenizer else None
    records = rollout_trace.check(to_records(source, loader, trust_pickle), source)  # our bug: refused here
    write_jsonl(out, records)
    timed = sum(r["time_source"] != "none" for r in records)
    echo(f"wrote {out}: {len(records)} request(s), {timed} with times")
