"""`rlbench simulate`: what SortedRL / HistoSpec / HistoPipe would save on a cluster, from a length trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import UserError
from reference_trainer.trace.schema import DECODE, PREFILL
from rlbench.options import ModeOption, OutDir, Seed, SimGpu, SimModelSize

MAX_SIM_STEPS = 10_000
MAX_SIM_TOKENS = 1 << 24
MAX_SIM_WORKERS = 1 << 20
MAX_SIM_SAMPLES = 1 << 26  # a synthetic workload's samples over all steps: a few arrays of this size


def _all_modes() -> str:
    from reference_trainer.modes import MODES  # the registry only: no torch

    return ",".join(MODES)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{what}: expected positive integers, got {text!r}")
    return values


def simulate_command(
    out: OutDir = Path("runs/simulate"),
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Length trace JSONL (see rlbench.simulate.workload), a run's trace.jsonl or run dir."
        ),
    ] = None,
    synthetic: Annotated[bool, typer.Option(help="Use the synthetic heavy-tailed workload.")] = False,
    lengths: Annotated[
        Path | None,
        typer.Option(
            help="A per-step, per-group length log (docs/integrations.md): the run `rlbench import lengths` "
            "writes, with --capacity slots per worker, at --workers."
        ),
    ] = None,
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
            "--policies",
            help="Comma-separated modes, as train's --mode takes them (rlbench modes lists them; "
            "default: all). An entry may carry its own options: NAME:KEY=VALUE[:KEY=VALUE], e.g. "
            "baseline:placement=least-outstanding. --policies is a deprecated alias.",
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
    validate: Annotated[
        Path | None, typer.Option(help="Replay this baseline run on a cost model fitted to it; compare.")
    ] = None,
    seed: Seed = 0,
) -> None:
    """Replay a length trace through the schedulers at 1..N workers: simulate.json + report.html."""
    import json

    from reference_trainer.errors import MAX_SEED, check_integer, check_number
    from reference_trainer.trace.records import write_json
    from rlbench.rundirs import claim

    # Every number in range before anything is built (one line naming the first that is not).
    for flag, value in (("--capacity", capacity), ("--groups-per-worker", groups_per_worker)):
        if value is not None:
            check_integer(flag, value, low=1)
    if steps is not None:
        check_integer("--steps", steps, low=1, high=MAX_SIM_STEPS)
    check_number("--acceptance", acceptance, low=0.0, high=1.0)
    check_number("--rank-corr", rank_corr, low=-1.0, high=1.0)
    check_number("--overlap", overlap, low=0.0, high=1.0)
    check_integer("--prompts", prompts, low=1)
    check_integer("--group-size", group_size, low=1)
    check_integer("--max-tokens", max_tokens, low=1, high=MAX_SIM_TOKENS)
    check_number("--mean-tokens", mean_tokens, low=1.0, high=max_tokens)
    check_number("--sigma", sigma, low=0.0, high=10.0)  # e^10: a tail far beyond any response cap
    check_integer("--max-prefill-tokens", max_prefill_tokens, low=1)
    check_integer("--seed", seed, low=0, high=MAX_SEED)
    worker_counts = [
        check_integer("--workers", w, low=1, high=MAX_SIM_WORKERS) for w in _ints(workers, "--workers")
    ]
    if synthetic:
        per_step = max(prompts, (groups_per_worker or 0) * max(worker_counts)) * group_size
        if per_step * (steps or 10) > MAX_SIM_SAMPLES:
            raise UserError(
                f"the synthetic workload would hold {per_step * (steps or 10):,} samples; at most "
                f"{MAX_SIM_SAMPLES:,} (fewer --steps, --prompts, --group-size or --groups-per-worker)"
            )
    if lengths is not None:  # any framework's length log: the same job as `rlbench import lengths`
        from rlbench.integrations.imports import ImportConfig, import_lengths

        if trace is not None or synthetic:
            raise UserError("give one of --lengths FILE, --trace FILE or --synthetic")
        cfg = ImportConfig(out, capacity, tuple(worker_counts), gpu, model_size)
        doc = import_lengths(lengths, cfg)
        typer.echo(f"bubble {doc['summary']['bubble_ratio']:.1%} at {doc['run']['slots_per_worker']} slots")
        for r in doc["whatif"]["results"]:
            typer.echo(f"W={r['workers']:>5} {r['mode']:<16} speed-up {r['speedup']:.2f}x  predicted bubble "
                       f"{r['bubble_ratio']:.1%}")  # fmt: skip
        typer.echo(f"report: {out / 'report.html'}")
        return
    with claim(out, "simulate", accepts=("simulate",)):  # one writer, into a simulation or a new folder
        if validate is not None:
            from rlbench.simulate.replay import validate as run_validation

            doc = run_validation(validate)
            write_json(out / "validation.json", doc)
            typer.echo(json.dumps({k: doc[k] for k in ("measured_bubble", "simulated_bubble")}))
            typer.echo(f"validation: {out / 'validation.json'}")
            return
        from reference_trainer.mode_options import parse_option_pairs
        from rlbench.report.simulate_report import render
        from rlbench.simulate import simulate as run_sim
        from rlbench.simulate import workload
        from rlbench.simulate.cost import calibrate as fit
        from rlbench.simulate.cost import preset
        from rlbench.simulate.modes import parse_sim_modes
        from rlbench.simulate.replay import read_events

        names = [m.strip() for m in (modes or _all_modes()).split(",") if m.strip()]
        options = parse_option_pairs(mode_option or [])
        parse_sim_modes(names, options)  # a bad name or option fails before the workload is built
        if (trace is None) == (not synthetic):
            raise UserError("give exactly one of --trace FILE or --synthetic")
        if calibrate is not None:
            events = read_events(calibrate)
            cost = fit(events, source=str(calibrate))
            caps = [int(e.get("capacity", 0)) for e in events if e.get("kind") in (PREFILL, DECODE)]
            capacity = capacity or max(caps, default=256)
        else:
            cost = preset(gpu, model_size)
        if synthetic:
            lt = workload.synthetic(
                steps=steps or 10,
                prompts=max(prompts, (groups_per_worker or 0) * max(worker_counts)),
                group_size=group_size,
                mean_tokens=mean_tokens,
                sigma=sigma,
                max_tokens=max_tokens,
                rank_corr=rank_corr,
                overlap=overlap,
                seed=seed,
            )
        else:
            lt = workload.load(trace)  # type: ignore[arg-type]
        doc = run_sim(
            lt,
            cost,
            worker_counts,
            names,
            capacity or 256,
            steps=steps,
            groups_per_worker=groups_per_worker,
            mode_options=options,
            acceptance=acceptance,
            rank_corr=rank_corr,
            max_prefill_tokens=max_prefill_tokens,
            seed=seed,
        )
        write_json(out / "simulate.json", doc)
        page = render(doc, out)
        for r in doc["results"]:
            typer.echo(
                f"W={r['workers']:>5} {r['policy']:<16} speed-up {r['speedup']:.2f}x  "
                f"bubble {r['bubble_ratio']:.1%}  idle {r['worker_idle_share']:.1%}  "
                f"step {r['step_time_s']:.1f}s"
            )
        typer.echo(f"simulated in {doc['elapsed_s']:.1f} s: {out / 'simulate.json'}, {page}")
