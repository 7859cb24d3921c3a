"""The page of an imported run (TRL, verl, a length log): rlbench's metrics from the rebuilt trace, the
framework's own figures beside them, what its logs cannot tell, and the what-if replay (a prediction)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json
from reference_trainer.trace.schema import read_trace
from rlbench.report.figures import Event, _fig, note, num, pct, steps_axis
from rlbench.report.observe_report import dispatch_parts
from rlbench.report.page import table, write_page
from rlbench.report.profile_report import kpis, step_figures, summary_rows
from rlbench.report.run_doc import check_profile_doc
from rlbench.report.timeline import slot_timeline


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else value


def whatif_rows(whatif: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"workers": r["workers"], "mode": r["mode"], "predicted bubble": pct(r["bubble_ratio"]),
             "worker idle": pct(r["worker_idle_share"]), "predicted step time (s)": num(r["step_time_s"]),
             "speed-up vs baseline": num(r["speedup"]), "rollout speed-up": num(r["rollout_speedup"])}
            for r in whatif["results"]]  # fmt: skip


def estimates(rows: list[dict[str, Any]]) -> list[Any]:
    """The per-step shares a framework's log gives without per-sample data: rollout share and the
    bubble_if_concurrent estimates."""
    import plotly.graph_objects as go

    fig = _fig("Rollout share and bubble_if_concurrent (1 - mean/max) per step", "step", "%")
    x = [r["step"] for r in rows]
    for key in ("rollout share", "bubble_if_concurrent (lengths)", "bubble_if_concurrent (sample times)"):
        ys = [None if r.get(key) is None else 100 * r[key] for r in rows]
        if any(y is not None for y in ys):
            fig.add_trace(go.Scatter(x=x, y=ys, name=key, mode="lines+markers"))
    fig.update_yaxes(range=[0, 100])
    return [steps_axis(fig, x)]


def _variance(split: dict[str, Any]) -> list[Any]:
    if split.get("within_share") is None:
        return [note("Every sample has the same length: no variance to split.")]
    text = (
        f"{pct(split['within_share'])} of the response-length variance lies within prompt groups and "
        f"{pct(split['between_share'])} between them (deviations from each step's mean; group sizes "
        f"{', '.join(map(str, split['group_sizes']))}). A per-prompt length predictor (HistoPipe's history) "
        "can at best explain the between-group part; the within-group part is what only SortedRL-style "
        "early updates or partial rollouts remove."
    )
    return [f'<p class="sub">{text}</p>']


def render_import(run_dir: str | Path, doc: dict[str, Any], events: Sequence[Event]) -> Path:
    run_dir = Path(run_dir)
    run, info = doc.get("run") or {}, doc.get("integration") or {}
    steps = doc.get("steps") or []
    how = "".join(f"<li>{html.escape(str(x))}</li>" for x in info.get("method") or [])
    cannot = "".join(f"<li>{html.escape(str(x))}</li>" for x in info.get("limits") or [])
    unit = run.get("time_unit") or "s"
    top = [_headline(doc, unit), f"<ul>{how}</ul>" if how else ""]
    if unit != "s":
        clockless = f"This log has no clock: times on this page are in {run['time_unit']}s, not seconds."
        top.insert(0, note(clockless))
    sections: list[tuple[str, Sequence[Any]]] = [("Summary", top)]
    if cannot:
        sections.append(("What these logs cannot tell", [f"<ul>{cannot}</ul>"]))
    if any(e.get("slots") for e in events):
        sections.append(("Slot occupancy (rebuilt from the lengths)", slot_timeline(events)))
    if info.get("per_step"):
        rows = [{k: _cell(v) for k, v in r.items()} for r in info["per_step"]]
        framework = run.get("framework", "framework")
        sections.append((f"{framework}'s own figures beside rlbench's", [table(rows)]))
    if steps:
        measured = any(st.get("bubble_ratio") is not None for st in steps)
        # an imported run has no drafts; without rebuilt slots it has no bubble, throughput or lengths either
        keep = {"Where the time goes", "Learning"} | (
            {"Bubbles", "Throughput", "Responses"} if measured else set()
        )
        sections.extend(sec for sec in step_figures(steps) if sec[0] in keep)
        if not measured and info.get("per_step"):
            title = "Estimates from the framework's log (not measurements)"
            sections.append((title, estimates(info["per_step"])))
    if info.get("length_variance"):
        sections.append(("Length variance: within groups vs between", _variance(info["length_variance"])))
    whatif = doc.get("whatif") or {}
    if whatif.get("available"):
        text = (
            f"Replayed through <code>rlbench simulate</code> ({html.escape(whatif['label'])}): "
            f"{html.escape(whatif['cost_model'])}, {whatif['slots_per_worker']} slots per worker, each "
            f"worker given {whatif['groups_per_worker']} groups per step (the logged batch per step), "
            f"{whatif.get('steps_replayed', 'all')} step(s) replayed. "
            + "; ".join(html.escape(line) for line in whatif.get("sampling") or [])
        )
        body = [f'<p class="sub">{text}</p>', table(whatif_rows(whatif)), *dispatch_parts(whatif)]
        sections.append(("What each mode would buy here (predicted)", body))
    else:
        sections.append(("What each mode would buy here", [note(f"No prediction: {whatif.get('reason')}")]))
    sections.append(("All summary metrics", [table(summary_rows(doc.get("summary") or {}))]))
    subtitle = " · ".join(
        f"{k}: {v}" for k, v in run.items() if v is not None and not isinstance(v, (dict, list))
    )
    if unit != "s":  # every chart's time axis and rate in the log's own unit, as the note above says
        sections = [(title, [_relabel(part, unit) for part in parts]) for title, parts in sections]
    title = f"rlbench import — {run.get('framework', 'run')}"
    return write_page(run_dir / "report.html", title, sections, subtitle)


def _headline(doc: dict[str, Any], unit: str) -> str:
    """An imported run's headline. Its bubble is over decode steps where the slots were rebuilt from
    lengths (no clock needed: the TRL callback and `import trl` of its output_dir say the same figure), else
    the trace's; times and rates are in the log's own unit."""
    s, info = doc.get("summary", {}), doc.get("integration") or {}
    bubble = "bubble ratio (decode steps)" if "bubble_decode_steps" in info else "bubble ratio"
    return kpis(
        {
            bubble: pct(info.get("bubble_decode_steps", s.get("bubble_ratio"))),
            # trained first: the tokens an update learns from, then the tokens the rollout generated
            f"trained tokens per rollout-{unit}": num(s.get("trained_tokens_per_rollout_s"), digits=4),
            f"generated tokens per rollout-{unit}": num(s.get("rollout_tokens_per_s"), digits=4),
            "mean step time": num(s.get("step_time_s"), " s" if unit == "s" else f" {unit}s"),
            "tail time share": pct(s.get("tail_time_share")),
            "reward (mean)": num(s.get("reward_mean")),
        }
    )


def _relabel(part: Any, unit: str) -> Any:
    """A figure's titles with seconds read as `unit`s (an HTML part is left as it is)."""
    if not hasattr(part, "layout"):
        return part

    def say(text: str | None) -> str | None:
        if not text:
            return text
        text = text.replace("tokens/s", f"tokens per {unit}").replace("wall time", f"{unit}s")
        return text.replace("(s)", f"({unit}s)").replace("seconds", f"{unit}s")

    part.layout.title.text = say(part.layout.title.text)
    for axis in (part.layout.xaxis, part.layout.yaxis):
        axis.title.text = say(axis.title.text)
    return part


def is_import_run(run_dir: Path) -> bool:
    """A run folder written by rlbench.integrations (its metrics.json says run.kind = "import")."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return False
    doc = read_json(path)
    return isinstance(doc, dict) and isinstance(doc.get("run"), dict) and doc["run"].get("kind") == "import"


def rerender(run_dir: Path) -> Path:
    """`rlbench report DIR` on an imported run: the page again from its saved metrics.json and trace."""
    doc = check_profile_doc(read_json(run_dir / "metrics.json"), run_dir / "metrics.json")
    trace = run_dir / "trace.jsonl"
    return render_import(run_dir, doc, read_trace(trace) if trace.is_file() else [])
