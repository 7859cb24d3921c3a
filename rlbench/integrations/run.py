"""A run folder from another framework's run: trace.jsonl, lengths.jsonl, metrics.json and report.html.

Every metric is computed by `reference_trainer.trace.metrics` from the trace written here, as for
rlbench's own runs; what the framework logged itself goes beside it under `integration`, never in its place.
The what-if is a replay of the length log through `rlbench simulate`'s engine and cost model
(`rlbench.simulate.whatif`): a prediction, labelled as one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace import ledger, metrics
from reference_trainer.trace.records import write_json, write_jsonl
from reference_trainer.trace.schema import SEQUENCE, TRAINER_WAIT, Event, check_events
from rlbench.integrations import lengthlog
from rlbench.integrations.lengthlog import Group
from rlbench.report.import_report import render_import
from rlbench.rundirs import claim
from rlbench.simulate.modes import dispatch_entries
from rlbench.simulate.whatif import whatif as simulate_whatif

WHATIF_MODES = ("baseline", "sorted", "sorted-partial", "histopipe", "async")  # async: max_staleness 1
WHATIF_WORKERS = (1, 8, 64, 512, 4096)
# The replay's work, in units of about a microsecond on one CPU core (measured on logs of 1 to 768
# sequences per worker and step at 1 to 512 workers, 2026-11-28): a step costs ~1,500 units to set up, then
# the simulator steps all workers together once per admission or finish (about n events for the n sequences
# a worker holds in a step), each event ~200 units plus 1/20 of a unit per slot of every worker
# (W x min(slots, n)). The worker counts of one what-if together get REPLAY_BUDGET units per mode (4 modes:
# about 20 s); the steps past it are not replayed (the doc says how many were). Default worker counts are
# taken in increasing order while one step of each still fits; given counts that do not fit are refused.
REPLAY_BUDGET = 5_000_000
MAX_REPLAYED = 1 << 21  # sequences in one replayed step at the largest count: the simulator's (W, n) arrays
STEP_UNITS = 1500
EVENT_UNITS = 200
SLOTS_PER_UNIT = 20
DRAWN_EVENTS = 200_000  # events of the first steps the page draws slot by slot
# The ledger (trained vs generated lengths, reward) reads every sequence event; kept, with only the fields it
# reads, for runs of at most this many (about 100 MB); past it the ledger's figures are left out, said so.
LEDGER_SEQUENCES = 250_000
NO_GPU = (
    "an imported run has no GPU timeline: rlbench profile --engine-metrics samples NVML around a live run"
)


# The best dispatch's replays (the baseline once per policy, each request dispatched in Python): a fifth of
# the modes' budget. On a length log of 16 sequences per worker and step, 6 policies x 8 steps took 2.1 s of
# CPU at 512 workers (540,000 units) and 22 s at 4,096 (2.7 million; 2026-11-29).
DISPATCH_BUDGET = REPLAY_BUDGET // 5


def step_work(workers: int, per_worker: float, slots: int) -> float:
    """The replay's work units for one step at `workers` workers holding `per_worker` sequences each
    (past MAX_REPLAYED sequences in the step: more than any budget)."""
    if workers * per_worker > MAX_REPLAYED:
        return float("inf")
    return STEP_UNITS + per_worker * (EVENT_UNITS + workers * min(slots, per_worker) / SLOTS_PER_UNIT)


def _worker_counts(workers: Sequence[int] | None, per_worker: float, slots: int) -> tuple[int, ...] | str:
    """The what-if's worker counts: those given (a one-line error past the budget), or those of
    WHATIF_WORKERS whose one step fits the replay budget together; a reason where none does."""
    if workers:
        chosen = tuple(workers)
        if sum(step_work(w, per_worker, slots) for w in chosen) > REPLAY_BUDGET:
            raise UserError(
                f"the what-if at {max(chosen)} workers would replay {max(chosen) * per_worker:,.0f} "
                f"sequences on {slots:,} slots each in one step: past its budget ({REPLAY_BUDGET:,} work "
                f"units, at most {MAX_REPLAYED:,} sequences a step): give smaller --workers or --slots"
            )
        return chosen
    chosen: tuple[int, ...] = ()
    for count in WHATIF_WORKERS:  # in increasing order, while one step of each fits together
        if sum(step_work(w, per_worker, slots) for w in (*chosen, count)) > REPLAY_BUDGET:
            break
        chosen += (count,)
    if not chosen:
        return (
            f"one step of this log ({per_worker:,.0f} sequences on {slots:,} slots) is past the "
            f"what-if's budget of {REPLAY_BUDGET:,} work units (give --slots)"
        )
    return chosen


def whatif(
    groups: list[Group],
    slots: int,
    workers: Sequence[int] | None = None,
    gpu: str = "h100",
    model_size: str = "7b",
    update_s_per_token: float | None = None,
) -> dict[str, Any]:
    """What each mode would buy on these lengths at each worker count (docs/integrations.md says how the
    counts, the steps replayed and the scaling are chosen): time and memory bounded whatever the log's size.
    `update_s_per_token`: the log's own update cost (simulate.whatif.logged_update_cost), where it has one."""
    by_step = lengthlog.by_step(groups)
    per_step = max(1, round(len(groups) / len(by_step)))  # groups per worker and step
    per_worker = sum(len(g.lengths) for g in groups) / len(by_step)  # sequences per worker and step
    chosen = _worker_counts(workers, per_worker, slots)
    if isinstance(chosen, str):
        return {"available": False, "reason": chosen, "sampling": [f"no prediction: {chosen}"]}
    work = sum(step_work(w, per_worker, slots) for w in chosen)
    steps = min(len(by_step), int(REPLAY_BUDGET // work))
    used = min(len(groups), steps * max(chosen) * per_step)  # the replay cycles through the log's groups
    trace = lengthlog.to_length_trace(groups[:used], "length log")
    # the best dispatch replays the baseline once per policy: at the largest count whose replays fit
    # DISPATCH_BUDGET (the smallest count where none does)
    policies = len(dispatch_entries("baseline"))
    fits = [w for w in chosen if policies * steps * step_work(w, per_worker, slots) <= DISPATCH_BUDGET]
    best_at = max(fits, default=min(chosen))
    doc = simulate_whatif(
        trace, slots, chosen, WHATIF_MODES, gpu, model_size, steps, per_step, update_s_per_token, best_at
    )
    said = [f"worker counts {', '.join(map(str, chosen))}"
            + ("" if workers else f" (the default counts whose replayed step fits the budget of "
               f"{REPLAY_BUDGET:,} work units: {per_worker:,.0f} sequences per worker here; --workers for "
               "others)")]  # fmt: skip
    if steps < len(by_step):
        said.append(
            f"the first {steps} of {len(by_step)} steps replayed (the replay's budget, "
            f"{REPLAY_BUDGET:,} work units, over all worker counts)"
        )
    return {**doc, "slots_per_worker": slots, "groups_per_worker": per_step, "steps_replayed": steps,
            "sampling": said}  # fmt: skip


class _Reading:
    """What an import keeps of the events while they stream to trace.jsonl: each step's metrics, the first
    steps' events (the page's slot picture), and what the run's summary reads (the ledger's sequences, up
    to LEDGER_SEQUENCES, and the waits)."""

    def __init__(self, capacities: dict[int, int] | None) -> None:
        self.capacities = capacities
        self.step_rows: list[Event] = []
        self.drawn: list[Event] = []
        self.room = DRAWN_EVENTS
        self.kept: list[Event] = []
        self.sequences = 0

    def checked(self, steps: Iterable[list[Event]]) -> Iterator[Event]:
        for n, part in enumerate(steps):
            check_events(part, "the rebuilt trace")  # a bug here is ours: refused before it is written
            self.step_rows.extend(metrics.step_metrics(part, self.capacities))
            for e in part:
                if e.get("kind") == TRAINER_WAIT:
                    self.kept.append(e)
                elif e.get("kind") == SEQUENCE:
                    self.sequences += 1
                    if self.sequences <= LEDGER_SEQUENCES:
                        self.kept.append({k: e[k] for k in ledger.LEDGER_FIELDS if k in e})
            if n == 0 or (len(part) <= self.room and any(e.get("slots") for e in part)):
                self.drawn.extend(part)
                self.room -= len(part)
            yield from part


def write_run(
    out: Path,
    steps: Iterable[list[Event]],
    groups: list[Group],
    run: dict[str, Any],
    integration: dict[str, Any],
    whatif_doc: dict[str, Any] | None,
    capacities: dict[int, int] | None = None,
) -> dict[str, Any]:
    """Write the run folder and return its metrics doc. `steps` yields the trace's events a step (or a few
    whole steps) at a time: each part is checked, written to trace.jsonl and reduced to its step metrics as
    it comes, so a long run is never held as events. `capacities` (each worker's slots over the run) is
    needed when there is more than one part. `run` names the source (framework, files, slots);
    `integration` holds what the framework logged and what its logs cannot tell."""
    read = _Reading(capacities)

    with claim(out, "import", accepts=("import",)):  # one writer; never over another command's run
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        doc_run = {"kind": "import", "imported_at": now, **run}
        write_json(out / "imported.json", doc_run)  # first: what the folder holds (rlbench/rundirs.py)
        write_jsonl(out / "trace.jsonl", read.checked(steps))
        step_rows, kept, sequences = read.step_rows, read.kept, read.sequences
        per_step, overall = metrics.gpu_bubble(step_rows, None)
        for row, gpu_bubble in zip(step_rows, per_step, strict=True):
            row["bubble_ratio_gpu"] = gpu_bubble
        if sequences > LEDGER_SEQUENCES:  # no ledger of a part of the run
            kept = [e for e in kept if e.get("kind") != SEQUENCE]
            why = f"not computed: {sequences:,} sequences, over {LEDGER_SEQUENCES:,}"
            integration = {**integration, "ledger": why}
        summary = {**metrics.summary(kept, step_rows), "bubble_ratio_gpu": overall}
        if groups:
            integration = {**integration, "length_variance": lengthlog.variance_split(groups)}
            if slots := run.get("slots_per_worker"):
                integration["bubble_decode_steps"] = lengthlog.decode_step_bubble(groups, slots)
        doc = {
            "run": doc_run,
            "summary": summary,
            "steps": step_rows,
            "gpu": {"available": False, "reason": NO_GPU},
            "integration": integration,
            "whatif": whatif_doc or {"available": False, "reason": "no per-sample lengths in what was read"},
        }
        if groups:
            lengthlog.write(out / "lengths.jsonl", groups)
        write_json(out / "metrics.json", doc)
        render_import(out, doc, read.drawn)
        return doc
