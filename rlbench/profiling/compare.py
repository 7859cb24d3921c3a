"""`rlbench compare` below the command: several modes, each in a profile session of its own, run interleaved
(`rlbench.training.run_modes`), then compare.json (the bubble, the step time in parts, the ratios and their
spread per round, a load-drift check, the modes' schedules replayed through a GPU calibration) and the
side-by-side page."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from reference_trainer.errors import Interrupted
from reference_trainer.model.embedded import default_model_dir
from reference_trainer.model.embedded import label as embedded_label
from reference_trainer.model.loader import resolve_threads
from reference_trainer.trace.compare import reached, time_to_target
from reference_trainer.trace.records import write_json
from reference_trainer.trace.schema import read_trace
from reference_trainer.train.config import TrainConfig
from rlbench.profiling.session import ProfileSession
from rlbench.report.compare_report import render_compare
from rlbench.report.compare_summary import compare_doc
from rlbench.rundirs import check_new_comparison, check_new_run, claim
from rlbench.simulate.gpu_replay import GpuReplay
from rlbench.training import run_modes


def run_compare(
    configs: dict[str, TrainConfig],
    out: Path,
    overwrite: bool = False,
    say: Callable[[str], None] = print,
    target_accuracy: float | None = None,
    calibration: str | Path | None = None,
) -> dict[str, Any]:
    """Run every config's mode for its steps, one step of each in turn (a change in machine load hits every
    mode alike), each in OUT/<mode>; write OUT/compare.json and OUT/report.html; return the compare doc.
    With `target_accuracy`, a mode stops once its held-out greedy accuracy reaches it (the steps are the
    budget), and the doc says what each spent to get there. The modes' schedules are replayed through the GPU
    calibration for their model (`calibration`: a file, or a folder searched first). One writer: a second
    compare (or a profile of one of its modes) on `out` is refused."""
    first = next(iter(configs.values()))
    replay = GpuReplay.for_model(first.model or default_model_dir(), calibration)
    with ExitStack() as stack:
        _claim(stack, out, list(configs), overwrite)
        sessions = {
            m: stack.enter_context(
                ProfileSession(
                    out / m,
                    run={"mode": m, "task": c.task, "steps": c.steps, "seed": c.seed},
                    gpu_replay=replay,
                )
            )
            for m, c in configs.items()
        }
        try:
            rows = run_modes(
                configs,
                {m: out / m for m in configs},
                first.steps,
                say=say,
                around={m: s.running for m, s in sessions.items()},
                traces={m: s.trace for m, s in sessions.items()},
                until=None if target_accuracy is None else lambda mode, row: reached(row, target_accuracy),
            )
            interrupted = False
        except KeyboardInterrupt:  # Ctrl-C: the sessions keep what finished, and the report shows it
            rows, interrupted = {m: [] for m in configs}, True
    doc = _compare_doc(sessions, replay, configs)
    if interrupted:
        doc["interrupted"] = True
        write_json(out / "compare.json", doc)
        render_compare(out, doc)
        done = ", ".join(f"{m} {len(s.doc['steps'])}" for m, s in sessions.items())
        raise Interrupted(
            f"interrupted: {out / 'report.html'} shows the steps that finished ({done}); "
            "pass --overwrite to run the comparison again"
        )
    if target_accuracy is not None:
        spent = {m: time_to_target(r, target_accuracy) for m, r in rows.items()}
        doc["time_to_accuracy"] = {"target": target_accuracy, "budget_steps": first.steps, "modes": spent}
    write_json(out / "compare.json", doc)
    render_compare(out, doc)
    return doc


def _claim(stack: ExitStack, out: Path, modes: list[str], overwrite: bool) -> None:
    """One writer, and never over another command's run or, without --overwrite, a finished comparison:
    all refused before any mode runs."""
    stack.enter_context(claim(out, "compare", accepts=("compare",)))
    check_new_comparison(out, modes, overwrite)
    for mode in modes:
        stack.enter_context(claim(out / mode, "compare", accepts=("train", "profile")))
        check_new_run(out / mode, "train", overwrite)


def _compare_doc(
    sessions: dict[str, Any], replay: GpuReplay, configs: dict[str, TrainConfig]
) -> dict[str, Any]:
    """The comparison of the modes' profiled runs, against baseline (else the first mode), with their
    schedules replayed through the GPU calibration."""
    runs = [
        {"mode": m, "summary": s.doc["summary"], "steps": s.doc["steps"], "ledger": s.doc.get("ledger")}
        for m, s in sessions.items()
    ]
    baseline = "baseline" if "baseline" in configs else next(iter(configs))
    doc = compare_doc(runs, baseline, workload(next(iter(configs.values()))))
    traces = {m: read_trace(s.trace_path) if s.trace_path.exists() else [] for m, s in sessions.items()}
    doc["gpu_replay"] = replay.comparison(traces, baseline)
    return doc


def workload(config: TrainConfig) -> dict[str, Any]:
    """The settings the comparison's page shows, in this order (the subtitle)."""
    keys = ("task", "steps", "seed", "model", "engine", "workers", "prompts_per_step", "group_size")
    shown = {k: getattr(config, k) for k in keys}
    shown["model"] = config.model or embedded_label()  # in its place among the keys
    return {**shown, "max_tokens": config.response_tokens, "threads": resolve_threads(config.threads)}
