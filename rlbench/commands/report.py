"""`rlbench report DIR [DIR...]`: re-render reports from saved JSON/JSONL, without re-running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import UserError
from rlbench.options import echo

# What a run directory holds: `profile` writes metrics.json; a `train` run only the JSONL logs.
RUN_FILES = ("metrics.json", "trace.jsonl", "metrics.jsonl")


def report_command(
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
    for d in dirs:
        if not d.is_dir():
            raise UserError(f"{d}: not a directory")
        try:
            path = _render(d)
        except UserError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            # Files past their shape checks whose values still are not what rlbench writes (hand-edited or
            # foreign): one line naming the directory, never a traceback from deep inside a chart.
            why = f"{type(err).__name__}: {err}"
            raise UserError(f"{d}: its saved results are not as rlbench writes them ({why})") from None
        echo(f"report: {path}")


def _render(d: Path) -> Path:
    """Re-render d/report.html: a compare report where compare.json exists, an eval report where an eval
    ran, else a profile."""
    from rlbench.report.eval_report import is_eval_dir

    if (d / "compare.json").exists():
        from rlbench.report.compare_report import render_compare

        return render_compare(d)
    if is_eval_dir(d):
        from rlbench.report.eval_report import render_eval

        return render_eval(d)
    from rlbench.report.import_report import is_import_run, rerender

    if is_import_run(d):  # another framework's run (rlbench import, the TRL callback)
        return rerender(d)
    if any((d / name).exists() for name in RUN_FILES):
        from rlbench.report.profile_report import render_profile

        return render_profile(d)
    raise UserError(
        f"{d}: no metrics.json or compare.json to render (nor an eval's results.json, nor a train run's "
        "JSONL logs)"
    )
