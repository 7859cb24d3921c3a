"""`rlbench observe URL...`: the bubbles of running vLLM/SGLang servers, from their Prometheus metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import OutDir, ServerOptions, echo, with_options


def summary_lines(doc: dict) -> list[str]:
    """One line per server and one overall: what `observe` and `profile --engine-metrics` print."""

    from rlbench.report.figures import pct

    lines = []
    for label, s in doc["engine_metrics"]["servers"].items():
        tps = s["rollout_tokens_per_s"]
        lines.append(
            f"{label}: {s['phases']} rollout phase(s), bubble {pct(s['bubble_ratio'])}, tail share "
            f"{pct(s['tail_time_share'])}, {'n/a' if tps is None else f'{tps:.0f}'} tok/s, "
            f"{s['finished_requests']} requests, waiting max {s['waiting_max']:.0f}"
        )
    return lines


@with_options(ServerOptions, "servers")
def observe_command(
    urls: Annotated[
        list[str] | None,
        typer.Argument(
            help="Prometheus endpoints of the rollout servers (host:port or URL).", show_default=False
        ),
    ] = None,
    duration: Annotated[float, typer.Option("--duration", min=0.1, help="Seconds to observe.")] = 60.0,
    interval: Annotated[float, typer.Option("--interval", min=0.01, help="Seconds between scrapes.")] = 0.1,
    *,
    servers: ServerOptions,
    from_samples: Annotated[
        Path | None,
        typer.Option("--from-samples", help="Rebuild a run directory from its samples.jsonl instead."),
    ] = None,
    out: OutDir = Path("runs/observe"),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an observation already in --out (its samples too).")
    ] = False,
) -> None:
    """Sample running vLLM/SGLang servers' metrics: slot occupancy, bubble ratio, tail share, tokens/s,
    queueing, and what SortedRL/RhymeRL would buy on their request lengths.

    Example: `rlbench observe 127.0.0.1:8000 --duration 120 --capacity 256 --out runs/vllm`.
    """
    from reference_trainer.errors import UserError, check_number, printable
    from rlbench.profiling.observe import ObserveOptions, check_new_observation, samples_to_rebuild
    from rlbench.profiling.observe import from_samples as rebuild
    from rlbench.profiling.observe import observe as run
    from rlbench.rundirs import claim

    if from_samples is None and not urls:
        raise UserError("give the servers' metrics URLs (e.g. 127.0.0.1:8000), or --from-samples DIR")
    check_number("--duration", duration, low=0.1, high=1e7)  # 1e7 s: four months
    opts = ObserveOptions.from_cli(None if from_samples is not None else ",".join(urls or []),
                                   servers.capacity, servers.request_log, interval_s=interval,
                                   idle_gap_s=servers.idle_gap, gpu=servers.gpu,
                                   model_size=servers.model_size)  # fmt: skip
    if from_samples is not None:
        out = samples_to_rebuild(from_samples).parent
    # One writer, into an observation (or a profile that observed its servers) or a new folder.
    with claim(out, "observe", accepts=("observe",)):
        if from_samples is not None:
            doc = rebuild(opts, out, say=lambda line: echo(printable(line), err=True))
        else:
            check_new_observation(out, overwrite)
            echo(f"observing {len(opts.urls)} server(s) for {duration:g} s, every {interval:g} s")
            doc = run(opts, out, duration, say=lambda line: echo(printable(line), err=True))
    for line in summary_lines(doc):
        echo(printable(line))
    echo(f"report: {out / 'report.html'}")
    if doc["engine_metrics"]["unreadable"] == opts.urls:  # nothing observed: said once per server already
        sys.exit(2)
