"""The compare page: the bubble first (each mode beside the baseline, with its range over rounds), then the
step time split into rollout, update, reward and other (which part a mode changed), the rollout's
throughput in trained and in generated tokens (trained first: a mode can generate more and train on less),
the other ratios, per-step curves. A caveat that invalidates the speed-ups (load drift) comes first.
compare_summary.py reads the runs side by side and writes the terminal's lines.

Input (`compare.json`):
    {"baseline": "baseline", "runs": [{"mode": "baseline", "summary": {...}, "steps": [...]}, ...],
     "workload": {...optional, shown as the subtitle}}
What is read from the runs side by side (`compare_doc`) is computed again from them. Ratios are only
against a baseline run from the same file (same process, prompts and seeds): ratios across processes or
machines would mix noise and hardware into the speed-up.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from reference_trainer.trace.compare import PHASES
from reference_trainer.trace.records import read_json
from rlbench.report.compare_summary import (
    UNMEASURED_WHY,
    check_compare_doc,
    compare_doc,
    drift_note,
    lengths_text,
    percent,
    points,
    produced_by,
    runs_and_baseline,
    span_text,
)
from rlbench.report.engines import CAPTION, engine_cells
from rlbench.report.figures import PALETTE, _fig, note, steps_axis
from rlbench.report.ledger_legend import legend_html
from rlbench.report.page import table, write_page
from rlbench.report.profile_report import GENERATED_LABEL, TRAINED_LABEL, trained_per_rollout_s
from rlbench.report.replay_summary import replay_section
from rlbench.report.verdict import verdict_lines

CURVES = [
    ("bubble_ratio", "Bubble ratio per step", "%", 100.0),
    (TRAINED_LABEL, "Trained tokens per rollout-second, per step", "tokens/s", 1.0),
    ("rollout_tokens_per_s", "Generated tokens per rollout-second, per step", "tokens/s", 1.0),
    ("step_time_s", "Step time", "seconds", 1.0),
    ("reward_mean", "Reward mean per step", "reward", 1.0),
    ("accuracy", "Accuracy per step", "accuracy", 1.0),
    ("acceptance_rate", "Draft acceptance per step", "%", 100.0),
]


def render_compare(compare_dir: str | Path, doc: dict[str, Any] | None = None) -> Path:
    """Write compare_dir/report.html from compare.json (or the given doc)."""

    compare_dir = Path(compare_dir)
    if doc is None:
        doc = check_compare_doc(read_json(compare_dir / "compare.json"), compare_dir / "compare.json")
    runs, baseline = runs_and_baseline(doc)
    derived = compare_doc(runs, baseline, doc.get("workload"))
    rows = [
        {k: f"{v:.2f}x" if k in RATIO_COLUMNS and v is not None else v for k, v in r.items()}
        for r in derived["ratios"]
    ]
    for row in rows:
        if (s := derived["speedup_per_round"].get(row["mode"])) and s["min"] is not None:
            row["speed-up per round (min-max)"] = f"{s['min']:.2f}-{s['max']:.2f}x"
    drift = doc.get("drift") or derived["drift"]
    has_base = any(r["mode"] == baseline for r in runs)
    bubble: list[Any] = [_bubble_table(derived), _bubble_figure(runs)]
    parts: list[Any] = [_parts_table(derived, runs, baseline)] if has_base else []
    if has_base:
        parts.append(_parts_figure(derived))
    parts += replay_section(doc.get("gpu_replay"))
    # a caveat that invalidates the speed-ups is read before them: the page's first section
    caveats = [note(message)] if (message := drift_note(drift)) else []
    if doc.get("interrupted"):
        caveats.append(note("Interrupted: the steps that finished are shown; the modes may differ in steps."))
    intro: list[Any] = []
    unmeasured = [c for c in rows[0] if all(r.get(c) is None for r in rows)]
    intro.append(table(rows, [c for c in rows[0] if c not in unmeasured]))
    if unmeasured:
        why = ", ".join(f"{c} ({UNMEASURED_WHY.get(c, 'not in the runs')})" for c in unmeasured)
        intro.append(f'<p class="sub">Not measured here: {html.escape(why)}.</p>')
    if not has_base:
        intro.append(note(f"No '{baseline}' run in this comparison: ratios are not shown."))
    else:
        intro.append(
            '<p class="sub">Ratios are against the baseline run of the same process, prompts and seeds, '
            "the modes taking their steps in turn. speed-up = baseline step time / mode step time (the "
            "range: per round, step k of each); trained and generated throughput (tokens per rollout-second: "
            "what the update used, and all the engine generated) and reward: mode / baseline; the bubble's "
            "change in percentage points.</p>"
        )
    curves = _curves(runs)
    workload = doc.get("workload") or {}
    subtitle = " · ".join(f"{k}: {v}" for k, v in workload.items() if not isinstance(v, (dict, list)))
    # the first screen answers which mode is faster, by how much, why, and at what cost to what is trained
    sections = [
        *([("Read this first", caveats)] if caveats else []),
        ("The verdict", [verdict_html(verdict_lines(derived, doc.get("gpu_replay")))]),
        ("What each mode trades for its speed", [_ledger_table(derived["ledger"])]),
        ("The bubble", bubble),
        ("Where the step time went", parts or [note(f"No '{baseline}' run: no split against it.")]),
        ("Modes side by side", intro),
        ("Per-step curves", curves or [note("No per-step data.")]),
    ]
    return write_page(compare_dir / "report.html", "rlbench compare", sections, subtitle)


# The ratio columns of "Modes side by side", shown with their unit.
RATIO_COLUMNS = ("speed-up (step time)", "trained throughput ×", "generated throughput ×", "reward ×")


def verdict_html(lines: list[str]) -> str:
    """The verdict lines as a list, each mode's name in bold."""
    items = []
    for line in lines:
        mode, sep, rest = line.partition(": ")
        text = f"<b>{html.escape(mode)}</b>{sep}{html.escape(rest)}" if sep else html.escape(line)
        items.append(f"<li>{text}</li>")
    why = (
        '<p class="sub">Speed-up: baseline step time / the mode\'s, its decimals fitted to its range over '
        "rounds; each cause is the part of the step that moved most, per step, and why; what it costs in "
        "training is the ledger's (below); the replay is a model of the same schedule on a GPU, over the "
        'admission costs it sweeps ("GPU replay" below).</p>'
    )
    return f'<ul class="verdict">{"".join(items)}</ul>{why}'


