"""`rlbench profile`: profile the reference trainer in a mode, or wrap any training command after `--`."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from rlbench.options import (
    GpuCalibration,
    Mode,
    OutDir,
    RunOptions,
    ServerOptions,
    Steps,
    echo,
    with_options,
    with_run_options,
)

EngineMetrics = Annotated[
    str | None,
    typer.Option(
        "--engine-metrics",
        help="With a command after --: its rollout servers' Prometheus endpoints (vLLM, SGLang), "
        "comma-separated, sampled on the NVML clock for the bubble ratio and the rest.",
    ),
]


@with_run_options
@with_options(ServerOptions, "servers")
def profile_command(
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
    sample_hz: Annotated[float, typer.Option("--sample-hz", min=0.1, help="NVML samples per second.")] = 10.0,
    engine_metrics: EngineMetrics = None,
    servers: ServerOptions,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a run already in --out (its checkpoints too).")
    ] = False,
    calibration: GpuCalibration = None,
) -> None:
    """Profile a run: rollout bubbles, throughput, GPU timeline (NVML), CPU hot spots (py-spy), and the
    run's schedule replayed through a GPU calibration (a model).

    Examples: `rlbench profile --mode sorted --steps 4 --out runs/sorted`;
    `rlbench profile --py-spy --out runs/ext -- python train.py --lr 1e-6`;
    `rlbench profile --engine-metrics 127.0.0.1:8000 --capacity 256 -- python train_grpo.py`.
    """
    from reference_trainer.errors import UserError, check_number

    if engine_metrics and not cmd:
        raise UserError("--engine-metrics observes the servers of a command given after --")
    check_number("--sample-hz", sample_hz, low=0.1, high=100.0)  # every 10 s .. every 10 ms
    if servers.idle_gap is not None:
        check_number("--idle-gap", servers.idle_gap, low=0.0, high=1e6)
    if cmd:
        from rlbench.profiling.wrap import WrapConfig

        cfg = WrapConfig.from_cli(cmd, out, py_spy=py_spy, sample_hz=sample_hz, engine_metrics=engine_metrics,
                                  overwrite=overwrite, **asdict(servers))  # fmt: skip
        _profile_wrapped(cfg)
        return
    from rlbench.rundirs import check_new_run
    from rlbench.training import build_config

    config = build_config(**run.config_kwargs(mode=mode, steps=steps))
    check_new_run(out, "train", overwrite)  # before anything loads; run_profile checks again under the lock
    _profile_trainer(config, out, py_spy, 1.0 / sample_hz, overwrite, calibration)


def _profile_wrapped(cfg: Any) -> None:
    """Run and profile the command after `--`; its exit code is the command's."""
    from reference_trainer.errors import printable
    from rlbench.profiling.wrap import wrap_command

    code, doc = wrap_command(cfg, say=lambda line: echo(printable(line), err=True))
    for line in wrap_lines(doc):  # the servers' pages' text among them
        echo(printable(line))
    echo(f"report: {cfg.out / 'report.html'}")
    if code != 0:
        echo(f"command exited with {code}", err=True)
        # sys.exit, not typer.Exit: the app runs with standalone_mode=False, which returns Exit codes
        sys.exit(code if 0 < code < 256 else 1)


def _profile_trainer(
    config: Any, out: Path, py_spy: bool, interval_s: float, overwrite: bool, calibration: Path | None
) -> None:
    """Profile the reference trainer's run of `config` and print its summary."""
    from reference_trainer.errors import Interrupted
    from reference_trainer.trace.records import read_json
    from rlbench.profiling.session import run_profile
    from rlbench.report.ledger_legend import cost_lines
    from rlbench.report.replay_summary import run_lines

    try:
        doc = run_profile(config, out, py_spy=py_spy, sample_interval_s=interval_s, overwrite=overwrite,
                          calibration=calibration)  # fmt: skip
    except KeyboardInterrupt:
        said = f"interrupted: {out / 'report.html'} profiles the finished steps; --overwrite starts again"
        raise Interrupted(said) from None
    for line in [*bubble_lines(doc["summary"]), *cost_lines(doc["summary"]), *run_lines(doc["gpu_replay"])]:
        echo(line)
    heldout = out / "heldout.json"
    echo(heldout_line(read_json(heldout) if heldout.is_file() else None))
    echo(f"report: {out / 'report.html'}")


def wrap_lines(doc: dict[str, Any]) -> list[str]:
    """What a profiled command's run prints: its servers' summary where they were observed, then the wall
    time and the GPU's idle share."""
    from rlbench.commands.observe import summary_lines

    s = doc["summary"]
    idle = "n/a" if s["gpu_idle_share"] is None else f"{100 * s['gpu_idle_share']:.1f}%"
    why = f" ({s['gpu_note']})" if s["gpu_note"] else ""
    observed = summary_lines(doc) if "engine_metrics" in doc else []
    return [*observed, f"wall {s['wall_time_s']:.2f} s, GPU idle {idle}{why}"]


def heldout_line(heldout: dict[str, Any] | None) -> str:
    """The trained policy's final held-out accuracy (heldout.json's last evaluation), beside the first, so
    the speed figures above are read with what the run learnt."""
    curve = (heldout or {}).get("curve") or []
    if not curve:
        return "held-out accuracy: n/a (the run made no held-out evaluation)"
    first, last = curve[0], curve[-1]
    return (
        f"held-out greedy accuracy after step {last['step']}: {last['greedy_acc']:.3f} "
        f"(pass@1 {last['pass1']:.3f}; step {first['step']}: {first['greedy_acc']:.3f}; "
        f"{heldout['problems']} problems)"  # type: ignore[index]
    )


def bubble_lines(s: dict[str, Any]) -> list[str]:
    """The summary line: the slot bubble, and on a GPU the device's idle share during rollout beside it,
    with a note when the GPU idles far more than the slots do (then the engine is the bubble)."""
    slots, gpu = s.get("bubble_ratio"), s.get("bubble_ratio_gpu")
    line = f"bubble ratio {'n/a' if slots is None else f'{100 * slots:.1f}%'} (slots)"
    if gpu is not None:
        line += f", GPU idle {100 * gpu:.1f}% of rollout (NVML)"
    lines = [f"{line}, rollout {s.get('rollout_tokens_per_s') or 0:.1f} tok/s"]
    if gpu is not None and slots is not None and gpu - slots > ENGINE_BUBBLE:
        lines.append(
            "note: the GPU idles far more than the slots do: the engine itself (kernel launches, host syncs) "
            "is the bubble, not the rollout schedule"
        )
    return lines


# GPU idle share above the slot bubble by more than this: the device waits on the engine's host side.
ENGINE_BUBBLE = 0.3
