"""`rlbench audit`: a run's idle figures rebuilt from its per-sample evidence, beside the framework's own;
docs/integrations.md ("rlbench audit") says what each is rebuilt from and declared by.

A difference beyond the tolerance is flagged. The run is labelled by metrics.bound_label, the rule of
docs/metrics.md, from the rebuilt shares: the evidence wins over the log, and the label says so where they
disagree. A side with nothing to rebuild it from falls back to its declared share, and the label then says
that it could not be checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics, rollout_trace
from reference_trainer.trace.records import read_json, read_jsonl
from reference_trainer.trace.schema import is_number, read_trace
from reference_trainer.trace.steps import IDLE_HIGH
from rlbench.integrations import convert, lengthlog, verl

TOLERANCE = 0.10  # absolute, on shares; relative on times
QUIET = 0.05  # a declared idle share under this says "never idle"


def _figure(
    quantity: str,
    rebuilt: float | None,
    evidence: str,
    declared: float | None,
    declared_by: str | None,
    tolerance: float,
) -> dict[str, Any]:
    diff = rebuilt - declared if rebuilt is not None and declared is not None else None
    return {
        "quantity": quantity,
        "rebuilt": rebuilt,
        "evidence": evidence,
        "declared": declared,
        "declared_by": declared_by,
        "difference": diff,
        "flagged": diff is not None and abs(diff) > tolerance,
    }


def _idle_figures(
    shares: tuple[float | None, float | None],
    evidence: tuple[str, str],
    declared: dict[str, tuple[float | None, str | None]],
    where: dict[str, str],
    tolerance: float,
) -> list[dict[str, Any]]:
    """The trainer's and the rollout's idle share, rebuilt, beside what verl declared for each side (its
    mean over the steps, and the key it came from)."""
    sides = (("trainer idle", "trainer"), ("rollout idle", "rollouter"))
    return [
        _figure(quantity, share, how, declared[side][0], _named(declared[side][1], where), tolerance)
        for (quantity, side), share, how in zip(sides, shares, evidence, strict=True)
    ]


def _share(value: float | None, what: str, notes: list[str], why: str) -> float | None:
    """A rebuilt share, or None with a note when the evidence puts it outside [0, 1]: such a share is
    never printed (nor labels the run), the note says which figures disagree."""
    if value is None or 0.0 <= value <= 1.0:
        return value
    notes.append(f"{what} not rebuilt: {why}; the log's figures disagree")
    return None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _is_verl_log(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".jsonl":
        return False
    first = next(iter(read_jsonl(path, torn_tail=False)), {})
    return set(first) == {"step", "data"}


def _verl_rollout_evidence(data: dict[str, Any], generated_before: float) -> tuple[float, float, str] | None:
    """(sample-seconds, window seconds, how) of one verl step, from per-sample times."""
    generated, mean = data.get(verl.GENERATED), data.get(verl.PROCESSING_MEAN)
    if is_number(generated) and is_number(mean):
        window = verl.first_number(data, verl.VERSION_TIME) or float(data[verl.STEP])
        how = "generated samples x fully_async/processing_time/avg over version_time"
        return (float(generated) - generated_before) * float(mean), window, how
    mean = data.get(verl.SAMPLE_TIME.format("mean"))
    length = sum(
        verl.first_number(data, (k,)) or 0 for k in ("prompt_length/mean", verl.LENGTH.format("mean"))
    )
    if is_number(mean) and is_number(data.get(verl.TOKENS)) and length > 0:
        how = (
            "samples (perf/total_num_tokens / mean sample length) x "
            "timing_s/agent_loop/generate_sequences/mean over timing_s/step"
        )
        return float(data[verl.TOKENS]) / length * float(mean), float(data[verl.STEP]), how
    return None


def audit_verl(path: Path, slots: int | None, tolerance: float) -> dict[str, Any]:
    steps, notes = verl.read_log(path)
    work, step_s, sample_s, window_s, how, declared, keys, utilisation = _verl_totals(steps)
    over = f"the trainer's timers ({work:.4g} s) exceed its steps ({step_s:.4g} s)"
    trainer_idle = _share(1.0 - work / step_s if step_s > 0 else None, "trainer idle", notes, over)
    rollout_idle = _share(
        1.0 - sample_s / (slots * window_s) if slots and how and window_s > 0 else None,
        "rollout idle",
        notes,
        f"the samples' time ({sample_s:.4g} sample-s) exceeds "
        f"--slots {slots} x the window ({window_s:.4g} s)",
    )
    where = verl.key_generations(steps)
    if rollout_idle is not None:
        rollout_how = f"1 - {how} / ({slots} slots)"
    else:
        rollout_how = (
            "needs --slots (the rollout's concurrent samples)" if how else "no per-sample times in the log"
        )
    figures = _idle_figures(
        (trainer_idle, rollout_idle),
        ("1 - verl's timed trainer work / timing_s/step", rollout_how),
        {side: (_mean(declared[side]), keys.get(side)) for side in declared},
        where,
        tolerance,
    )
    if utilisation:
        figures.append(
            _figure(
                "rollout idle (slots)",
                rollout_idle,
                figures[1]["evidence"],
                1.0 - _mean(utilisation),
                "1 - dynamic_resource/rollout_resource_utilization "
                f"({where['dynamic_resource/rollout_resource_utilization']})",
                tolerance,
            )
        )
    notes += _paused_notes(figures, rollout_idle)
    return _doc(path, "verl log", len(steps), figures, trainer_idle, rollout_idle, notes, tolerance)


def _verl_totals(steps: dict[Any, dict[str, Any]]) -> tuple[Any, ...]:
    """A verl log's sums over its steps: the trainer's timed work and step time, the samples' time and
    the window it falls in (and how it was read), each side's declared idle ratio (and its key), and the
    rollout's declared utilisation."""
    work = step_s = sample_s = window_s = 0.0
    declared: dict[str, list[float]] = {"trainer": [], "rollouter": []}
    keys: dict[str, str] = {}
    utilisation: list[float] = []
    how, generated = None, 0.0
    for data in steps.values():
        step_s += float(data[verl.STEP])
        work += sum(verl.timer(data, name) for name in ("reward", *verl.TRAINER_WORK))
        for side in declared:
            value, key = verl.declared(data, side)
            if value is not None:
                declared[side].append(value)
                keys[side] = key  # type: ignore[assignment]
        if is_number(data.get("dynamic_resource/rollout_resource_utilization")):
            utilisation.append(float(data["dynamic_resource/rollout_resource_utilization"]))
        evidence = _verl_rollout_evidence(data, generated)
        if evidence is not None:
            sample_s, window_s, how = sample_s + evidence[0], window_s + evidence[1], evidence[2]
        if is_number(data.get(verl.GENERATED)):
            generated = float(data[verl.GENERATED])
    return work, step_s, sample_s, window_s, how, declared, keys, utilisation