def _curves(runs: list[dict[str, Any]]) -> list[Any]:
    """The per-step curves, one figure per metric any run has, a line per mode."""
    import plotly.graph_objects as go

    curves: list[Any] = []
    for key, title, unit, scale in CURVES:
        fig = _fig(title, "step", unit)
        for i, r in enumerate(runs):
            steps = r.get("steps") or []
            values = [trained_per_rollout_s(s) if key == TRAINED_LABEL else s.get(key) for s in steps]
            ys = [None if v is None else scale * v for v in values]
            if any(y is not None for y in ys):
                line = {"color": PALETTE[i % len(PALETTE)]}
                x = [s["step"] for s in steps]
                fig.add_trace(go.Scatter(x=x, y=ys, name=r["mode"], mode="lines+markers", line=line))
        if fig.data:
            curves.append(steps_axis(fig, [s["step"] for r in runs for s in r.get("steps") or []]))
    return curves


def _bubble_table(derived: dict[str, Any]) -> str:
    baseline = derived["baseline"]
    base = next((r["summary"].get("bubble_ratio") for r in derived["runs"] if r["mode"] == baseline), None)
    rows = [
        {
            "mode": r["mode"],
            "bubble (%)": percent(r["summary"].get("bubble_ratio")),
            "range over rounds (%)": span_text(derived["bubble_per_round"].get(r["mode"]), 100.0),
            "vs baseline (pts)": points(r["summary"].get("bubble_ratio"), base),
            "GPU idle in rollout (%)": percent(r["summary"].get("bubble_ratio_gpu")),
            **engine_cells(r["summary"]),  # where the run had more than one engine
        }
        for r in derived["runs"]
    ]
    keys = dict.fromkeys(k for row in rows for k in row)
    columns = [c for c in keys if any(row.get(c) not in (None, "") for row in rows)]
    why = (
        '<p class="sub">Bubble: the share of the rollout\'s slot-time (slots x rollout wall time) in which '
        "no sequence ran, over all steps (docs/metrics.md); the range is over the rounds, one step each.</p>"
    )
    if any(engine_cells(r["summary"]) for r in derived["runs"]):
        why += CAPTION
    return table(shown(rows, TABLE_FORMATS), columns) + why


