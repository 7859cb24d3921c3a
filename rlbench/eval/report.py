"""report.html of an eval run: estimators, per-problem correctness grid, response lengths, group accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbench.report.page import kpis, table, write_page

_MAX_GRID_ROWS = 800  # a heatmap beyond this is unreadable and bloats the page


def write_report(path: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    import plotly.graph_objects as go

    k = results["samples"]
    head = kpis(
        {
            f"avg@{k}": f"{results['accuracy']:.1%}",
            f"pass@{k}": f"{results['pass_at_k'][str(k)]:.1%}",
            f"maj@{k}": f"{results['maj_at_k'][str(k)]:.1%}",
            "problems": str(results["problems_evaluated"]),
        }
    )
    estimators = [{"estimator": "avg@k (accuracy)", "k": k, "value": results["accuracy"]}]
    estimators += [
        {"estimator": "pass@k (unbiased)", "k": int(kk), "value": v} for kk, v in results["pass_at_k"].items()
    ]
    estimators += [{"estimator": "maj@k", "k": int(kk), "value": v} for kk, v in results["maj_at_k"].items()]
    s = results["sampling"]
    settings = table(
        [
            {
                "model": results["model"],
                "engine": results["engine"],
                "template": results["template"],
                "temperature": s["temperature"],
                "top_p": s["top_p"],
                "max_tokens": s["max_tokens"],
                "seed": s["seed"],
                "grading failures": results["grading_failures"],
            }
        ]
    )
    sections: list[tuple[str, list[Any]]] = [("Accuracy", [head, table(estimators), settings])]

    grid_rows = rows[:_MAX_GRID_ROWS]
    if grid_rows:
        z = [[int(c) for c in r["correct"]] for r in grid_rows]
        text = [[f"{r['id']} #{j}: {e!r}" for j, e in enumerate(r["extracted"])] for r in grid_rows]
        grid = go.Figure(
            go.Heatmap(
                z=z,
                x=[f"s{j}" for j in range(k)],
                y=[r["id"] for r in grid_rows],
                text=text,
                hovertemplate="%{text}<extra></extra>",
                zmin=0,
                zmax=1,
                showscale=False,
                colorscale=[[0, "#d73027"], [1, "#1a9850"]],
                xgap=1,
                ygap=1,
            )
        )
        grid.update_layout(
            height=min(4000, 120 + 14 * len(grid_rows)),
            yaxis={"autorange": "reversed"},
            margin={"l": 160, "r": 20, "t": 20, "b": 40},
            xaxis_title="sample",
        )
        note = (
            ""
            if len(rows) <= _MAX_GRID_ROWS
            else f"<p class='note'>first {_MAX_GRID_ROWS} problems shown</p>"
        )
        sections.append(("Per-problem correctness (green = correct)", [note, grid] if note else [grid]))

        unit = "tokens" if all(r.get("response_tokens") for r in rows) else "chars"
        lengths = {True: [], False: []}  # type: dict[bool, list[int]]
        for r in rows:
            for n, ok in zip(r[f"response_{unit}"], r["correct"], strict=True):
                lengths[ok].append(n)
        hist = go.Figure()
        for ok, name, color in ((True, "correct", "#1a9850"), (False, "wrong", "#d73027")):
            hist.add_trace(go.Histogram(x=lengths[ok], name=name, marker_color=color, opacity=0.7, nbinsx=40))
        hist.update_layout(
            barmode="overlay", xaxis_title=f"response length ({unit})", yaxis_title="responses", height=380
        )
        sections.append(("Response length", [hist]))

    for field, groups in results["by_group"].items():
        bars = go.Figure(
            go.Bar(
                x=[str(g[field]) for g in groups],
                y=[g["accuracy"] for g in groups],
                text=[f"n={g['problems']}" for g in groups],
            )
        )
        bars.update_layout(yaxis={"title": "accuracy", "range": [0, 1]}, xaxis_title=field, height=340)
        sections.append((f"Accuracy by {field}", [table(groups), bars]))

    worst = [
        {
            "id": r["id"],
            "gold": r["gold"],
            "extracted": ", ".join(str(e) for e in r["extracted"][:4]),
            "correct": f"{r['n_correct']}/{len(r['correct'])}",
        }
        for r in rows
        if r["n_correct"] == 0
    ][:50]
    if worst:
        sections.append(("Problems never solved (first 50)", [table(worst)]))
    title = f"rlbench eval: {results['title']}"
    return write_page(
        path, title, sections, subtitle=f"{results['model']} · {results['engine']} engine · {k} samples"
    )
