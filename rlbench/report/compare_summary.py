"""What `rlbench compare` reads from its runs side by side (`compare_doc`: compare.json) and the lines it
prints: the bubble first, then each mode's step time in parts with the speed-up and the part that produced
it, the rollout's throughput, the time to a target accuracy, and the notes (load drift, the CPU's split).

The functions behind the numbers are in reference_trainer/trace/compare.py; the page is compare_report.py.
"""

from __future__ import annotations

from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.compare import (
    GPU_ROLLOUT_SHARE,
    PHASES,
    at_gpu_split,
    drift_check,
    per_step_range,
    phase_seconds,
    speedup_parts,
    step_speedups,
)
from rlbench.report.profile_report import GENERATED_LABEL, TRAINED_LABEL, summary_problem


def check_compare_doc(doc: Any, source: Any) -> dict[str, Any]:
    """`doc` if it has the shape of compare.json (runs with a mode, a summary and step rows), else a one-line
    UserError naming `source`."""
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("mode"), str) and isinstance(r.get("summary"), dict)
        and isinstance(r.get("steps", []), list)
        for r in runs
    ):  # fmt: skip
        raise UserError(f"{source}: not a comparison (a list of runs, each with a mode, a summary and steps)")
    for run in runs:
        for n, row in enumerate([run["summary"], *run.get("steps", [])]):
            if isinstance(row, dict) and (why := summary_problem(row)) is not None:
                where = "summary" if n == 0 else f"step row {n}"
                raise UserError(f"{source}: {run['mode']}'s {where}: {why}")
    return doc