# The ledger's columns at the precision they are read at (the JSON keeps every digit).
LEDGER_FORMATS = {"speed-up (step time)": "{:.2f}x", "length KS, trained vs generated": "{:.2f}",
                  "length KS vs baseline, same prompts": "{:.2f}", "longest 10% trained (%)": "{:.0f}",
                  "staleness mean": "{:.2f}", "reward, completed": "{:.3f}", "reward, all": "{:.3f}",
                  "trainer waits (%)": "{:.0f}", "rollout waits (%)": "{:.0f}"}  # fmt: skip


# The other tables' columns likewise: shares to a tenth of a point, seconds to hundredths, ratios in x.
TABLE_FORMATS = {"bubble (%)": "{:.1f}", "vs baseline (pts)": "{:+.1f}", "GPU idle in rollout (%)": "{:.1f}",
                 **{f"{p} (s)": "{:.2f}" for p in PHASES}, "step (s)": "{:.2f}", "speed-up": "{:.2f}x",
                 TRAINED_LABEL: "{:.0f}", GENERATED_LABEL: "{:.0f}"}  # fmt: skip


def shown(rows: list[dict[str, Any]], formats: dict[str, str]) -> list[dict[str, Any]]:
    """The rows with their numbers at the precision the table reads them at (the JSON keeps every digit)."""
    return [
        {k: formats[k].format(v) if k in formats and isinstance(v, (int, float)) else v for k, v in r.items()}
        for r in rows
    ]


def _ledger_table(rows: list[dict[str, Any]]) -> str:
    rows = shown(rows, LEDGER_FORMATS)
    columns = [c for c in rows[0] if any(row.get(c) is not None for row in rows)] if rows else []
    why = '<p class="sub">The bias and starvation ledger (docs/metrics.md), each number read here:</p>'
    return table(rows, columns) + why + legend_html()


def _bubble_figure(runs: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    fig = _fig("Bubble ratio per mode", "mode", "%")
    x, y = [r["mode"] for r in runs], [percent(r["summary"].get("bubble_ratio")) for r in runs]
    fig.add_trace(go.Bar(x=x, y=y, marker_color=[PALETTE[i % len(PALETTE)] for i in range(len(runs))]))
    return fig


def _parts_table(derived: dict[str, Any], runs: list[dict[str, Any]], baseline: str) -> str:
    rows = []
    for r in runs:
        parts = derived["parts"].get(r["mode"]) or {}
        secs = parts.get("seconds") or {}
        s = r["summary"]
        rows.append(
            {
                "mode": r["mode"],
                **{f"{p} (s)": secs.get(p) for p in PHASES},
                "step (s)": sum(secs.values()) if secs else None,
                "speed-up": parts.get("speedup"),
                # the baseline is the reference: it saved nothing against itself
                "produced by": "reference" if r["mode"] == baseline else produced_by(parts)[2:],
                "trained length mean / longest": lengths_text(s),
                TRAINED_LABEL: s.get("trained_tokens_per_rollout_s"),
                GENERATED_LABEL: s.get("rollout_tokens_per_s"),
            }
        )
    why = (
        '<p class="sub">Mean seconds per step. rollout: generation (wall time); update: the policy update, '
        "whose cost grows with the trained responses' lengths; reward: grading; other: weight sync and the "
        "gaps between phases. Held-out evaluation is outside the step. Generated tokens count aborted and "
        "carried-over ones; trained tokens are those the update used.</p>"
    )
    return table(shown(rows, TABLE_FORMATS)) + why


def _parts_figure(derived: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    fig = _fig("Step time in parts", "mode", "seconds per step")
    modes = list(derived["parts"])
    for i, phase in enumerate(PHASES):
        ys = [(derived["parts"][m].get("seconds") or {}).get(phase) for m in modes]
        fig.add_trace(go.Bar(name=phase, x=modes, y=ys, marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(barmode="stack")
    return fig
