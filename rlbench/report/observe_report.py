"""Report sections for observed rollout servers (`rlbench observe`, `profile --engine-metrics`).

The per-step plots (bubble, throughput) are the profile report's own, drawn from the derived trace; these
sections add what only the servers' gauges show: running and waiting requests against capacity per server,
KV-cache use, the per-server table and the what-if replay through the simulator.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import ROLLOUT
from rlbench.report.figures import PALETTE, _fig, note, num, pct
from rlbench.report.page import table

MAX_DRAWN = 16  # servers drawn in a figure; the table lists every one


def occupancy_figure(rows: list[dict[str, Any]], doc: dict[str, Any], events: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    urls = doc["run"].get("servers") or []
    caps = doc["run"].get("capacity") or {}
    per_server: dict[int, list[dict[str, Any]]] = {}
    for r in rows:  # one pass: a list per server, not a scan of every row per server
        if "error" not in r:
            per_server.setdefault(int(r["server"]), []).append(r)
    # The busiest servers only: a page of 300 servers' lines is unreadable, and plotly takes a minute on it.
    drawn = sorted(
        sorted(per_server, key=lambda s: -sum(r.get("running") or 0 for r in per_server[s]))[:MAX_DRAWN]
    )
    some = f"; the {len(drawn)} busiest of {len(per_server)} servers" if len(drawn) < len(per_server) else ""
    title = f"Slot occupancy per server (running requests; dashed: capacity; dotted: waiting{some})"
    fig = _fig(title, "time (s)", "requests", height=360)
    for s in drawn:
        mine = per_server[s]
        label = urls[s] if s < len(urls) else f"server {s}"
        colour = PALETTE[s % len(PALETTE)]
        t = [r["t"] for r in mine]
        fig.add_trace(go.Scatter(x=t, y=[r.get("running") for r in mine], name=f"{label} running",
                                 mode="lines", line={"color": colour, "shape": "hv"}))  # fmt: skip
        dotted = {"color": colour, "dash": "dot", "shape": "hv"}
        waiting = [r.get("waiting") for r in mine]
        fig.add_trace(go.Scatter(x=t, y=waiting, name=f"{label} waiting", mode="lines", line=dotted))
        if str(s) in caps or s in caps:
            cap = caps.get(str(s), caps.get(s))
            fig.add_hline(y=cap, line_dash="dash", line_color=colour, opacity=0.6)
    phases = [ev for ev in events if ev["kind"] == ROLLOUT]
    # One layout update for every phase (add_vrect per phase is quadratic in plotly), after the capacity
    # lines add_hline made, which it keeps.
    rect = {"type": "rect", "xref": "x", "yref": "paper", "y0": 0, "y1": 1, "fillcolor": "#4c78a8",
            "opacity": 0.08, "line": {"width": 0}}  # fmt: skip
    phases = [{**rect, "x0": ev["t_start"], "x1": ev["t_end"]} for ev in events if ev["kind"] == ROLLOUT]
    fig.update_layout(shapes=[*fig.layout.shapes, *phases])
    return fig


def kv_figure(rows: list[dict[str, Any]], urls: list[str]) -> Any | None:
    import plotly.graph_objects as go

    if all(r.get("kv_usage") is None for r in rows):
        return None
    fig = _fig("KV-cache use per server", "time (s)", "%", height=260)
    for s in sorted({int(r["server"]) for r in rows})[:MAX_DRAWN]:
        mine = [r for r in rows if int(r["server"]) == s and r.get("kv_usage") is not None]
        name = urls[s] if s < len(urls) else f"server {s}"
        x, y = [r["t"] for r in mine], [100 * r["kv_usage"] for r in mine]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name))
    return fig


def server_table(doc: dict[str, Any]) -> str:
    rows = []
    for label, s in doc["engine_metrics"]["servers"].items():
        rows.append({
            "server": label, "phases": s["phases"], "bubble ratio": pct(s["bubble_ratio"]),
            "tail time share": pct(s["tail_time_share"]),
            "tokens/s": num(s["rollout_tokens_per_s"], digits=4),
            "requests": s["finished_requests"], "waiting (mean / max)": f"{num(s['waiting_mean'])} / "
            f"{s['waiting_max']:.0f}", "time with a queue": pct(s["queued_time_share"]),
            "longest response (≤ tokens)": num(s["longest_response_tokens"], digits=5),
            "longest / rollout time (tok/s)": num(s["longest_sample_tokens_per_s"], digits=4),
        })  # fmt: skip
    return table(rows)


def dispatch_parts(whatif: dict[str, Any]) -> list[Any]:
    """The what-if's best dispatch policy for this log: one line and the policies' table; a note where there
    is nothing to choose (one engine)."""
    best = whatif.get("best_dispatch") or {}
    if not best.get("available"):
        return [note(f"Dispatch: {best.get('reason', 'not replayed')}")] if best else []
    rows = [{"dispatch": r["policy"], "predicted step time (s)": num(r["step_time_s"]),
             "predicted bubble": pct(r["bubble_ratio"]), "engine idle": pct(r["worker_idle_share"])}
            for r in best["policies"]]  # fmt: skip
    return [f'<p class="sub">Best dispatch (predicted): {html.escape(best["line"])}.</p>', table(rows)]


def whatif_section(whatif: dict[str, Any], observed: float | None) -> list[Any]:
    if not whatif.get("available"):
        return [note(f"No prediction: {whatif.get('reason')}")]
    rows = [{"mode": r["mode"], "predicted bubble": pct(r["bubble_ratio"]),
             "predicted step time (s)": num(r["step_time_s"]), "speed-up vs baseline": num(r["speedup"]),
             "rollout speed-up": num(r["rollout_speedup"])} for r in whatif["results"]]  # fmt: skip
    w = whatif["workload"]
    text = (
        f"The observed requests ({w['sequences']} in {w['steps']} phase(s), lengths from "
        f"{whatif['lengths']}; mean {w['response_tokens_mean']:.0f}, max {w['response_tokens_max']} tokens) "
        f"replayed by <code>rlbench simulate</code> on {whatif['servers']} worker(s) × "
        f"{whatif['capacity_per_server']} slots, {html.escape(whatif['cost_model'])}. Observed bubble "
        f"{pct(observed)}; the baseline's predicted one shows how close the cost model comes to this server. "
        "A server does not know an RL step's prompt groups: each request is its own prompt unless a request "
        "log says otherwise, so HistoSpec acceptance and HistoPipe predictions are the simulator's defaults."
    )
    return [f'<p class="sub">{text}</p>', table(rows), *dispatch_parts(whatif)]


def observed_sections(
    run_dir: Path, doc: dict[str, Any], events: list[dict[str, Any]]
) -> list[tuple[str, list]]:
    em = doc["engine_metrics"]
    samples = run_dir / "samples.jsonl"
    rows = read_jsonl(samples) if samples.is_file() else []
    urls = doc["run"].get("servers") or []
    source = ", ".join(html.escape(u) for u in urls)
    head = [
        f'<p class="sub">Source: Prometheus metrics of {source}, {em["samples"]} scrapes '
        f"({em['failed_scrapes']} failed) every {doc['run'].get('interval_s')} s.</p>"
    ]
    head += [note(n) for n in em.get("notes") or []]
    parts: list[Any] = [*head, occupancy_figure(rows, doc, events)] if rows else head
    if rows and (kv := kv_figure(rows, urls)) is not None:
        parts.append(kv)
    return [
        ("Rollout servers (observed)", [*parts, server_table(doc)]),
        (
            "What would SortedRL / RhymeRL buy here?",
            whatif_section(em["whatif"], doc["summary"].get("bubble_ratio")),
        ),
    ]
