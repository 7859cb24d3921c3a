"""What a rollout over several engines looks like on the profile and compare pages: each engine's bubble,
cross-engine idle with the straggler engine, dispatch imbalance and the engines lost mid-step
(docs/metrics.md), shown only where a run had more than one engine; and the mark a lost engine leaves on the
slot timeline (its tracks, from its loss on)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from reference_trainer.trace.schema import ENGINE_LOST
from rlbench.report.figures import Event, pct
from rlbench.report.page import table

CAPTION = (
    '<p class="sub">Engine bubble: 1 − an engine\'s slot-time / (its slots × the rollout wall time). '
    "Cross-engine idle: the share of engine-time (engines × first forward to last) in which an engine ran "
    "nothing while another ran. The straggler is the engine whose last forward ended last. Dispatch "
    "imbalance: the busiest engine's predicted tokens outstanding over the mean, once a batch is "
    "dispatched (1.00 = even), from the trace's dispatch events.</p>"
)
LOST_CAPTION = (
    '<p class="sub">Engines lost: an engine (a Ray actor) that died mid-step, from the trace\'s engine_lost '
    "event: the time is the trace's clock and the seconds into that step's rollout; its unfinished requests "
    "were dispatched again to the engines left, which finished the step.</p>"
)
LOST_COLOUR = "#d62728"


def loss_text(loss: dict[str, Any]) -> str:
    """One engine lost, in words: which engine, which step, when, how many requests went elsewhere."""
    into = loss.get("into_rollout_s")
    when = f"{loss['t']:.2f} s" + (f" ({into:.2f} s into its rollout)" if into is not None else "")
    return (
        f"engine {loss['engine']} lost in step {loss['step']} at {when}: "
        f"{loss['requests']} requests dispatched again"
    )


def multi_engine(summary: dict[str, Any]) -> bool:
    return len(summary.get("engine_bubble") or {}) > 1


def _engines_text(values: dict[str, Any], fmt: Any) -> str:
    return ", ".join(f"{w}: {fmt(v)}" for w, v in values.items()) or "—"


def engine_cells(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's multi-engine summary as table cells; none for a run on one engine."""
    if not multi_engine(summary):
        return {}
    imbalance = summary.get("dispatch_imbalance")
    lost = summary.get("engines_lost") or []
    return {
        "engine bubbles": _engines_text(summary["engine_bubble"], pct),
        "cross-engine idle": pct(summary.get("cross_engine_idle_share")),
        "straggler (steps per engine)": _engines_text(summary.get("straggler_steps") or {}, str),
        "dispatch imbalance": f"{imbalance:.2f}" if imbalance is not None else "n/a",
        **({"engines lost": "; ".join(loss_text(x) for x in lost)} if lost else {}),
    }


def engine_section(steps: Sequence[dict[str, Any]], summary: dict[str, Any]) -> list[Any]:
    """The run's multi-engine figures, then one row per step (and the engines lost, where one was)."""
    lost = summary.get("engines_lost") or []
    rows = [
        {
            "step": s["step"],
            "global bubble": pct(s.get("bubble_ratio")),
            "engine bubbles": _engines_text(s.get("engine_bubble") or {}, pct),
            "cross-engine idle": pct(s.get("cross_engine_idle_share")),
            "straggler": s.get("straggler_engine"),
            "dispatch imbalance": f"{s['dispatch_imbalance']:.2f}" if s.get("dispatch_imbalance") else "n/a",
            **(
                {"engine lost": "; ".join(loss_text(x) for x in lost if x["step"] == s["step"])}
                if lost
                else {}
            ),
        }
        for s in steps
    ]
    whole = {"step": "run", "global bubble": pct(summary.get("bubble_ratio")), **engine_cells(summary)}
    out = [table([whole]), CAPTION, table(rows)]
    if lost:
        cols = ("engine", "step", "t", "into_rollout_s", "requests")
        names = ("engine", "step", "time (s)", "into the rollout (s)", "requests dispatched again")
        out += [table([{n: x[c] for n, c in zip(names, cols, strict=True)} for x in lost]), LOST_CAPTION]
    return out


def _loss(ev: Event) -> dict[str, Any]:
    """An engine_lost event as the summary's `engines_lost` entry says it (without the rollout's start)."""
    return {
        "engine": ev["worker"],
        "step": ev.get("step", 0),
        "t": float(ev["t_start"]),
        "requests": ev["requests"],
    }


def mark_losses(fig: Any, events: Sequence[Event], labels: Sequence[str], end: float) -> list[str]:
    """On the slot timeline `fig` (tracks `labels`, "w<engine> slot <n>", drawn to time `end`), each engine
    lost by `end`: a cross at its loss on each of its tracks and a dashed line along them to `end` (it runs
    nothing after). Returns the caption that says so, or nothing where no engine was lost."""
    import plotly.graph_objects as go

    losses = [_loss(e) for e in events if e.get("kind") == ENGINE_LOST and float(e["t_start"]) <= end]
    for loss in losses:
        t, tracks = loss["t"], [s for s in labels if s.startswith(f"w{loss['engine']} ")]
        if not tracks:
            continue
        line = {"color": LOST_COLOUR, "width": 2, "dash": "dash"}
        xs, ys = [x for _ in tracks for x in (t, end, None)], [y for s in tracks for y in (s, s, None)]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=line, hoverinfo="skip", showlegend=False))
        cross = {"symbol": "x", "size": 11, "color": LOST_COLOUR}
        hover = [loss_text(loss)] * len(tracks)
        fig.add_trace(
            go.Scatter(
                x=[t] * len(tracks),
                y=tracks,
                mode="markers",
                marker=cross,
                hovertext=hover,
                hoverinfo="text",
                showlegend=False,
            )
        )
        note = {"text": f"engine {loss['engine']} lost", "font": {"color": LOST_COLOUR}}
        fig.add_annotation(x=t, y=tracks[0], showarrow=True, arrowcolor=LOST_COLOUR, ax=40, ay=-24, **note)
    if not losses:
        return []
    said = html.escape("; ".join(loss_text(x) for x in losses))
    return [f'<p class="sub">Red crosses and dashed lines: {said} (it runs nothing after).</p>']
