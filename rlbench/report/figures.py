"""Plot helpers shared by the report pages: colours, number formatting, figure scaffolding."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from reference_trainer.trace.schema import HELDOUT, REWARD, ROLLOUT, SYNC, UPDATE

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]
PHASE_COLOURS = {
    ROLLOUT: "#4c78a8",
    REWARD: "#f58518",
    UPDATE: "#54a24b",
    SYNC: "#b279a2",
    HELDOUT: "#9d755d",
    "other": "#bab0ac",
}
Event = dict[str, Any]


def pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * float(v):.1f}%"


def num(v: Any, unit: str = "", digits: int = 3) -> str:
    return "n/a" if v is None else f"{float(v):.{digits}g}{unit}"


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _fig(title: str, xaxis: str, yaxis: str, height: int = 320) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 45},
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


SHADE_OPACITY = 0.12


def shade_phases(fig: Any, events: Sequence[Event], kinds: Sequence[str], label: str = "phase") -> Any:
    """Shade each event of `kinds` on the time axis in its phase colour, and name every shading in the
    legend (a legend-only entry per kind that occurs), so that a reader can tell the colours apart."""
    import plotly.graph_objects as go

    seen: list[str] = []
    for ev in events:
        if ev.get("kind") in kinds:
            fig.add_vrect(x0=ev["t_start"], x1=ev["t_end"], fillcolor=PHASE_COLOURS[ev["kind"]],
                          opacity=SHADE_OPACITY, line_width=0)  # fmt: skip
            if ev["kind"] not in seen:
                seen.append(ev["kind"])
    for kind in sorted(seen, key=list(kinds).index):
        name = "held-out evaluation" if kind == HELDOUT else kind
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="markers", name=f"shaded: {name} {label}", showlegend=True,
                       marker={"symbol": "square", "size": 14, "color": PHASE_COLOURS[kind], "opacity": 0.35})
        )  # fmt: skip
    return fig


def shading_legend(events: Sequence[Event], kinds: Sequence[str], label: str = "phase") -> str:
    """The shadings' names as HTML above a tall figure, where plotly's own legend would sit below its end,
    a screen or more down: a swatch per kind that occurs."""
    seen = [k for k in kinds if any(ev.get("kind") == k for ev in events)]
    swatch = '<span style="display:inline-block;width:12px;height:12px;background:{};opacity:0.35"></span>'
    named = "".join(
        f"{swatch.format(PHASE_COLOURS[k])} {html.escape('held-out evaluation' if k == HELDOUT else k)} "
        for k in seen
    )
    return f'<p class="sub">Shaded: {named}{html.escape(label)}s.</p>' if seen else ""


def steps_axis(fig: Any, x: Sequence[int]) -> Any:
    """Integer step ticks (plotly would put ticks at 0.2-step intervals on a short run)."""
    fig.update_xaxes(tickmode="linear", tick0=min(x) if x else 0, dtick=max(1, -(-len(set(x)) // 12)))
    return fig