def runs_and_baseline(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A compare document's runs (a list, each with its mode) and the mode the others are compared with."""
    return doc.get("runs") or [], str(doc.get("baseline", "baseline"))


def _div(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b not in (None, 0) else None


def percent(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def ratio_rows(runs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """One row per mode: its summary (shares in percent) and its ratios to the baseline (speed-up > 1 means
    faster; the bubble's change in percentage points)."""
    base = next((r["summary"] for r in runs if r["mode"] == baseline), None)
    rows = []
    for r in runs:
        s = r["summary"]
        row: dict[str, Any] = {
            "mode": r["mode"],
            "bubble (%)": percent(s.get("bubble_ratio")),
            "step time (s)": s.get("step_time_s"),
            TRAINED_LABEL: s.get("trained_tokens_per_rollout_s"),
            GENERATED_LABEL: s.get("rollout_tokens_per_s"),
            "GPU idle in rollout (%)": percent(s.get("bubble_ratio_gpu")),
            "tail share (%)": percent(s.get("tail_time_share")),
            "acceptance (%)": percent(s.get("acceptance_rate")),
            # The bubble's slot-time lookahead took; blank where none ran (no lookahead, or its cost gate).
            "lookahead fill (%)": percent(s.get("lookahead_slot_share"))
            if s.get("lookahead_tokens")
            else None,
            "reward": s.get("reward_mean"),
            "accuracy": s.get("accuracy"),
        }
        if base is not None:
            bubble, base_bubble = s.get("bubble_ratio"), base.get("bubble_ratio")
            row["bubble vs baseline (pts)"] = (
                100.0 * (bubble - base_bubble) if bubble is not None and base_bubble is not None else None
            )
            row["speed-up (step time)"] = _div(base.get("step_time_s"), s.get("step_time_s"))
            # both throughputs, the trained first: a mode can generate more while training on less
            trained, generated = "trained_tokens_per_rollout_s", "rollout_tokens_per_s"
            row["trained throughput ×"] = _div(s.get(trained), base.get(trained))
            row["generated throughput ×"] = _div(s.get(generated), base.get(generated))
            row["reward ×"] = _div(s.get("reward_mean"), base.get("reward_mean"))
        rows.append(row)
    return rows


# Why a column can be empty for every mode: said under the table instead of showing blank cells.
UNMEASURED_WHY = {
    "GPU idle in rollout (%)": "NVML's GPU utilisation, on a GPU",
    "acceptance (%)": "no mode drafts tokens",
    "lookahead fill (%)": "no mode runs lookahead",
}


def compare_doc(
    runs: list[dict[str, Any]], baseline: str, workload: dict[str, Any] | None = None
) -> dict[str, Any]:
    """compare.json: the runs, and what is read from them side by side."""
    summaries = {r["mode"]: r["summary"] for r in runs}
    steps = {r["mode"]: r.get("steps") or [] for r in runs}
    parts = speedup_parts(summaries, baseline)
    base = phase_seconds(summaries.get(baseline, {})) or {}
    return {
        "baseline": baseline,
        "workload": workload or {},
        "interleaved": True,
        "runs": runs,
        "ratios": ratio_rows(runs, baseline),
        "bubble_per_round": per_step_range(steps, "bubble_ratio"),
        "speedup_per_round": step_speedups(steps, baseline),
        "parts": parts,
        "gpu_split_model": {m: at_gpu_split(p, base) for m, p in parts.items()},
        "drift": drift_check(summaries),
    }


def span_text(spread: dict[str, Any] | None, scale: float = 1.0, unit: str = "") -> str:
    if not spread or spread.get("min") is None:
        return ""
    digits = 1 if scale != 1 else 2
    return f"{scale * spread['min']:.{digits}f}-{scale * spread['max']:.{digits}f}{unit}"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """What `rlbench compare` prints: the bubble first, then each mode's step time in parts with the
    speed-up and the part that produced it, then the rollout's throughput and the trained lengths."""
    runs, baseline = runs_and_baseline(doc)
    derived = compare_doc(runs, baseline, doc.get("workload"))
    summaries = {r["mode"]: r["summary"] for r in runs}
    base = summaries.get(baseline, {})
    lines = ["bubble: idle slot-time in rollout, % of the slots' capacity (range over rounds)"]
    for mode, s in summaries.items():
        b = s.get("bubble_ratio")
        gpu = (
            f", GPU idle {100 * s['bubble_ratio_gpu']:.1f}%" if s.get("bubble_ratio_gpu") is not None else ""
        )
        versus = ""
        if mode != baseline and b is not None and base.get("bubble_ratio") is not None:
            versus = f"  {100 * (b - base['bubble_ratio']):+.1f} pts vs {baseline}"
        span = span_text(derived["bubble_per_round"].get(mode), 100.0)
        text = "n/a" if b is None else f"{100 * b:5.1f}%" + (f" ({span})" if span else "")
        lines.append(f"{mode:>16}: {text}{gpu}{versus}")
    lines.append(
        "time per step (s): rollout + update + reward + other; speed-up vs baseline (range per round)"
    )
    for mode, parts in derived["parts"].items():
        secs = parts["seconds"]
        if secs is None:
            lines.append(f"{mode:>16}: not measured")
            continue
        split = " + ".join(f"{secs[p]:.2f}" for p in PHASES) + f" = {sum(secs.values()):.2f} s"
        speed = ""
        if parts["speedup"] is not None:
            span = span_text(derived["speedup_per_round"].get(mode), unit="x")
            speed = f"  {parts['speedup']:.2f}x" + (f" ({span})" if span and mode != baseline else "")
        lines.append(f"{mode:>16}: {split}{speed}{produced_by(parts) if mode != baseline else ''}")
    lines.append(
        "rollout: trained / generated tokens per rollout-second; trained response length mean / longest"
    )
    for mode, s in summaries.items():
        gen, trained = s.get("rollout_tokens_per_s"), s.get("trained_tokens_per_rollout_s")
        aside = max(0, int(s.get("rollout_tokens") or 0) - int(s.get("trained_tokens") or 0))
        lines.append(
            f"{mode:>16}: {trained or 0:.0f} / {gen or 0:.0f} tok/s ({aside:,} generated tokens not "
            f"trained); length {lengths_text(s)}"
        )
    lines += accuracy_lines(doc.get("time_to_accuracy"))
    if (note_text := split_note(derived)) is not None:
        lines.append(f"note: {note_text}")
    return lines


def accuracy_lines(spent: dict[str, Any] | None) -> list[str]:
    """Time to a held-out accuracy: per mode, the training time before it was reached (held-out evaluations
    excluded), the rollout and update time inside it, the trained samples and the rollout tokens."""
    if not spent:
        return []
    lines = [
        f"time to held-out greedy accuracy {spent['target']:.2f} (budget {spent['budget_steps']} steps): "
        "training s (rollout + update), trained samples, rollout tokens"
    ]
    for mode, t in spent["modes"].items():
        figures = (
            f"{t['wall_s']:.1f} s ({t['rollout_s']:.1f} + {t['update_s']:.1f}), {t['samples']:,} samples, "
            f"{t['rollout_tokens']:,} tokens"
        )
        where = f"after {t['steps']} steps" if t["reached"] else f"not reached; the budget spent {figures}"
        lines.append(f"{mode:>16}: {figures}, {where}" if t["reached"] else f"{mode:>16}: {where}")
    return lines


def produced_by(parts: dict[str, Any]) -> str:
    """Which part of the step produced a mode's change in step time: `: update saved 4.47 s (96%)...`."""
    saved, share = parts.get("saved_s"), parts.get("share")
    if not saved or not share:
        return ""
    order = sorted(PHASES, key=lambda p: -abs(saved[p]))[:2]
    said = ", ".join(
        f"{p} {'saved' if saved[p] >= 0 else 'cost'} {abs(saved[p]):.2f} s ({100 * share[p]:.0f}%)"
        for p in order
    )
    return f": {said}"


def split_note(doc: dict[str, Any]) -> str | None:
    """Where the baseline's update outweighs its rollout (the CPU here; GPU RL spends ~75% of a step in
    rollout), say so and what the measured phase changes would buy at GPU RL's split, labelled a model."""
    base = (doc.get("parts") or {}).get(doc.get("baseline", "baseline"), {}).get("seconds")
    if not base or not base.get("rollout") or base["update"] <= base["rollout"]:
        return None
    modelled = (doc.get("gpu_split_model") or {}).items()
    model = ", ".join(f"{m} {v:.2f}x" for m, v in modelled if v is not None and m != doc.get("baseline"))
    return (
        f"here the update takes {base['update'] / base['rollout']:.1f}x the rollout's time; GPU RL spends "
        f"about {100 * GPU_ROLLOUT_SHARE:.0f}% of a step in rollout. At that split the same rollout and "
        f"update changes would give (a model, not a measurement): {model or 'n/a'}"
    )


def drift_note(drift: dict[str, Any]) -> str | None:
    if not drift.get("flagged"):
        return None
    costs = ", ".join(f"{m} {c:.3g}" for m, c in drift["s_per_ktoken"].items() if c)
    return (
        f"Machine load drifted during this comparison: the update, which no mode changes, cost {costs} s per "
        f"1,000 trained tokens ({drift['ratio']:.2f}x apart, tolerance {drift['tolerance']:.2f}x). Treat the "
        "speed-ups as unreliable and rerun on a quiet machine."
    )


def lengths_text(summary: dict[str, Any]) -> str:
    return f"{summary.get('response_len_mean') or 0:.0f} / {summary.get('response_len_max') or 0}"