def _paused_notes(figures: list[dict[str, Any]], rollout_idle: float | None) -> list[str]:
    """A note where verl declares both sides busy while the samples leave the rollout's slots idle."""
    quiet = [f["declared"] for f in figures[:2]]
    if not (
        all(d is not None and d < QUIET for d in quiet)
        and rollout_idle is not None
        and rollout_idle >= IDLE_HIGH
    ):
        return []
    return [
        f"verl declares that neither side idles (trainer {quiet[0]:.1%}, rollouter {quiet[1]:.1%}), yet "
        f"the rollout's samples fill only {1 - rollout_idle:.1%} of its slot-time: the idle ratio "
        "misses time it spent paused or draining (verl#6693). With both sides busy an asynchronous run "
        "would beat a synchronous one; this one is trainer-bound, so it cannot gain more than the rollout's "
        "share of a synchronous step."
    ]


def _named(key: str | None, where: dict[str, str]) -> str | None:
    return f"{key} ({where[key]})" if key else None


def audit_run(run_dir: Path, tolerance: float) -> dict[str, Any]:
    """An rlbench run folder: the trace's own shares, beside the imported framework's and NVML's."""
    doc = read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else {}
    computed = metrics.compute(read_trace(run_dir / "trace.jsonl"), doc.get("gpu"))["summary"]
    rows = (doc.get("integration") or {}).get("per_step") or []
    notes: list[str] = []
    where = {k: w for k, (_, w) in verl.IDLE_KEYS.items()}
    shares = computed["trainer_idle_share"], computed["rollout_idle_share"]
    evidence = (
        "1 - reward and update phases / step time (trace)",
        "1 - slot-time / (capacity x step time) (trace)",
    )
    declared = {side: _declared_in_rows(rows, side) for side in ("trainer", "rollouter")}
    figures = _idle_figures(shares, evidence, declared, where, tolerance)
    gpu = computed.get("bubble_ratio_gpu")
    nvml = "NVML GPU bubble" if gpu is not None else None
    trace_bubble = "engine events' slots over the rollout windows (trace)"
    figures.append(_figure("slot bubble", computed["bubble_ratio"], trace_bubble, gpu, nvml, tolerance))
    figures += _trl_step_time(rows, doc, computed["step_time_s"], tolerance)
    kind = f"rlbench run ({(doc.get('run') or {}).get('framework') or 'native'})"
    return _doc(run_dir, kind, computed["steps"], figures, *shares, notes, tolerance)


def _declared_in_rows(rows: list[dict[str, Any]], side: str) -> tuple[float | None, str | None]:
    """The mean idle ratio verl declared for `side` over an imported run's per-step rows, and its key."""
    each = [verl.declared({k.removeprefix("verl "): v for k, v in row.items()}, side) for row in rows]
    found = [(value, key) for value, key in each if value is not None]
    return _mean([value for value, _ in found]), found[-1][1] if found else None


