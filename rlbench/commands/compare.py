"""`rlbench compare`: several modes on the same prompts and seeds in one process, with ratios to baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import UserError
from rlbench.options import OutDir, RunOptions, Steps, with_run_options


@with_run_options
def compare_command(
    *,
    modes: Annotated[
        str, typer.Option("--modes", help="Comma-separated modes; baseline is the reference.")
    ] = "baseline,sorted,sorted-partial,rhyme",
    run: RunOptions,
    steps: Steps = 4,
    out: OutDir = Path("runs/compare"),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace runs already in --out (their checkpoints too).")
    ] = False,
) -> None:
    """Run the modes side by side, one step of each in turn (same prompts, seeds, model); write compare.json
    (ratios, their spread per round, a machine-load drift check) and a side-by-side page."""
    from contextlib import ExitStack

    from reference_trainer.mode_options import parse_option_pairs
    from reference_trainer.modes import get_mode
    from rlbench.profiling.session import check_new_run
    from rlbench.rundirs import check_new_comparison, claim
    from rlbench.training import build_config

    names = [m.strip() for m in modes.split(",") if m.strip()]
    if len(set(names)) != len(names) or not names:
        raise UserError(f"--modes needs distinct mode names, got {modes!r}")
    wanted = parse_option_pairs(run.mode_option or [])
    per_mode = {m: get_mode(m).accepted(wanted, run.workers, run.engine) for m in names}
    if unknown := sorted(wanted.keys() - {k for opts in per_mode.values() for k in opts}):
        raise UserError(f"no selected mode takes option {', '.join(unknown)}")
    # every mode's config is built (and checked) before any runs; each gets the options it takes
    configs = [
        build_config(**run.config_kwargs(mode=m, steps=steps, mode_option=None), mode_options=per_mode[m])
        for m in names
    ]
    from reference_trainer.model.embedded import label as embedded_label  # heavy: once the input is checked
    from reference_trainer.model.loader import resolve_threads
    from reference_trainer.trace.compare import drift_check, step_speedups
    from reference_trainer.trace.records import write_json
    from rlbench.profiling.session import ProfileSession
    from rlbench.report.compare_report import drift_note, ratio_rows, render_compare
    from rlbench.training import interleave, make_trainer

    # Each mode in its own profile session (trace, NVML, report), their trainers taking one step each in
    # turn: a change in machine load hits every mode alike instead of whichever ran during it. One writer:
    # a second compare (or a profile of one of its modes) on --out is refused, and so is a folder holding
    # another command's run or, without --overwrite, a comparison; all before any mode runs.
    with ExitStack() as stack:
        stack.enter_context(claim(out, "compare", accepts=("compare",)))
        check_new_comparison(out, names, overwrite)
        for config in configs:
            stack.enter_context(claim(out / config.mode, "compare", accepts=("train", "profile")))
            check_new_run(out / config.mode, overwrite)
        sessions = {
            c.mode: stack.enter_context(ProfileSession(out / c.mode, run={"mode": c.mode, "task": c.task,
                                                                         "steps": c.steps, "seed": c.seed}))
            for c in configs
        }  # fmt: skip
        trainers = {c.mode: make_trainer(c, out / c.mode, trace=sessions[c.mode].trace) for c in configs}
        for trainer in trainers.values():
            stack.callback(trainer.close)
        interleave(trainers, steps, say=typer.echo, around={m: s.running for m, s in sessions.items()})
    runs = [{"mode": m, "summary": s.doc["summary"], "steps": s.doc["steps"]} for m, s in sessions.items()]
    baseline = "baseline" if "baseline" in names else names[0]
    workload = {
        "task": run.task,
        "steps": steps,
        "seed": run.seed,
        "model": str(run.model) if run.model else embedded_label(),
        "engine": run.engine,
        "workers": run.workers,
        "prompts_per_step": configs[0].prompts_per_step,
        "group_size": configs[0].group_size,
        "max_tokens": configs[0].response_tokens,
        "threads": resolve_threads(run.threads),
    }
    drift = drift_check({r["mode"]: r["summary"] for r in runs})
    spread = step_speedups({r["mode"]: r["steps"] for r in runs}, baseline)
    write_json(
        out / "compare.json",
        {"baseline": baseline, "workload": workload, "interleaved": True, "runs": runs,
         "ratios": ratio_rows(runs, baseline), "speedup_per_round": spread, "drift": drift},
    )  # fmt: skip
    render_compare(out)
    for row in ratio_rows(runs, baseline):
        speedup = row.get("speed-up (step time)")
        bubble = row.get("bubble ratio")
        rounds = spread.get(row["mode"], {})
        span = f" ({rounds['min']:.2f}-{rounds['max']:.2f}x per round)" if rounds.get("min") else ""
        gpu = row.get("GPU idle in rollout")
        gpu_idle = f", GPU idle {100 * gpu:.1f}%" if gpu is not None else ""
        typer.echo(
            f"{row['mode']:>16}: bubble {100 * bubble:5.1f}% (slots){gpu_idle}  step-time speed-up "
            f"{speedup:.2f}x{span}  reward {row['reward']:.3f}"
            if speedup and bubble is not None
            else f"{row['mode']:>16}: {row}"
        )
    if message := drift_note(drift):
        typer.echo(f"warning: {message}", err=True)
    typer.echo(f"report: {out / 'report.html'}")
