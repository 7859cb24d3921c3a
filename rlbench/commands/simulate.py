"""`rlbench simulate`: what SortedRL / HistoSpec / HistoPipe would save on a cluster, from a length trace;
`rlbench simulate validate RUN`: the simulator against a measured run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlbench.options import ModeOption, OutDir, Seed, SimGpu, SimModelSize

if TYPE_CHECKING:
    from rlbench.simulate.config import SimConfig


def simulate_command(
    ctx: typer.Context,
    out: OutDir = Path("runs/simulate"),
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Length trace JSONL (see rlbench.simulate.workload), a run's trace.jsonl or run dir."
        ),
    ] = None,
    synthetic: Annotated[bool, typer.Option(help="Use the synthetic heavy-tailed workload.")] = False,
    workers: Annotated[str, typer.Option(help="Worker counts, comma-separated.")] = "1,8,64,512,4096",
    gpu: SimGpu = "h100",
    model_size: SimModelSize = "7b",
    calibrate: Annotated[
        Path | None, typer.Option(help="Fit the cost model to this run (dir or trace.jsonl) instead.")
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(
            "--modes",
            help="Comma-separated modes, as train's --mode takes them (rlbench modes lists them; "
            "default: all). An entry may carry its own options: NAME:KEY=VALUE[:KEY=VALUE], e.g. "
            "baseline:placement=least-outstanding.",
        ),
    ] = None,
    mode_option: ModeOption = None,
    capacity: Annotated[
        int | None, typer.Option(min=1, help="Slots per worker (default 256; a calibration run's own).")
    ] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="RL steps (default: the trace's).")] = None,
    groups_per_worker: Annotated[
        int | None, typer.Option(min=1, help="Weak scaling: B = this x workers groups per step.")
    ] = None,
    acceptance: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="HistoSpec per-token acceptance where the trace has none."),
    ] = 0.7,
    rank_corr: Annotated[
        float, typer.Option(min=-1.0, max=1.0, help="Epoch-to-epoch length rank correlation.")
    ] = 0.8,
    overlap: Annotated[float, typer.Option(min=0.0, max=1.0, help="Synthetic: reusable token share.")] = 0.8,
    prompts: Annotated[int, typer.Option(min=1, help="Synthetic: prompts per step.")] = 512,
    group_size: Annotated[int, typer.Option(min=1, help="Synthetic: samples per prompt.")] = 8,
    mean_tokens: Annotated[float, typer.Option(min=1.0, help="Synthetic: mean response tokens.")] = 2000.0,
    sigma: Annotated[float, typer.Option(min=0.0, help="Synthetic: log-normal sigma (tail weight).")] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Synthetic: response length cap.")] = 16384,
    max_prefill_tokens: Annotated[int, typer.Option(min=1, help="Tokens per batched prefill.")] = 8192,
    seed: Seed = 0,
) -> None:
    """Replay a length trace through the schedulers at 1..N workers: simulate.json + report.html.
    `rlbench simulate validate RUN` checks the simulator against a measured run."""
    from reference_trainer.errors import UserError
    from rlbench.rundirs import claim
    from rlbench.simulate.config import SimConfig

    if ctx.invoked_subcommand is not None:
        given = [name for name in ctx.params if ctx.get_parameter_source(name).name != "DEFAULT"]
        if given:  # they would be ignored: the subcommand has options of its own
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UserError(f"{flags}: give `simulate {ctx.invoked_subcommand}`'s options after its name")
        return
    cfg = SimConfig.from_cli(workers, modes, mode_option, trace=trace, synthetic=synthetic, gpu=gpu,
                             model_size=model_size, calibrate=calibrate, capacity=capacity, steps=steps,
                             groups_per_worker=groups_per_worker, acceptance=acceptance, rank_corr=rank_corr,
                             overlap=overlap, prompts=prompts, group_size=group_size, mean_tokens=mean_tokens,
                             sigma=sigma, max_tokens=max_tokens, max_prefill_tokens=max_prefill_tokens,
                             seed=seed)  # fmt: skip
    with claim(out, "simulate", accepts=("simulate",)):  # one writer, into a simulation or a new folder
        _simulate(cfg, out)


def _simulate(cfg: SimConfig, out: Path) -> None:
    """The checked run, inside the command's claim of `out`."""
    from reference_trainer.trace.records import write_json
    from rlbench.report.simulate_report import render
    from rlbench.simulate.config import run

    doc = run(cfg)
    write_json(out / "simulate.json", doc)
    page = render(doc, out)
    for r in doc["results"]:
        typer.echo(
            f"W={r['workers']:>5} {r['policy']:<16} speed-up {r['speedup']:.2f}x  "
            f"bubble {r['bubble_ratio']:.1%}  idle {r['worker_idle_share']:.1%}  "
            f"step {r['step_time_s']:.1f}s"
        )
    typer.echo(f"simulated in {doc['elapsed_s']:.1f} s: {out / 'simulate.json'}, {page}")


def validate_command(
    run: Annotated[Path, typer.Argument(help="A measured baseline run: its directory or its trace.jsonl.")],
    out: OutDir = Path("runs/simulate-validate"),
) -> None:
    """Replay a measured baseline run on a cost model fitted to it, and compare its bubble with the
    measured one, step by step: validation.json."""
    import json

    from reference_trainer.trace.records import write_json
    from rlbench.rundirs import claim
    from rlbench.simulate.replay import validate

    doc = validate(run)  # reads the run only: a bad one is one line before --out is touched
    with claim(out, "simulate", accepts=("simulate",)):
        write_json(out / "validation.json", doc)
    typer.echo(json.dumps({k: doc[k] for k in ("measured_bubble", "simulated_bubble")}))
    typer.echo(f"validation: {out / 'validation.json'}")
