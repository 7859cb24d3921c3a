"""The slot-occupancy timeline: which sequence held which engine slot when, coloured by prompt group.

Consecutive engine steps in which a slot held the same sequence merge into one bar, so ~10^4 engine events
become about one bar per sequence; past `MAX_BARS` bars only the first steps are drawn (the page says so).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from reference_trainer.trace.schema import FORWARD_KINDS, HELDOUT, REWARD, ROLLOUT, SEQUENCE, SYNC, UPDATE
from rlbench.report.engines import mark_losses
from rlbench.report.figures import PALETTE, Event, _fig, note, shade_phases, shading_legend

MAX_BARS = 20_000


def slot_bars(events: Sequence[Event], max_bars: int = MAX_BARS) -> tuple[list[dict[str, Any]], str]:
    """Merged (worker, slot, seq, start, end, step) bars from engine events; the note says what was cut."""
    by_step: dict[int, list[Event]] = {}
    for ev in events:
        if ev.get("kind") in FORWARD_KINDS and ev.get("slots"):
            by_step.setdefault(int(ev.get("step", 0)), []).append(ev)
    bars: list[dict[str, Any]] = []
    steps = sorted(by_step)
    shown: list[int] = []
    for step in steps:
        step_bars: list[dict[str, Any]] = []
        open_: dict[tuple[int, str], dict[str, Any]] = {}  # (worker, slot) -> bar being extended
        for ev in sorted(by_step[step], key=lambda e: (int(e.get("worker", 0)), float(e["t_start"]))):
            w = int(ev.get("worker", 0))
            current = {(w, str(k)): v for k, v in ev["slots"].items()}
            for key in [k for k in open_ if k[0] == w and current.get(k) != open_[k]["seq"]]:
                step_bars.append(open_.pop(key))  # the slot was freed or handed to another sequence
            for key, sid in current.items():
                bar = open_.get(key)
                if bar is None:
                    span = {"start": float(ev["t_start"]), "end": float(ev["t_end"])}
                    open_[key] = {"worker": w, "slot": key[1], "seq": sid, **span, "step": step}
                else:
                    bar["end"] = float(ev["t_end"])
        step_bars.extend(open_.values())
        if bars and len(bars) + len(step_bars) > max_bars:
            break
        bars.extend(step_bars)
        shown.append(step)
    if len(shown) == len(steps):
        return bars, ""
    return (
        bars,
        f"Showing steps {shown[0]}–{shown[-1]} of {steps[0]}–{steps[-1]} (capped at {max_bars} bars).",
    )


def _mark_phases(fig: Any, phases: list[Event]) -> None:
    """Shade the non-rollout phases, so the gaps between rollouts read as what they are (named above the
    figure: its legend sits below its end), and label each rollout with its step (up to 20: more labels
    than that would overlap)."""
    shade_phases(fig, phases, (REWARD, UPDATE, SYNC, HELDOUT))
    fig.update_layout(showlegend=False)
    rollouts = [ev for ev in phases if ev.get("kind") == ROLLOUT]
    if len(rollouts) > 20:
        return
    line = {"line_dash": "dot", "line_color": "#555", "line_width": 1}
    placed = {"annotation_position": "top right", "annotation_yanchor": "bottom"}
    for ev in rollouts:
        fig.add_vline(x=ev["t_start"], **line, annotation_text=f"step {ev['step']}", **placed)


def slot_timeline(events: Sequence[Event]) -> list[Any]:
    import plotly.graph_objects as go

    bars, msg = slot_bars(events)
    if not bars:
        return [note("No engine events with slot maps in the trace: nothing to draw.")]
    prompt_of = {e["id"]: str(e.get("prompt_id")) for e in events if e.get("kind") == SEQUENCE}
    groups: dict[str, int] = {}
    multi = len({b["worker"] for b in bars}) > 1
    for b in bars:
        b["prompt"] = prompt_of.get(b["seq"], "?")
        groups.setdefault(b["prompt"], len(groups))
        b["label"] = f"w{b['worker']} slot {b['slot']}" if multi else f"slot {b['slot']}"
    labels = sorted(
        {b["label"] for b in bars},
        key=lambda s: [int(p) if p.isdigit() else p for p in s.replace("w", "").split()],
    )
    fig = _fig("Slot occupancy (bar = one sequence in one slot; colour = prompt group)", "time (s)", "")
    y, x, base = [b["label"] for b in bars], [b["end"] - b["start"] for b in bars], [b["start"] for b in bars]
    marker = {"color": [PALETTE[groups[b["prompt"]] % len(PALETTE)] for b in bars], "line": {"width": 0}}
    hover = [
        f"seq {b['seq']}<br>prompt {b['prompt']}<br>step {b['step']}<br>{b['start']:.3f}–{b['end']:.3f} s"
        for b in bars
    ]
    bar = {"orientation": "h", "hoverinfo": "text", "showlegend": False}
    fig.add_trace(go.Bar(y=y, x=x, base=base, marker=marker, hovertext=hover, **bar))
    shown = {b["step"] for b in bars}
    phases = [ev for ev in events if int(ev.get("step", 0)) in shown]
    _mark_phases(fig, phases)
    lost = mark_losses(fig, events, labels, max(b["end"] for b in bars))  # where an engine died mid-step
    yaxis = {"categoryorder": "array", "categoryarray": labels[::-1]}
    fig.update_layout(height=min(1400, 140 + 14 * len(labels)), bargap=0.15, yaxis=yaxis)
    legend = f"{len(bars)} bars, {len(groups)} prompt groups (colours repeat every {len(PALETTE)} groups)."
    parts: list[Any] = [shading_legend(phases, (REWARD, UPDATE, SYNC, HELDOUT)), fig]
    parts += [f'<p class="sub">{html.escape(legend)}</p>', *lost]
    if msg:
        parts.append(note(msg))
    return parts
