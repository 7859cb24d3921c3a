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
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import write_json
from rlbench.observe.nvml import NvmlSampler, mean_util, no_gpu_note
from rlbench.profiling.observe import check_new_observation, finish, start_sampler
from rlbench.profiling.pyspy import PySpyRecorder
from rlbench.report.profile_report import render_profile
from rlbench.rundirs import claim


def wrap_command(
    cmd: Sequence[str],
    out: str | Path,
    py_spy: bool = False,
    sample_interval_s: float = 0.1,
    nvml: Any = None,
    observe: Any = None,
    say: Any = print,
    overwrite: bool = False,
) -> tuple[int, dict[str, Any]]:
    """Run `cmd`, write out/metrics.json and out/report.html; return (exit code, metrics document)."""
    if not cmd:
        raise UserError("no command given after --")
    with claim(out, "profile", accepts=("profile", "observe")):  # one writer, into a profile or a new folder
        if observe is not None:
            check_new_observation(Path(out), overwrite)
        return _wrap(cmd, Path(out), py_spy, sample_interval_s, nvml, observe, say)


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
    interrupted = False
    try:
        code = child.wait()
    except KeyboardInterrupt:
        # forward Ctrl-C and still write the report for what ran
        interrupted = True
        child.send_signal(signal.SIGINT)
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
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
    doc = {
        "run": {"kind": "wrap", "command": list(cmd), "status": "interrupted" if interrupted else "finished"},
        "summary": summary,
        "steps": [],
        "gpu": gpu,
        "pyspy": pyspy,
    }
    if servers is not None:
        doc = finish(out, server_rows or [], observe, doc, servers.notes, say)
    else:
        write_json(out / "metrics.json", doc)
        render_profile(out, doc, [])
    if interrupted:
        raise KeyboardInterrupt
    return code, doc
