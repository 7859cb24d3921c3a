"""`rlbench compare`: several modes on the same prompts and seeds in one process, with ratios to baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.errors import UserError
from rlbench.options import OutDir, RunOptions, Steps, with_run_options


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @with_run_options
    def compare(
        *,
        modes: Annotated[
            str, typer.Option("--modes", help="Comma-separated modes; baseline is the reference.")
        ] = "baseline,sorted,sorted-partial,rhyme",
        run: RunOptions,
        steps: Steps = 4,
        out: OutDir = Path("runs/compare"),
    ) -> None:
        """Run each mode in turn (same prompts, seeds, model); write compare.json and a side-by-side page."""
        import json

        from reference_trainer.model.embedded import label as embedded_label
        from rlbench.profiling.session import run_profile
        from rlbench.records import write_json
        from rlbench.report.compare_report import ratio_rows, render_compare
        from rlbench.training import (
            accepted_mode_options,
            build_config,
            check_mode_and_task,
            parse_mode_options,
        )

        task, workers, mode_option = run.task, run.workers, run.mode_option
        names = [m.strip() for m in modes.split(",") if m.strip()]
        if len(set(names)) != len(names) or not names:
            raise UserError(f"--modes needs distinct mode names, got {modes!r}")
        for m in names:  # validate every mode before running any
            check_mode_and_task(m, task)
        wanted = parse_mode_options(mode_option or [])
        per_mode = {m: accepted_mode_options(m, wanted, workers) for m in names}
        if unknown := sorted(wanted.keys() - {k for opts in per_mode.values() for k in opts}):
            raise UserError(f"no selected mode takes option {', '.join(unknown)}")
        configs = [
            build_config(
                **run.config_kwargs(
                    mode=m,
                    steps=steps,
                    # only the options this mode takes (validated above), back in KEY=VALUE form
                    mode_option=[f"{k}={json.dumps(v)}" for k, v in per_mode[m].items()] or None,
                )
            )
            for m in names
        ]
        runs = []
        for config in configs:
            typer.echo(f"== {config.mode}")
            doc = run_profile(config, out / config.mode)
            runs.append({"mode": config.mode, "summary": doc["summary"], "steps": doc["steps"]})
        baseline = "baseline" if "baseline" in names else names[0]
        workload = {
            "task": task,
            "steps": steps,
            "seed": run.seed,
            "model": str(run.model) if run.model else embedded_label(),
            "engine": run.engine,
            "workers": workers,
            "prompts_per_step": configs[0].prompts_per_step,
            "group_size": configs[0].group_size,
            "max_tokens": configs[0].response_tokens,
        }
        write_json(
            out / "compare.json",
            {"baseline": baseline, "workload": workload, "runs": runs, "ratios": ratio_rows(runs, baseline)},
        )
        render_compare(out)
        for row in ratio_rows(runs, baseline):
            speedup = row.get("speed-up (step time)")
            bubble = row.get("bubble ratio")
            typer.echo(
                f"{row['mode']:>16}: bubble {100 * bubble:5.1f}%  step-time speed-up "
                f"{speedup:.2f}x  reward {row['reward']:.3f}"
                if speedup and bubble is not None
                else f"{row['mode']:>16}: {row}"
            )
        typer.echo(f"report: {out / 'report.html'}")
