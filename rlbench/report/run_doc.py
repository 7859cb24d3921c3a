"""A run's saved documents read and checked for the pages: a profile's metrics.json (`check_profile_doc`,
each summary or step row through `summary_problem`), and a run directory's doc and trace (`load_run`: a
`train` run's computed from its trace as `profile` does). A hand-edited file is one line, not a traceback
deep in a report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_json, read_jsonl
from reference_trainer.trace.schema import read_trace
from rlbench.report.figures import Event
from rlbench.report.replay_summary import replay_problem


def check_profile_doc(doc: Any, source: Any) -> dict[str, Any]:
    """`doc` if it has the shape of a profile's metrics.json (objects where objects go, step rows with their
    step numbers), else a one-line UserError naming `source`."""
    if not isinstance(doc, dict):
        raise UserError(f"{source}: not a profile's metrics (a JSON object)")
    for key in ("run", "summary", "gpu", "pyspy", "engine_metrics"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise UserError(f"{source}: {key} is {type(doc[key]).__name__}, not an object")
    steps = doc.get("steps", [])
    if not isinstance(steps, list) or not all(
        isinstance(s, dict) and type(s.get("step")) is int for s in steps
    ):
        raise UserError(f"{source}: steps is not a list of step rows (objects with an integer step)")
    if "gpu_replay" in doc and (why := replay_problem(doc["gpu_replay"])) is not None:
        raise UserError(f"{source}: {why}")
    for n, row in enumerate([doc.get("summary") or {}, *steps]):
        if (why := summary_problem(row)) is not None:
            raise UserError(f"{source}: {'summary' if n == 0 else f'step row {n}'}: {why}")
    return doc


def summary_problem(summary: dict[str, Any]) -> str | None:
    """What a report would print wrongly from a summary or step row (None: nothing): a share or ratio
    outside 0..1 ("inf%", "4500%"), a time or rate that is negative or not finite ("-5 s")."""
    for key, value in summary.items():
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.endswith(("_ratio", "_share", "_ratio_gpu")) and not (
            math.isfinite(value) and 0 <= value <= 1
        ):
            return f"{key} is {value!r}, not a share between 0 and 1"
        if key.endswith("_s") and not (math.isfinite(value) and value >= 0):
            return f"{key} is {value!r}, not a time or rate >= 0"
    return None


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[Event]]:
    """A run directory's metrics doc and trace events, through reference_trainer.trace.records (a torn last
    line left by a killed run is dropped with a note). A `train` run has no metrics.json: its doc is computed
    from trace.jsonl as `profile` does, each step completed by its metrics.jsonl row (loss, entropy, ...)."""
    trace = run_dir / "trace.jsonl"
    events = read_trace(trace) if trace.is_file() else []
    if (run_dir / "metrics.json").is_file():
        return check_profile_doc(read_json(run_dir / "metrics.json"), run_dir / "metrics.json"), events

    rows_path = run_dir / "metrics.jsonl"
    rows = {r.get("step"): r for r in read_jsonl(rows_path)} if rows_path.is_file() else {}
    doc: dict[str, Any] = dict(metrics.compute(events)) if events else {"summary": {}, "steps": []}
    if not doc["steps"]:
        doc["steps"] = list(rows.values())
    for step in doc["steps"]:
        for key, value in rows.get(step.get("step"), {}).items():
            step.setdefault(key, value)
    config_path = run_dir / "train_config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    doc["run"] = {k: config[k] for k in ("mode", "task", "steps", "seed") if k in config}
    doc["gpu"] = {"available": False, "reason": "a train run records no GPU timeline; use rlbench profile"}
    return doc, events
