"""The compare report: modes side by side, ratios against the baseline, overlaid per-step curves.

Input (`compare.json`):
    {"baseline": "baseline", "runs": [{"mode": "baseline", "summary": {...}, "steps": [...]}, ...],
     "workload": {...optional, shown as the subtitle}}
`runs` may also be a dict {mode: {"summary": ..., "steps": ...}}. Ratios are only against a baseline run
from the same file (same process, prompts and seeds): ratios across processes or machines would mix
noise and hardware into the speed-up.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.compare import drift_check, step_speedups
from reference_trainer.trace.records import read_json
from rlbench.report.figures import PALETTE, _fig, note, steps_axis
from rlbench.report.page import table, write_page
from rlbench.report.profile_report import summary_problem

CURVES = [
    ("bubble_ratio", "Bubble ratio per step", "%", 100.0),
    ("rollout_tokens_per_s", "Rollout throughput per step", "tokens/s", 1.0),
    ("step_time_s", "Step time", "seconds", 1.0),
    ("reward_mean", "Reward mean per step", "reward", 1.0),
    ("accuracy", "Accuracy per step", "accuracy", 1.0),
    ("acceptance_rate", "Draft acceptance per step", "%", 100.0),
]


def check_compare_doc(doc: Any, source: Any) -> dict[str, Any]:
    """`doc` if it has the shape of compare.json (runs with a mode, a summary and step rows), else a one-line
    UserError naming `source`."""
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if isinstance(runs, dict):
        runs = [{"mode": mode, **run} if isinstance(run, dict) else run for mode, run in runs.items()]
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("mode"), str) and isinstance(r.get("summary"), dict)
        and isinstance(r.get("steps", []), list)
        for r in runs
    ):  # fmt: skip
        raise UserError(f"{source}: not a comparison (runs, each with a mode, a summary and steps)")
    for run in runs:
        for n, row in enumerate([run["summary"], *run.get("steps", [])]):
            if isinstance(row, dict) and (why := summary_problem(row)) is not None:
                where = "summary" if n == 0 else f"step row {n}"
                raise UserError(f"{source}: {run['mode']}'s {where}: {why}")
    return doc


def normalise(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    runs = doc.get("runs") or []
    if isinstance(runs, dict):
        runs = [{"mode": mode, **run} for mode, run in runs.items()]
    return runs, str(doc.get("baseline", "baseline"))


def _div(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b not in (None, 0) else None


def ratio_rows(runs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """One row per mode: its summary and its ratios to the baseline (speed-up > 1 means faster)."""
    base = next((r["summary"] for r in runs if r["mode"] == baseline), None)
    rows = []
    for r in runs:
        s = r["summary"]
        row: dict[str, Any] = {
            "mode": r["mode"],
            "step time (s)": s.get("step_time_s"),
            "rollout tokens/s": s.get("rollout_tokens_per_s"),
            "bubble ratio": s.get("bubble_ratio"),
            "GPU idle in rollout": s.get("bubble_ratio_gpu"),
            "tail share": s.get("tail_time_share"),
            "acceptance": s.get("acceptance_rate"),
            "reward": s.get("reward_mean"),
            "accuracy": s.get("accuracy"),
        }
        if base is not None:
            row["speed-up (step time)"] = _div(base.get("step_time_s"), s.get("step_time_s"))
            row["throughput ×"] = _div(s.get("rollout_tokens_per_s"), base.get("rollout_tokens_per_s"))
            row["bubble ×"] = _div(s.get("bubble_ratio"), base.get("bubble_ratio"))
            row["reward ×"] = _div(s.get("reward_mean"), base.get("reward_mean"))
        rows.append(row)
    return rows


# Why a column can be empty for every mode: said under the table instead of showing blank cells.
UNMEASURED_WHY = {
    "GPU idle in rollout": "NVML's GPU utilisation, on a GPU",
    "acceptance": "no mode drafts tokens",
}


def drift_note(drift: dict[str, Any]) -> str | None:
    if not drift.get("flagged"):
        return None
    costs = ", ".join(f"{m} {c:.3g}" for m, c in drift["s_per_ktoken"].items() if c)
    return (
        f"Machine load drifted during this comparison: the update, which no mode changes, cost {costs} s per "
        f"1,000 trained tokens ({drift['ratio']:.2f}x apart, tolerance {drift['tolerance']:.2f}x). Treat the "
        "speed-ups as unreliable and rerun on a quiet machine."
    )


def render_compare(compare_dir: str | Path, doc: dict[str, Any] | None = None) -> Path:
    """Write compare_dir/report.html from compare.json (or the given doc)."""
    import plotly.graph_objects as go

    compare_dir = Path(compare_dir)
    if doc is None:
        doc = check_compare_doc(read_json(compare_dir / "compare.json"), compare_dir / "compare.json")
    runs, baseline = normalise(doc)
    rows = ratio_rows(runs, baseline)
    spread = step_speedups({r["mode"]: r.get("steps") or [] for r in runs}, baseline)
    for row in rows:
        if (s := spread.get(row["mode"])) and s["min"] is not None:
            row["speed-up per round (min-max)"] = f"{s['min']:.2f}-{s['max']:.2f}x"
    drift = doc.get("drift") or drift_check({r["mode"]: r["summary"] for r in runs})
    intro: list[Any] = [note(message)] if (message := drift_note(drift)) else []
    unmeasured = [c for c in rows[0] if all(r.get(c) is None for r in rows)]
    intro.append(table(rows, [c for c in rows[0] if c not in unmeasured]))
    if unmeasured:
        why = ", ".join(f"{c} ({UNMEASURED_WHY.get(c, 'not in the runs')})" for c in unmeasured)
        intro.append(f'<p class="sub">Not measured here: {html.escape(why)}.</p>')
    if not any(r["mode"] == baseline for r in runs):
        intro.append(note(f"No '{baseline}' run in this comparison: ratios are not shown."))
    else:
        intro.append(
            '<p class="sub">Ratios are against the baseline run of the same process, prompts and seeds, '
            "the modes taking their steps in turn. speed-up = baseline step time / mode step time (the "
            "range: per round, step k of each); throughput, bubble and reward: mode / baseline.</p>"
        )
        speed = _fig("Speed-up over baseline (end-to-end step time)", "mode", "×")
        speed.add_trace(
            go.Bar(
                x=[r["mode"] for r in rows],
                y=[r.get("speed-up (step time)") for r in rows],
                marker_color=[PALETTE[i % len(PALETTE)] for i in range(len(rows))],
            )
        )
        speed.add_hline(y=1.0, line_dash="dot", line_color="#888")
        intro.append(speed)
    curves: list[Any] = []
    for key, title, unit, scale in CURVES:
        fig = _fig(title, "step", unit)
        for i, r in enumerate(runs):
            steps = r.get("steps") or []
            ys = [None if s.get(key) is None else scale * s[key] for s in steps]
            if any(y is not None for y in ys):
                fig.add_trace(
                    go.Scatter(
                        x=[s["step"] for s in steps],
                        y=ys,
                        name=r["mode"],
                        mode="lines+markers",
                        line={"color": PALETTE[i % len(PALETTE)]},
                    )
                )
        if fig.data:
            curves.append(steps_axis(fig, [s["step"] for r in runs for s in r.get("steps") or []]))
    workload = doc.get("workload") or {}
    subtitle = " · ".join(f"{k}: {v}" for k, v in workload.items() if not isinstance(v, (dict, list)))
    sections = [("Modes side by side", intro), ("Per-step curves", curves or [note("No per-step data.")])]
    return write_page(compare_dir / "report.html", "rlbench compare", sections, subtitle)
