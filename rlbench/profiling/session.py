"""A profiling session around the reference trainer: NVML timeline, optional py-spy, metrics and report.

`run_profile` is what `rlbench profile` (without a command) calls. The trainer is invoked at exactly one
place, through the `train_fn` hook:

    train_fn(config, out_dir, trace=session.trace)

`trace` is a `reference_trainer.trace.writer.Trace` whose clock the NVML sampler shares; the trainer writes
its engine, phase and sequence events into it (and may stream them with `trace.flush_to(out/"trace.jsonl")`).
At exit the session flushes what is left to `trace.jsonl`, writes `metrics.json`
(`{"run", "summary", "steps", "gpu", "pyspy"}`, and `"gpu_replay"` given one: the run's schedule replayed
through a GPU calibration, a model) and renders `report.html`, also when training failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reference_trainer.model.embedded import default_model_dir
from reference_trainer.trace import metrics
from reference_trainer.trace.records import make_dir, write_json
from reference_trainer.trace.schema import read_trace
from reference_trainer.trace.writer import Trace
from rlbench.observe.nvml import NvmlSampler
from rlbench.profiling.pyspy import PySpyRecorder
from rlbench.report.profile_report import render_profile
from rlbench.rundirs import check_new_run, claim
from rlbench.simulate.gpu_replay import GpuReplay
from rlbench.training import run_training


class ProfileSession:
    """Context manager: Trace + NVML sampler (+ py-spy on this process); results written on exit."""

    def __init__(
        self,
        out: str | Path,
        run: dict[str, Any] | None = None,
        py_spy: bool = False,
        sample_interval_s: float = 0.1,
        nvml: Any = None,
        gpu_replay: GpuReplay | None = None,
    ) -> None:
        self.out = Path(out)
        self.gpu_replay = gpu_replay
        self.run = dict(run or {})
        self.py_spy = py_spy
        self.sample_interval_s = sample_interval_s
        self._nvml = nvml
        self.trace_path = self.out / "trace.jsonl"
        self.doc: dict[str, Any] | None = None
        self.report: Path | None = None

    def __enter__(self) -> ProfileSession:
        make_dir(self.out)
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
        self._running_s: float | None = None
        self._spans: list[tuple[float, float]] = []  # this session's own turns, on the trace's clock
        return self

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count a block as this session's run time. Sessions whose trainers take steps in turn (`compare`)
        each count only their own steps; a session that never uses it counts its whole life."""
        start, t0 = time.perf_counter(), self.trace.now()
        try:
            yield
        finally:
            self._running_s = (self._running_s or 0.0) + time.perf_counter() - start
            self._spans.append((t0, self.trace.now()))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        wall = time.perf_counter() - self._wall0 if self._running_s is None else self._running_s
        pyspy = self.pyspy.stop() if self.pyspy is not None else None
        gpu = self.sampler.stop()
        self.trace.flush_to(self.trace_path)
        events = read_trace(self.trace_path) if self.trace_path.exists() else []
        doc = metrics.compute(events, gpu)
        status = "ok" if exc_type is None else f"failed: {exc_type.__name__}: {exc}"
        self.doc = {"run": {**self.run, "status": status, "wall_time_s": wall}, **doc}
        self.doc |= {"gpu": gpu, "pyspy": pyspy}
        if self.gpu_replay is not None:
            self.doc["gpu_replay"] = self.gpu_replay.run_doc(events)
        write_json(self.out / "metrics.json", self.doc)
        # Sessions taking turns (compare) draw their timeline on their own clock: the other sessions' turns
        # are cut out instead of showing as idle gaps. trace.jsonl and metrics.json keep the true clock.
        page_doc, page_events = (
            own_clock(self.doc, events, self._spans) if self._spans else (self.doc, events)
        )
        self.report = render_profile(self.out, page_doc, page_events)
        # never swallow the trainer's exception: the caller decides how to report it


def own_clock(
    doc: dict[str, Any], events: list[dict[str, Any]], spans: list[tuple[float, float]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Copies of a session's doc and events with every time moved onto the session's own clock: the time
    between its turns (`spans`, sorted) removed. NVML samples outside its turns are left out."""
    gaps = [(end, start - end) for (_, end), (start, _) in zip(spans, spans[1:], strict=False) if start > end]

    def shift(t: float) -> float:
        return t - sum(length for at, length in gaps if t >= at + length)

    def inside(t: float) -> bool:
        return any(a <= t <= b for a, b in spans)

    moved = [
        {**e, **{k: shift(float(e[k])) for k in ("t_start", "t_end") if e.get(k) is not None}} for e in events
    ]
    gpu = doc.get("gpu") or {}
    if gpu.get("samples"):
        samples = [{**x, "t": shift(float(x["t"]))} for x in gpu["samples"] if inside(float(x["t"]))]
        doc = {**doc, "gpu": {**gpu, "samples": samples}}
    return doc, moved


def run_profile(
    config: Any,
    out: str | Path,
    py_spy: bool = False,
    train_fn: Callable[..., Any] | None = None,
    sample_interval_s: float = 0.1,
    overwrite: bool = False,
    calibration: str | Path | None = None,
) -> dict[str, Any]:
    """Profile the reference trainer run that `config` (a TrainConfig) describes; returns the metrics doc,
    with the run replayed through the GPU calibration for its model (`calibration`: a file or a folder
    searched first). The process is the only writer of `out` meanwhile (locks.run_lock); a trainer run there
    is refused unless `overwrite` (a profile is not resumed: its trace is on one process's clock).
    `train_fn` stands in for the trainer (`rlbench.training.run_training`, looked up at the call)."""
    train = train_fn or run_training
    run = {"mode": config.mode, "task": config.task, "steps": config.steps, "seed": config.seed}
    replay = GpuReplay.for_model(config.model or default_model_dir(), calibration)
    with claim(out, "profile", accepts=("train", "profile")):
        check_new_run(out, "train", overwrite)
        with ProfileSession(
            out, run, py_spy=py_spy, sample_interval_s=sample_interval_s, gpu_replay=replay
        ) as session:
            # TRAINER HOOK: the single place the trainer runs.
            train(config, Path(out), trace=session.trace)
    assert session.doc is not None
    return session.doc
