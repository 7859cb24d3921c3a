"""What a rollout over several engines looks like on the profile and compare pages: each engine's bubble,
cross-engine idle with the straggler engine, and dispatch imbalance (docs/metrics.md), shown only where a run
had more than one engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlbench.report.figures import pct
from rlbench.report.page import table

CAPTION = (
    '<p class="sub">Engine bubble: 1 − an engine\'s slot-time / (its slots × the rollout wall time). '
    "Cross-engine idle: the share of engine-time (engines × first forward to last) in which an engine ran "
    "nothing while another ran. The straggler is the engine whose last forward ended last. Dispatch "
    "imbalance: the busiest engine's predicted tokens outstanding over the mean, once a batch is "
    "dispatched (1.00 = even), from the trace's dispatch events.</p>"
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
    return {
        "engine bubbles": _engines_text(summary["engine_bubble"], pct),
        "cross-engine idle": pct(summary.get("cross_engine_idle_share")),
        "straggler (steps per engine)": _engines_text(summary.get("straggler_steps") or {}, str),
        "dispatch imbalance": f"{imbalance:.2f}" if imbalance is not None else "n/a",
    }


def engine_section(steps: Sequence[dict[str, Any]], summary: dict[str, Any]) -> list[Any]:
    """The run's multi-engine figures, then one row per step."""
    rows = [
        {
            "step": s["step"],
            "global bubble": pct(s.get("bubble_ratio")),
            "engine bubbles": _engines_text(s.get("engine_bubble") or {}, pct),
            "cross-engine idle": pct(s.get("cross_engine_idle_share")),
            "straggler": s.get("straggler_engine"),
            "dispatch imbalance": f"{s['dispatch_imbalance']:.2f}" if s.get("dispatch_imbalance") else "n/a",
        }
        for s in steps
    ]
    whole = {"step": "run", "global bubble": pct(summary.get("bubble_ratio")), **engine_cells(summary)}
    return [table([whole]), CAPTION, table(rows)]
