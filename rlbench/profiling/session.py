"""A profiling session around the reference trainer: NVML timeline, optional py-spy, metrics and report.

`run_profile` is what `rlbench profile` (without a command) calls. The trainer is invoked at exactly one
place, through the `train_fn` hook:

    train_fn(config, out_dir, trace=session.trace)

`trace` is a `reference_trainer.engine.trace.Trace` whose clock the NVML sampler shares; the trainer writes
its engine, phase and sequence events into it (and may stream them with `trace.flush_to(out/"trace.jsonl")`).
At exit the session flushes what is left to `trace.jsonl`, writes `metrics.json`
(`{"run", "summary", "steps", "gpu", "pyspy"}`) and renders `report.html`, also when training failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def default_train_fn() -> Callable[..., Any]:
    """The reference trainer with its progress display (`rlbench.training.run_training`)."""
    from rlbench.training import run_training

    return run_training


class ProfileSession:
    """Context manager: Trace + NVML sampler (+ py-spy on this process); results written on exit."""

    def __init__(
        self,
        out: str | Path,
        run: dict[str, Any] | None = None,
        py_spy: bool = False,
        sample_interval_s: float = 0.1,
        nvml: Any = None,
    ) -> None:
        self.out = Path(out)
        self.run = dict(run or {})
        self.py_spy = py_spy
        self.sample_interval_s = sample_interval_s
        self._nvml = nvml
        self.trace_path = self.out / "trace.jsonl"
        self.doc: dict[str, Any] | None = None
        self.report: Path | None = None

    def __enter__(self) -> ProfileSession:
        from reference_trainer.engine.trace import Trace
        from rlbench.profiling.nvml import NvmlSampler
        from rlbench.profiling.pyspy import PySpyRecorder

        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("trace.jsonl", "metrics.json", "report.html"):  # Trace.flush_to appends: start clean
            (self.out / name).unlink(missing_ok=True)
        self.trace = Trace()
        self.sampler = NvmlSampler(
            now=self.trace.now, interval_s=self.sample_interval_s, nvml=self._nvml
        ).start()
        self.pyspy = PySpyRecorder(self.out, pid=os.getpid()) if self.py_spy else None
        if self.pyspy is not None:
            self.pyspy.start()
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        from rlbench import metrics
        from rlbench.records import read_jsonl, write_json
        from rlbench.report.profile_report import render_profile

        wall = time.perf_counter() - self._wall0
        pyspy = self.pyspy.stop() if self.pyspy is not None else None
        gpu = self.sampler.stop()
        self.trace.flush_to(self.trace_path)
        events = read_jsonl(self.trace_path) if self.trace_path.exists() else []
        doc = metrics.compute(events, gpu)
        status = "ok" if exc_type is None else f"failed: {exc_type.__name__}: {exc}"
        self.doc = {
            "run": {**self.run, "status": status, "wall_time_s": wall},
            **doc,
            "gpu": gpu,
            "pyspy": pyspy,
        }
        write_json(self.out / "metrics.json", self.doc)
        self.report = render_profile(self.out, self.doc, events)
        # never swallow the trainer's exception: the caller decides how to report it


def run_profile(
    config: Any,
    out: str | Path,
    py_spy: bool = False,
    train_fn: Callable[..., Any] | None = None,
    sample_interval_s: float = 0.1,
) -> dict[str, Any]:
    """Profile the reference trainer run that `config` (a TrainConfig) describes; returns the metrics doc."""
    train = train_fn or default_train_fn()
    run = {"mode": config.mode, "task": config.task, "steps": config.steps, "seed": config.seed}
    with ProfileSession(out, run, py_spy=py_spy, sample_interval_s=sample_interval_s) as session:
        # TRAINER HOOK: the single place the trainer runs.
        train(config, Path(out), trace=session.trace)
    assert session.doc is not None
    return session.doc
