"""A run folder from another framework's run: trace.jsonl, lengths.jsonl, metrics.json and report.html.

Every metric is computed by `reference_trainer.trace.metrics` from the trace written here, as for
rlbench's own runs; what the framework logged itself goes beside it under `integration`, never in its place.
The what-if is a replay of the length log through `rlbench simulate`'s engine and cost model
(`rlbench.simulate.whatif`): a prediction, labelled as one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics
from reference_trainer.trace.records import write_json, write_jsonl
from reference_trainer.trace.schema import check_events
from rlbench.integrations import lengthlog
from rlbench.integrations.lengthlog import Group
from rlbench.report.import_report import render_import
from rlbench.rundirs import claim
from rlbench.simulate.whatif import whatif as simulate_whatif

WHATIF_MODES = ("baseline", "sorted", "sorted-partial", "histopipe", "async")  # async: max_staleness 1
WHATIF_WORKERS = (1, 8, 64, 512, 4096)
# Sequences replayed in one step at the largest worker count. A given --workers may ask up to MAX_REPLAYED
# (about a minute of simulation on one CPU core); the default counts stop at AUTO_REPLAYED (a few seconds),
# so a first call on a real run's log (96 groups of 8 at 8,948 tokens) answers at once.
MAX_REPLAYED = 1 << 21
AUTO_REPLAYED = 1 << 15
NO_GPU = (
    "an imported run has no GPU timeline: rlbench profile --engine-metrics samples NVML around a live run"
)


def auto_workers(groups: list[Group]) -> tuple[int, ...]:
    """The default worker counts for this log: those of WHATIF_WORKERS whose one replayed step holds at
    most AUTO_REPLAYED sequences (weak scaling: W times the log's sequences per step), 1 always."""
    per_step = len(lengthlog.to_length_trace(groups, "length log")) / len(lengthlog.by_step(groups))
    return tuple(w for w in WHATIF_WORKERS if w == 1 or w * per_step <= AUTO_REPLAYED)


def whatif(
    groups: list[Group],
    slots: int,
    workers: Sequence[int] | None = None,
    gpu: str = "h100",
    model_size: str = "7b",
    update_s_per_token: float | None = None,
) -> dict[str, Any]:
    """What each mode would buy on these lengths at each worker count: weak scaling, every worker given as
    many groups per step as the log's steps had (so W = 1 is the logged batch on one engine). `workers`
    None: the counts this log's scale allows (auto_workers). Steps past the replay budget are not
    replayed; the doc says how many were. `update_s_per_token`: the log's own update cost
    (simulate.whatif.logged_update_cost), where it has one."""
    chosen = tuple(workers) if workers else auto_workers(groups)
    trace = lengthlog.to_length_trace(groups, "length log")
    per_step = max(1, round(sum(len(g) for g in lengthlog.by_step(groups).values()) / len(trace.steps)))
    per_worker = len(trace) / len(trace.steps)  # sequences per worker and step
    steps = min(len(trace.steps), int(MAX_REPLAYED // (max(chosen) * per_worker)))
    if steps < 1:
        raise UserError(
            f"the what-if would replay {max(chosen) * per_worker:,.0f} sequences per step at {max(chosen)} "
            f"workers; at most {MAX_REPLAYED:,} (give smaller --workers)"
        )
    doc = simulate_whatif(trace, slots, chosen, WHATIF_MODES, gpu, model_size, steps, per_step,
                          update_s_per_token)  # fmt: skip
    said = [f"worker counts {', '.join(map(str, chosen))}"
            + ("" if workers else f" (the default counts whose replayed step holds at most {AUTO_REPLAYED:,} "
               f"sequences: {per_worker:,.0f} per worker here; --workers for others)")]  # fmt: skip
    if steps < len(trace.steps):
        said.append(f"the first {steps} of {len(trace.steps)} steps replayed (at most {MAX_REPLAYED:,} "
                    "sequences in all at the largest count)")  # fmt: skip
    return {**doc, "slots_per_worker": slots, "groups_per_worker": per_step, "steps_replayed": steps,
            "sampling": said}  # fmt: skip


def write_run(
    out: Path,
    events: list[dict[str, Any]],
    groups: list[Group],
    run: dict[str, Any],
    integration: dict[str, Any],
    whatif_doc: dict[str, Any] | None,
) -> dict[str, Any]:
    """Write the run folder and return its metrics doc. `run` names the source (framework, files, slots);
    `integration` holds what the framework logged and what its logs cannot tell."""
    check_events(events, "the rebuilt trace")  # a bug here is ours: refuse before anything is written
    with claim(out, "import", accepts=("import",)):  # one writer; never over another command's run
        computed = metrics.compute(events)
        if groups:
            integration = {**integration, "length_variance": lengthlog.variance_split(groups)}
            if run.get("slots_per_worker"):
                bubble = lengthlog.decode_step_bubble(groups, run["slots_per_worker"])
                integration["bubble_decode_steps"] = bubble
        doc = {
            "run": {
                "kind": "import",
                "imported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                **run,
            },  # fmt: skip
            "summary": computed["summary"],
            "steps": computed["steps"],
            "gpu": {"available": False, "reason": NO_GPU},
            "integration": integration,
            "whatif": whatif_doc or {"available": False, "reason": "no per-sample lengths in what was read"},
        }
        write_json(out / "imported.json", doc["run"])  # first: what the folder holds (rlbench/rundirs.py)
        write_jsonl(out / "trace.jsonl", events)
        if groups:
            lengthlog.write(out / "lengths.jsonl", groups)
        write_json(out / "metrics.json", doc)
        render_import(out, doc, events)
        return doc
