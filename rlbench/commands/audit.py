"""`rlbench audit RUN_OR_LOG`: a run's trainer wait, rollout idle and slot bubble rebuilt from its
per-sample evidence, beside the framework's own figures, and the run's label (docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import OverwriteFile, echo


def audit_command(
    source: Annotated[
        Path,
        typer.Argument(
            help="An rlbench run folder, a verl file log, or any file `rlbench trace convert` reads."
        ),
    ],
    slots: Annotated[
        int | None,
        typer.Option("--slots", help="The rollout's concurrent samples (verl: its max_concurrent_samples)."),
    ] = None,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="Flag a rebuilt share this far from the declared one.")
    ] = 0.10,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="The run's tokenizer directory (verl's text dumps).")
    ] = None,
    trust_pickle: Annotated[
        bool, typer.Option("--trust-pickle", help="Load a slime .pt that needs a full unpickle.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the audit as JSON to this file.")
    ] = None,
    overwrite: OverwriteFile = False,
) -> None:
    """Rebuild trainer idle, rollout idle and the slot bubble from the run's own evidence, set them beside
    the framework's figures, flag disagreements, and label the run (rollout-bound, trainer-bound, balanced,
    sync-overhead)."""
    from reference_trainer.errors import check_integer, check_number
    from reference_trainer.trace.records import write_json
    from rlbench.integrations.audit import audit
    from rlbench.integrations.imports import load_tokenizer
    from rlbench.rundirs import check_output_file

    if slots is not None:
        check_integer("--slots", slots, low=1)
    check_number("--tolerance", tolerance, low=0.0, high=1.0)
    if out is not None:  # before the audit: a refused path costs nothing
        check_output_file(out, (source,), overwrite)
    doc = audit(
        source, slots, tolerance, (lambda: load_tokenizer(tokenizer)) if tokenizer else None, trust_pickle
    )
    _say(doc)
    if out is not None:
        write_json(out, doc)


def _say(doc: dict) -> None:
    """The audit as the terminal shows it: each figure, rebuilt beside declared, the label, the notes."""
    from reference_trainer.errors import printable
    from rlbench.report.figures import pct

    echo(f"{doc['source']} ({doc['kind']}, {doc['steps']} step(s)); tolerance {doc['tolerance']:g}")
    for f in doc["figures"]:
        declared = (
            f"{pct(f['declared'])} declared by {f['declared_by']}" if f["declared_by"] else "none declared"
        )
        flag = "  <-- DISAGREES" if f["flagged"] else ""
        rebuilt = pct(f["rebuilt"]) if "time" not in f["quantity"] else f"{f['rebuilt']:.3g}"
        if "time" in f["quantity"] and f["declared"] is not None:
            declared = f"{f['declared']:.3g} declared by {f['declared_by']}"
        echo(f"{f['quantity']}: {rebuilt} rebuilt ({f['evidence']}); {declared}{flag}")
    label = doc["label"] or "unknown (needs both idle shares)"
    basis = (
        f" (from the {doc['label_from']} shares; idle high at {doc['idle_high']:.0%})" if doc["label"] else ""
    )
    check = f"; {doc['label_check']}" if doc["label_check"] else ""
    echo(f"label: {label}{basis}{check}")
    for note in doc["notes"]:
        echo(printable(f"note: {note}"))
