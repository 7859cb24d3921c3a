"""simulate.json -> report.html: scaling curves and a table per (policy, worker count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbench.report.page import kpis, table, write_page

RATIOS = ("speedup", "rollout_speedup", "bubble_ratio", "worker_idle_share")
COLUMNS = ("policy", "workers", *RATIOS, "step_time_s", "rollout_s", "update_s", "rollout_tokens_per_s")
COLUMNS += ("wasted_token_share", "draft_len")


def _curve(results: list[dict[str, Any]], key: str, title: str, log_y: bool = False) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for name in dict.fromkeys(r["policy"] for r in results):
        rows = [r for r in results if r["policy"] == name]
        x, y = [r["workers"] for r in rows], [r[key] for r in rows]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name))
    fig.update_layout(title=title, height=380, margin={"t": 50, "b": 40})
    workers = sorted({r["workers"] for r in results})
    # a tick at every simulated worker count, and labelled 1-2-5 ticks on a log y axis that spans less than a
    # decade (plotly's default labels only powers of ten there, i.e. none)
    fig.update_xaxes(
        type="log", title="rollout workers", tickvals=workers, ticktext=[str(w) for w in workers]
    )
    if log_y:
        fig.update_yaxes(type="log", dtick="D2", tickformat=".3~g")
    return fig


def render(doc: dict[str, Any], out_dir: str | Path) -> Path:
    results = doc["results"]
    wl, cm = doc["workload"], doc["cost_model"]
    best = max(
        (r for r in results if r["policy"] != "baseline"), key=lambda r: r["speedup"] or 0, default=None
    )
    largest = max(doc["cluster"]["workers"])
    base_big = next(r for r in results if r["policy"] == "baseline" and r["workers"] == largest)
    head = kpis(
        {
            "workers": ", ".join(str(w) for w in doc["cluster"]["workers"]),
            "cost model": str(cm["name"]),
            f"baseline bubble @ {largest}": f"{base_big['bubble_ratio']:.1%}",
            "best speed-up": f"{best['speedup']:.2f}x {best['policy']} @ {best['workers']}" if best else "-",
        }
    )
    notes = (
        '<p class="note">Simulated, not measured: step times come from the cost model below. Speed-ups are '
        "ratios against <code>baseline</code> at the same worker count; SortedRL trains the B groups that "
        "complete first, so its step trains fewer tokens when short groups win (see trained tokens/s).</p>"
    )
    wl_rows = [{"field": k, "value": v} for k, v in wl.items()]
    cm_rows = [{"field": k, "value": str(v)} for k, v in cm.items()]
    curves = [
        _curve(results, "speedup", "step-time speed-up over baseline"),
        _curve(results, "bubble_ratio", "bubble ratio (share of idle slot-time in rollout)"),
        _curve(results, "worker_idle_share", "worker idle share (1 - busy / slowest worker)"),
        _curve(results, "step_time_s", "step time (s)", log_y=True),
    ]
    sections = [
        ("Summary", [head, notes]),
        ("Scaling", curves),
        ("Results", [table([{c: r.get(c) for c in COLUMNS} for r in results], COLUMNS)]),
        ("Workload", [table(wl_rows)]),
        ("Cost model", [table(cm_rows)]),
    ]
    subtitle = f"{wl['source']} — {doc['elapsed_s']:.1f} s to simulate"
    return write_page(Path(out_dir) / "report.html", "rlbench simulate", sections, subtitle=subtitle)