def _trl_step_time(
    rows: list[dict[str, Any]], doc: dict[str, Any], ours: float | None, tolerance: float
) -> list[dict[str, Any]]:
    """The trace's step time beside TRL's own, where an imported TRL run logged it in seconds (the
    tolerance relative to TRL's)."""
    trl_times = [r["TRL step_time"] for r in rows if is_number(r.get("TRL step_time"))]
    if not trl_times or (doc.get("run") or {}).get("time_unit") != "s":
        return []
    theirs = _mean(trl_times)
    return [_figure("step time (s)", ours, "phases (trace)", theirs, "TRL step_time", tolerance * theirs)]


def audit_records(
    path: Path, records: list[dict[str, Any]], slots: int | None, tolerance: float
) -> dict[str, Any]:
    """Per-request records alone (no trainer phases): the slot bubble of each step's requests, over their
    measured times where the records have them, else over decode steps rebuilt from their lengths."""
    timed = [r for r in records if r["time_source"] == "measured"]
    if timed:
        busy = capacity_s = 0.0
        for step_records in rollout_trace.records_by_step(timed).values():
            occ = rollout_trace.occupancy(step_records, slots)
            if occ["bubble"] is not None:
                busy += occ["busy_s"]
                capacity_s += occ["capacity"] * occ["window_s"]
        bubble = 1.0 - busy / capacity_s if capacity_s > 0 else None
        per = f"{slots} slots per engine" if slots else "the peak concurrency as capacity (a lower bound)"
        evidence = f"requests' admit-to-finish time over each step's window, {per}"
    else:
        groups = convert.to_groups(records)
        batch = max(sum(len(g.lengths) for g in gs) for gs in lengthlog.by_step(groups).values())
        bubble = lengthlog.decode_step_bubble(groups, slots or batch)
        evidence = f"decode steps rebuilt from the lengths, {slots or batch} slots (no request times)"
    figures = [_figure("slot bubble", bubble, evidence, None, None, tolerance)]
    notes = ["no trainer phases in per-request records: trainer idle and the label need the run's phases"]
    steps = len(rollout_trace.records_by_step(records))
    return _doc(path, "rollout requests", steps, figures, None, None, notes, tolerance)


def _doc(
    source: Path,
    kind: str,
    steps: int,
    figures: list[dict[str, Any]],
    trainer_idle: float | None,
    rollout_idle: float | None,
    notes: list[str],
    tolerance: float,
) -> dict[str, Any]:
    label, basis, checked = _label(figures, {"trainer idle": trainer_idle, "rollout idle": rollout_idle})
    return {
        "source": str(source),
        "kind": kind,
        "steps": steps,
        "tolerance": tolerance,
        "idle_high": IDLE_HIGH,
        "figures": figures,
        "label": label,
        "label_from": basis if label else None,
        "label_check": checked,
        "notes": notes,
    }


def _label(
    figures: list[dict[str, Any]], rebuilt: dict[str, float | None]
) -> tuple[str | None, str, str | None]:
    """(label, basis, what the label's check found). The evidence wins: each side's rebuilt share where
    there is one, the declared share only where nothing could be rebuilt, and then the label says it is
    unchecked; where the two disagree the label says it follows the evidence, and what the log alone says."""
    by = {f["quantity"]: f for f in figures if f["quantity"] in rebuilt}
    declared = {q: (by[q]["declared"] if q in by else None) for q in rebuilt}
    shares = {q: rebuilt[q] if rebuilt[q] is not None else declared[q] for q in rebuilt}
    label = metrics.bound_label(shares["trainer idle"], shares["rollout idle"])
    log_label = metrics.bound_label(declared["trainer idle"], declared["rollout idle"])
    unchecked = [q for q in rebuilt if rebuilt[q] is None and declared[q] is not None]
    if label is None:
        return None, "rebuilt", None
    if unchecked:
        why = "; ".join(f"the log's {q} could not be rebuilt ({by[q]['evidence']})" for q in unchecked)
        basis = "declared" if len(unchecked) == len(rebuilt) else "rebuilt and declared"
        return label, basis, f"unchecked: {why}"
    disagree = [q for q in rebuilt if by.get(q, {}).get("flagged")]
    if not disagree:
        return label, "rebuilt", None
    said = ", ".join(
        f"{q} {by[q]['rebuilt']:.1%} rebuilt against {by[q]['declared']:.1%} declared" for q in disagree
    )
    if log_label is None:
        log_says = "the log's figures alone give no label"
    elif log_label != label:
        log_says = f"the log's own figures say {log_label}"
    else:
        log_says = "the log's figures give the same label"
    return label, "rebuilt", f"follows the evidence where it disagrees with the log ({said}); {log_says}"


def audit(
    path: Path,
    slots: int | None = None,
    tolerance: float = TOLERANCE,
    tokenizer: Any = None,
    trust_pickle: bool = False,
) -> dict[str, Any]:
    """The audit of a run folder, a verl file log, or any per-request file `rlbench trace convert` reads."""
    if path.is_dir() and (path / "trace.jsonl").is_file():
        return audit_run(path, tolerance)
    if _is_verl_log(path):
        return audit_verl(path, slots, tolerance)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    return audit_records(path, convert.to_records(path, tokenizer, trust_pickle), slots, tolerance)
