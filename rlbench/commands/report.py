"""`rlbench report DIR [DIR...]`: re-render reports from saved JSON/JSONL, without re-running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.errors import UserError

# What a run directory holds: `profile` writes metrics.json; a `train` run only the JSONL logs.
RUN_FILES = ("metrics.json", "trace.jsonl", "metrics.jsonl")


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        dirs: Annotated[
            list[Path],
            typer.Argument(
                help="Run directories (profile or train runs) or compare directories (compare.json)."
            ),
        ],
    ) -> None:
        """Re-render report.html in each DIR: a compare report where compare.json exists, else a profile."""
        for d in dirs:
            if not d.is_dir():
                raise UserError(f"{d}: not a directory")
            if (d / "compare.json").exists():
                from rlbench.report.compare_report import render_compare

                path = render_compare(d)
            elif any((d / name).exists() for name in RUN_FILES):
                from rlbench.report.profile_report import render_profile

                path = render_profile(d)
            else:
                raise UserError(
                    f"{d}: no metrics.json or compare.json to render (nor a train run's JSONL logs)"
                )
            typer.echo(f"report: {path}")
