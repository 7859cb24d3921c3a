"""`rlbench simulate`: what SortedRL / HistoSpec / HistoPipe would save on a cluster, from a length trace;
`rlbench simulate validate RUN`: the simulator against a measured run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlbench.options import ModeOption, OutDir, Seed, SimGpu, SimModelSize, echo, given_flags, with_options

if TYPE_CHECKING:
    from rlbench.simulate.config import SimConfig

Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace a simulation already in --out.")]


@dataclass(frozen=True)
class SimOptions:
    """`rlbench simulate`'s workload, cost model and schedule options, as given (with_options expands it
    into these flags); `SimConfig.from_cli` parses and checks them."""

    trace: Annotated[
        Path | None,
        typer.Option(
            help="Length trace JSONL (see rlbench.simulate.workload), a run's trace.jsonl or run dir."
        ),
    ] = None
    synthetic: Annotated[
        bool, typer.Option(help="Use the synthetic heavy-tailed workload (the default without --trace).")
    ] = False
    workers: Annotated[
        str | None,
        typer.Option(
            help="Worker counts, comma-separated. Default: 1,8,64,512,4096 for a trace; 1,8,64 for the "
            "synthetic workload (a quick default; add 512,4096 for the full sweep)."
        ),
    ] = None
    gpu: SimGpu = "h100"
    model_size: SimModelSize = "7b"
    fit: Annotated[
        Path | None,
        typer.Option(
            "--fit", "--calibrate", help="Fit the cost model to this run (dir or trace.jsonl) instead."
        ),
    ] = None
    modes: Annotated[
        str | None,
        typer.Option(
            "--modes",
            help="Comma-separated modes, as train's --mode takes them (rlbench modes lists them; "
            "default: all). An entry may carry its own options: NAME:KEY=VALUE[:KEY=VALUE], e.g. "
            "baseline:dispatch=least-in-flight.",
        ),
    ] = None
    dispatch: Annotated[
        str | None,
        typer.Option(
            "--dispatch",
            help="Comma-separated dispatch policies (rlbench modes lists them; or package.module:Class): "
            "each mode runs under each, labelled MODE:dispatch=POLICY.",
        ),
    ] = None
    mode_option: ModeOption = None
    capacity: Annotated[
        int | None, typer.Option(min=1, help="Slots per worker (default 256; a calibration run's own).")
    ] = None
    steps: Annotated[
        int | None, typer.Option(min=1, help="RL steps (default: the trace's; 4 of the synthetic workload).")
    ] = None
    groups_per_worker: Annotated[
        int | None, typer.Option(min=1, help="Weak scaling: B = this x workers groups per step.")
    ] = None
    acceptance: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="HistoSpec per-token acceptance where the trace has none."),
    ] = 0.7
    rank_corr: Annotated[
        float, typer.Option(min=-1.0, max=1.0, help="Epoch-to-epoch length rank correlation.")
    ] = 0.8
    overlap: Annotated[float, typer.Option(min=0.0, max=1.0, help="Synthetic: reusable token share.")] = 0.8
    prompts: Annotated[int, typer.Option(min=1, help="Synthetic: prompts per step.")] = 128
    group_size: Annotated[int, typer.Option(min=1, help="Synthetic: samples per prompt.")] = 8
    mean_tokens: Annotated[float, typer.Option(min=1.0, help="Synthetic: mean response tokens.")] = 2000.0
    sigma: Annotated[float, typer.Option(min=0.0, help="Synthetic: log-normal sigma (tail weight).")] = 1.0
    max_tokens: Annotated[int, typer.Option(min=1, help="Synthetic: response length cap.")] = 16384
    max_prefill_tokens: Annotated[int, typer.Option(min=1, help="Tokens per batched prefill.")] = 8192
    seed: Seed = 0


@with_options(SimOptions, "sim")
def simulate_command(
    ctx: typer.Context,
    out: OutDir = Path("runs/simulate"),
    *,
    sim: SimOptions,
    overwrite: Overwrite = False,
) -> None:
    """Replay a length trace (default: the synthetic workload) through the schedulers at 1..N workers:
    simulate.json + report.html. `rlbench simulate validate RUN` checks the simulator against a measured
    run."""
    from dataclasses import asdict

    from reference_trainer.errors import UserError
    from rlbench.simulate.config import SimConfig

    if ctx.invoked_subcommand is not None:
        if given := given_flags(ctx):  # they would be ignored: the subcommand has options of its own
            flags = ", ".join(given)
            raise UserError(f"{flags}: give `simulate {ctx.invoked_subcommand}`'s options after its name")
        return
    simulate_into(
        SimConfig.from_cli(**asdict(sim)), out, overwrite, named=sim.trace is not None or sim.synthetic
    )


def workload_line(cfg: SimConfig) -> str:
    """What a run without a named workload replays, and how to ask for more."""
    from rlbench.simulate.config import SYNTHETIC_STEPS

    workers = ",".join(map(str, cfg.workers))
    return (
        f"the synthetic heavy-tailed workload, {cfg.steps or SYNTHETIC_STEPS} steps of "
        f"{cfg.synthetic_prompts} prompts x {cfg.group_size}, on {workers} workers (--steps 10 --prompts 512 "
        "--workers 1,8,64,512,4096: the full sweep, ten times the samples; --trace FILE: your own lengths)"
    )


def result_line(r: dict) -> str:
    return (
        f"W={r['workers']:>5} {r['policy']:<16} speed-up {r['speedup']:.2f}x  "
        f"bubble {r['bubble_ratio']:.1%}  idle {r['worker_idle_share']:.1%}  step {r['step_time_s']:.1f}s"
    )


def asked_first(results: list[dict], asked: tuple[str, ...]) -> list[dict]:
    """The results by mode, the modes the user asked for first, in their order (then the reference the
    simulator adds), each mode's worker counts in order."""
    order = {name: i for i, name in enumerate(asked)}

    def rank(r: dict) -> int:
        return order.get(r["policy"], order.get(str(r["policy"]).split(":")[0], len(order)))

    return sorted(results, key=lambda r: (rank(r), r["workers"]))


