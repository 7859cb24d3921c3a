"""Profile another framework's training command: wall time, NVML timeline, optional py-spy, one report.

The command runs as our child with the terminal inherited (its logs stay visible). There is no rlbench trace
for it, so the report carries run-level numbers only: wall time, exit code and the GPU idle share
(1 - mean NVML utilisation over the command's lifetime, all GPUs; null with "no GPU: ..." without NVML).
With `observe` (`--engine-metrics URL,...`) its rollout servers are sampled on the same clock, and the
trace derived from them (rlbench.observe) gives the run the per-phase metrics of a reference-trainer profile.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import write_json
from rlbench.observe.nvml import NvmlSampler, mean_util, no_gpu_note
from rlbench.profiling.observe import ObserveOptions, check_new_observation, finish, start_sampler
from rlbench.profiling.pyspy import PySpyRecorder
from rlbench.report.profile_report import render_profile
from rlbench.rundirs import claim


@dataclass
class WrapConfig:
    """`rlbench profile -- CMD` as one checked config: the command, where its profile goes, how often NVML is
    sampled, and (`--engine-metrics`) the rollout servers observed beside it."""

    cmd: list[str]
    out: Path
    py_spy: bool = False
    sample_interval_s: float = 0.1
    observe: ObserveOptions | None = None
    overwrite: bool = False

    @classmethod
    def from_cli(
        cls,
        cmd: Sequence[str],
        out: Path,
        *,
        py_spy: bool,
        sample_hz: float,
        engine_metrics: str | None,
        capacity: str | None,
        idle_gap: float | None,
        request_log: Path | None,
        gpu: str,
        model_size: str,
        overwrite: bool,
    ) -> WrapConfig:
        """`rlbench profile`'s options, parsed and checked (the servers' URLs and capacities among them)."""
        interval = 1.0 / sample_hz
        observe = None
        if engine_metrics:
            observe = ObserveOptions.from_cli(
                engine_metrics, capacity, request_log, interval_s=interval, idle_gap_s=idle_gap, gpu=gpu,
                model_size=model_size,
            )  # fmt: skip
        return cls(list(cmd), Path(out), py_spy, interval, observe, overwrite).check()

    def check(self) -> WrapConfig:
        if not self.cmd:
            raise UserError("no command given after --")
        return self


def wrap_command(cfg: WrapConfig, say: Any = print, nvml: Any = None) -> tuple[int, dict[str, Any]]:
    """Run the command, write out/metrics.json and out/report.html (with its servers observed, their trace
    too); return (exit code, metrics document)."""
    with claim(cfg.out, "profile", accepts=("profile", "observe")):  # one writer, into a profile or a new one
        if cfg.observe is not None:
            check_new_observation(cfg.out, cfg.overwrite)
        return _wrap(cfg.cmd, cfg.out, cfg.py_spy, cfg.sample_interval_s, nvml, cfg.observe, say)


def _wait(child: subprocess.Popen[bytes]) -> tuple[int, bool]:
    """The command's exit code, and whether Ctrl-C stopped it: forwarded to the command, whose report is
    still written for what ran."""
    try:
        return child.wait(), False
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        try:
            return child.wait(timeout=30), True
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait(), True


def _wrap(
    cmd: Sequence[str], out: Path, py_spy: bool, sample_interval_s: float, nvml: Any, observe: Any, say: Any
) -> tuple[int, dict[str, Any]]:
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    sampler = NvmlSampler(now=now, interval_s=sample_interval_s, nvml=nvml).start()
    servers = None
    if observe is not None:
        servers = start_sampler(observe, out, now, say)
    t_start = now()
    try:
        child = subprocess.Popen(list(cmd))
    except OSError as err:  # not found, not executable
        sampler.stop()
        if servers is not None:
            servers.stop()
        raise UserError(f"cannot run {cmd[0]!r}: {err.strerror or err}") from err
    rec = PySpyRecorder(out, pid=child.pid, subprocesses=True) if py_spy else None
    if rec is not None:
        rec.start()
    code, interrupted = _wait(child)
    t_end = now()
    server_rows = servers.stop() if servers is not None else None
    pyspy = rec.stop() if rec is not None else None
    gpu = sampler.stop()
    util = mean_util(gpu, t_start, t_end)
    summary = {
        "wall_time_s": t_end - t_start,
        "exit_code": code,
        "mean_gpu_util": util,
        "gpu_idle_share": None if util is None else 1.0 - util / 100.0,
        "gpu_note": None if util is not None else no_gpu_note(gpu),
    }
    run = {"kind": "wrap", "command": list(cmd), "status": "interrupted" if interrupted else "finished"}
    doc = {"run": run, "summary": summary, "steps": [], "gpu": gpu, "pyspy": pyspy}
    if servers is not None:
        doc = finish(out, server_rows or [], observe, doc, servers.notes, say)
    else:
        write_json(out / "metrics.json", doc)
        render_profile(out, doc, [])
    if interrupted:
        raise KeyboardInterrupt
    return code, doc
