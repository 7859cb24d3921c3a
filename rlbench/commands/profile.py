"""`rlbench profile`: profile the reference trainer in a mode, or wrap any training command after `--`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import (
    IdleGap,
    Mode,
    OutDir,
    RequestLog,
    RunOptions,
    ServerCapacity,
    SimGpu,
    SimModelSize,
    Steps,
    with_run_options,
)


def register(app: typer.Typer) -> None:
    @app.command("profile")
    @with_run_options
    def profile(
        cmd: Annotated[
            list[str] | None,
            typer.Argument(
                help="A command to profile instead of the reference trainer, after `--`.", show_default=False
            ),
        ] = None,
        *,
        mode: Mode = "baseline",
        steps: Steps = 8,
        run: RunOptions,
        out: OutDir = Path("runs/profile"),
        py_spy: Annotated[
            bool, typer.Option("--py-spy/--no-py-spy", help="Also record a py-spy profile.")
        ] = False,
        sample_hz: Annotated[
            float, typer.Option("--sample-hz", min=0.1, help="NVML samples per second.")
        ] = 10.0,
        engine_metrics: Annotated[
            str | None,
            typer.Option(
                "--engine-metrics",
                help="With a command after --: its rollout servers' Prometheus endpoints (vLLM, SGLang), "
                "comma-separated, sampled on the NVML clock for the bubble ratio and the rest.",
            ),
        ] = None,
        capacity: ServerCapacity = None,
        idle_gap: IdleGap = None,
        request_log: RequestLog = None,
        gpu: SimGpu = "h100",
        model_size: SimModelSize = "7b",
    ) -> None:
        """Profile a run: rollout bubbles, throughput, GPU timeline (NVML), CPU hot spots (py-spy).

        Examples: `rlbench profile --mode sorted --steps 4 --out runs/sorted`;
        `rlbench profile --py-spy --out runs/ext -- python train.py --lr 1e-6`;
        `rlbench profile --engine-metrics 127.0.0.1:8000 --capacity 256 -- python train_grpo.py`.
        """
        from rlbench.errors import UserError

        if engine_metrics and not cmd:
            raise UserError("--engine-metrics observes the servers of a command given after --")
        if cmd:
            from rlbench.profiling.wrap import wrap_command

            observe = None
            if engine_metrics:
                from rlbench.observe.session import ObserveOptions

                observe = ObserveOptions.from_cli(
                    engine_metrics, capacity, request_log, interval_s=1.0 / sample_hz, idle_gap_s=idle_gap,
                    gpu=gpu, model_size=model_size,
                )  # fmt: skip
            say = lambda line: typer.echo(line, err=True)  # noqa: E731
            code, doc = wrap_command(cmd, out, py_spy=py_spy, sample_interval_s=1.0 / sample_hz,
                                     observe=observe, say=say)  # fmt: skip
            if observe is not None:
                from rlbench.commands.observe import summary_lines

                for line in summary_lines(doc):
                    typer.echo(line)
            s = doc["summary"]
            idle = "n/a" if s["gpu_idle_share"] is None else f"{100 * s['gpu_idle_share']:.1f}%"
            why = f" ({s['gpu_note']})" if s["gpu_note"] else ""
            typer.echo(f"wall {s['wall_time_s']:.2f} s, GPU idle {idle}{why}")
            typer.echo(f"report: {out / 'report.html'}")
            if code != 0:
                typer.echo(f"command exited with {code}", err=True)
                # sys.exit, not typer.Exit: the app runs with standalone_mode=False, which returns Exit codes
                sys.exit(code if 0 < code < 256 else 1)
            return
        from rlbench.profiling.session import run_profile
        from rlbench.training import build_config

        config = build_config(**run.config_kwargs(mode=mode, steps=steps))
        doc = run_profile(config, out, py_spy=py_spy, sample_interval_s=1.0 / sample_hz)
        s = doc["summary"]
        br = "n/a" if s.get("bubble_ratio") is None else f"{100 * s['bubble_ratio']:.1f}%"
        typer.echo(f"bubble ratio {br}, rollout {s.get('rollout_tokens_per_s') or 0:.1f} tok/s")
        typer.echo(f"report: {out / 'report.html'}")