def simulate_into(cfg: SimConfig, out: Path, overwrite: bool, named: bool = True) -> None:
    """The checked run: `out` claimed and checked (a simulation or a new folder), each result on stderr as
    it comes (a long sweep shows its way), then the table by mode on stdout. Not `named`: the command was
    given no workload, and says which one it replays."""
    from reference_trainer.trace.records import write_json
    from rlbench.report.simulate_report import render
    from rlbench.rundirs import check_run_dir, claim
    from rlbench.simulate.config import run

    def progress(r: dict, done: int, total: int) -> None:
        echo(f"[{done}/{total}] {result_line(r)}", err=True)

    if not named:
        echo(f"no --trace: {workload_line(cfg)}", err=True)
    with claim(out, "simulate", accepts=("simulate",)):  # one writer, into a simulation or a new folder
        check_run_dir(out, "simulate", overwrite, tuple(p for p in (cfg.trace, cfg.fit) if p is not None))
        doc = run(cfg, progress)
        write_json(out / "simulate.json", doc)
        page = render(doc, out)
        for r in asked_first(doc["results"], cfg.modes):
            echo(result_line(r))
        echo(f"simulated in {doc['elapsed_s']:.1f} s: {out / 'simulate.json'}, {page}")


def validate_command(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Measured runs (W = 1 or W engines): their folders or trace.jsonl files."),
    ],
    out: OutDir = Path("runs/simulate-validate"),
    tolerance: Annotated[
        float, typer.Option(help="The verdict's bound on the bubble's and cross-engine idle's error.")
    ] = 0.03,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when the simulator does not hold for every run.")
    ] = False,
    overwrite: Overwrite = False,
) -> None:
    """Replay each measured run (its mode, dispatch, engines, steps and lengths) on a cost model fitted to
    it; compare the bubble, the cross-engine idle and each engine's forwards, step by step and overall, and
    say per run whether the simulator holds (within --tolerance, equal forwards): validation.json."""
    from reference_trainer.trace.records import write_json
    from rlbench.rundirs import check_run_dir, claim
    from rlbench.simulate.replay import ValidateConfig, table, validate_runs

    cfg = ValidateConfig(tuple(runs), tolerance).check()
    check_run_dir(out, "simulate", overwrite, tuple(runs), marker="validation.json")
    doc = validate_runs(cfg)  # reads the runs only: a bad one is one line before --out is touched
    with claim(out, "simulate", accepts=("simulate",)):
        write_json(out / "validation.json", doc)
    for line in table(doc):
        echo(line)
    for run in doc["runs"]:
        echo(f"{run['run']}: {run['verdict']['text']}")
    echo(f"validation: {out / 'validation.json'}")
    if check and not doc["holds"]:
        raise typer.Exit(1)
