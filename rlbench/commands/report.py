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
                help="Run directories (profile or train runs), compare directories (compare.json) or "
                "eval directories (results.json, or a killed eval's run_config.json)."
            ),
        ],
    ) -> None:
        """Re-render report.html in each DIR: a compare report where compare.json exists, an eval report
        where an eval ran, else a profile."""
        from rlbench.report.eval_report import is_eval_dir

        for d in dirs:
            if not d.is_dir():
                raise UserError(f"{d}: not a directory")
            if (d / "compare.json").exists():
                from rlbench.report.compare_report import render_compare

                path = render_compare(d)
            elif is_eval_dir(d):
                from rlbench.report.eval_report import render_eval

                path = render_eval(d)
            elif any((d / name).exists() for name in RUN_FILES):
                from rlbench.report.profile_report import render_profile

                path = render_profile(d)
            else:
                raise UserError(
                    f"{d}: no metrics.json or compare.json to render (nor an eval's results.json, nor a "
                    "train run's JSONL logs)"
                )
            typer.echo(f"report: {path}")
