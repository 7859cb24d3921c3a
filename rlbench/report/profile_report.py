"""The profile report: one offline page from a run directory's metrics.json (+ trace.jsonl when present).

Reads only saved files, so `rlbench report DIR` re-renders without re-running anything. The slot-occupancy
timeline is built in timeline.py; shared plot helpers live in figures.py.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json
from reference_trainer.trace.schema import FORWARD_KINDS, HELDOUT, REWARD, ROLLOUT, SYNC, UPDATE
from rlbench.observe.nvml import no_gpu_note
from rlbench.report.engines import engine_section, loss_text, multi_engine
from rlbench.report.figures import (
    PALETTE,
    PHASE_COLOURS,
    Event,
    _fig,
    note,
    num,
    pct,
    shade_phases,
    steps_axis,
)
from rlbench.report.ledger_legend import cost_html
from rlbench.report.observe_report import observed_sections
from rlbench.report.page import kpis, table, write_page
from rlbench.report.replay_summary import replay_section
from rlbench.report.run_doc import load_run
from rlbench.report.timeline import slot_timeline

# The two throughputs a run has, always named: what the update trained on, and all the engine generated
# (aborted and carried-over tokens too). A mode can raise the second while lowering the first.
TRAINED_LABEL = "trained tokens/rollout-s"
GENERATED_LABEL = "generated tokens/rollout-s"


def trained_per_rollout_s(step: Event) -> float | None:
    """A step's trained tokens (its update batch's response lengths) per second of its rollout phase."""
    lengths, rollout_s = step.get("update_batch_lengths"), step.get("timing_s/gen")
    return sum(lengths) / rollout_s if lengths and rollout_s else None


def heldout_rows(steps: list[Event], heldout: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every held-out evaluation the run made: heldout.json's curve (the evaluations before their steps and
    the final policy's), else the step rows that carry one; with its time where it was measured."""
    took = {s["step"]: s.get("timing_s/heldout") for s in steps if s.get("timing_s/heldout")}
    curve = (heldout or {}).get("curve") or [
        {"step": s["step"], **{k: s[k] for k in ("greedy_acc", "pass1") if k in s}}
        for s in steps
        if "greedy_acc" in s
    ]
    last = max((s["step"] for s in steps), default=-1)
    return [
        {
            "evaluation": f"after step {p['step'] - 1} (final)"
            if p["step"] > last
            else f"before step {p['step']}",
            "samples consumed": p.get("samples"),
            "greedy accuracy": p.get("greedy_acc"),
            "pass@1": p.get("pass1"),
            "time (s)": (heldout or {}).get("final_eval_s") if p["step"] > last else took.get(p["step"]),
        }
        for p in curve
    ]


def learning_figure(steps: list[Event], heldout: dict[str, Any] | None) -> Any:
    """Training reward and held-out accuracy against samples consumed (heldout.json's curve)."""
    import plotly.graph_objects as go

    fig = _fig("Reward and held-out accuracy against samples consumed", "samples consumed", "")
    consumed, xs, rewards = 0, [], []
    for s in steps:
        consumed += s.get("samples") or len(s.get("update_batch_lengths") or [])
        xs.append(consumed)
        rewards.append(s.get("reward_mean"))
    fig.add_trace(go.Scatter(x=xs, y=rewards, name="training reward (batch mean)", mode="lines"))
    curve = (heldout or {}).get("curve") or []
    for key, name in (("greedy_acc", "held-out greedy accuracy"), ("pass1", "held-out pass@1")):
        x, y = [p["samples"] for p in curve], [p[key] for p in curve]
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers"))
    fig.update_yaxes(rangemode="tozero")
    return fig


PHASE_TIMES = ("timing_s/gen", "timing_s/reward", "timing_s/update", "timing_s/sync")
MAX_BOXES = 100  # steps whose response lengths are drawn as boxes


def _line(fig: Any, steps: list[Event], key: str, name: str, scale: float = 1.0) -> None:
    """A per-step line of `key` (scaled), where any step has it."""
    import plotly.graph_objects as go

    ys = [None if s.get(key) is None else scale * s[key] for s in steps]
    if any(y is not None for y in ys):
        fig.add_trace(go.Scatter(x=[s["step"] for s in steps], y=ys, name=name, mode="lines+markers"))


def step_figures(steps: list[Event], heldout: dict[str, Any] | None = None) -> list[tuple[str, list[Any]]]:
    """The profile page's per-step sections: bubbles, time, throughput, speculation, learning, responses."""
    x = [s["step"] for s in steps]
    bubble = _fig("Bubble ratio and tail-time share per step", "step", "%")
    _line(bubble, steps, "bubble_ratio", "bubble ratio (slots)", 100)
    _line(bubble, steps, "bubble_ratio_gpu", "bubble ratio (GPU, NVML)", 100)
    _line(bubble, steps, "tail_time_share", "tail time share", 100)
    bubble.update_yaxes(range=[0, 100])
    where = _time_figures(steps)
    thr = _throughput_figure(steps)
    for fig in (bubble, where[0], thr):
        steps_axis(fig, x)
    sections: list[tuple[str, list[Any]]] = [
        ("Bubbles", [bubble]),
        ("Where the time goes", where),
        ("Throughput", [thr]),
    ]
    if any(s.get("acceptance_rate") is not None for s in steps):
        acc = _fig("Speculative decoding per step", "step", "%")
        _line(acc, steps, "acceptance_rate", "acceptance rate", 100)
        _line(acc, steps, "draft_coverage", "draft coverage", 100)
        steps_axis(acc, x)
        sections.append(("Speculative decoding", [acc]))
    else:
        sections.append(("Speculative decoding", [note("No draft tokens in this run: acceptance is n/a.")]))
    sections += _learning_sections(steps, heldout)
    sections.append(("Responses", _response_figures(steps)))
    return sections


def _time_figures(steps: list[Event]) -> list[Any]:
    """Time per step by phase, and the held-out evaluations before the steps where there are any."""
    import plotly.graph_objects as go

    x = [s["step"] for s in steps]
    split = _fig("Time per step by phase", "step", "seconds")
    # the rollout's part: what the update waited for (all of it, unless the rollout ran ahead beside it)
    waited = "trainer_wait_s" if any(s.get("trainer_wait_s") is not None for s in steps) else "timing_s/gen"
    timed = ((waited, ROLLOUT), ("timing_s/reward", REWARD), ("timing_s/update", UPDATE))
    for key, name in (*timed, ("timing_s/sync", SYNC)):
        y = [s.get(key) or 0.0 for s in steps]
        split.add_trace(go.Bar(x=x, y=y, name=name, marker_color=PHASE_COLOURS[name]))
    # the rest of the step: gaps between phases, and work no phase covers (an imported run's checkpoints)
    other = [
        max(0.0, (s.get("step_time_s") or 0.0) - sum(s.get(k) or 0.0 for k in PHASE_TIMES)) for s in steps
    ]
    split.add_trace(go.Bar(x=x, y=other, name="other", marker_color=PHASE_COLOURS["other"]))
    split.update_layout(barmode="stack", legend_traceorder="normal")
    # The held-out evaluation runs before a step, outside it: shown apart so it does not dwarf the phases.
    heldout_s = [s.get("timing_s/heldout") or 0.0 for s in steps]
    if not any(heldout_s):
        return [split]
    evaluation = _fig("Held-out evaluation time before each step (outside the step time)", "step", "seconds")
    colour = PHASE_COLOURS[HELDOUT]
    evaluation.add_trace(go.Bar(x=x, y=heldout_s, name="held-out evaluation", marker_color=colour))
    steps_axis(evaluation, x)
    return [split, evaluation]


def _throughput_figure(steps: list[Event]) -> Any:
    import plotly.graph_objects as go

    thr = _fig("Rollout throughput per step: tokens per rollout-second", "step", "tokens/s")
    _line(thr, steps, "rollout_tokens_per_s", GENERATED_LABEL)
    trained = [trained_per_rollout_s(s) for s in steps]
    if any(t is not None for t in trained):  # dashed over the generated line (equal when all is trained)
        dashed = {"dash": "dash", "width": 3}
        x = [s["step"] for s in steps]
        thr.add_trace(go.Scatter(x=x, y=trained, name=TRAINED_LABEL, mode="lines+markers", line=dashed))
        thr.update_layout(legend_traceorder="reversed")  # the trained one first
    return thr


def _learning_sections(steps: list[Event], heldout: dict[str, Any] | None) -> list[tuple[str, list[Any]]]:
    """Reward and accuracy per step (beside the held-out curve), and the held-out evaluations' table."""
    sections: list[tuple[str, list[Any]]] = []
    if any(s.get("reward_mean") is not None or s.get("accuracy") is not None for s in steps):
        rew = _fig("Reward and accuracy per step", "step", "")
        _line(rew, steps, "reward_mean", "reward mean")
        _line(rew, steps, "accuracy", "accuracy")
        # without a format reward the two are equal: draw accuracy dashed over reward so both stay visible
        rew.update_traces(
            selector={"name": "accuracy"}, line={"dash": "dash", "width": 3}, marker={"symbol": "x"}
        )
        steps_axis(rew, [s["step"] for s in steps])
        learning = [rew, learning_figure(steps, heldout)] if heldout else [rew]
        sections.append(("Learning", learning))
    if rows := heldout_rows(steps, heldout):
        why = (
            '<p class="sub">Every held-out evaluation of the run: greedy accuracy and pass@1 on the held-out '
            "problems before the step it precedes (outside the step time), and last of the final policy.</p>"
        )
        sections.append(("Held-out evaluations", [table(rows), why]))
    return sections


def _response_figures(steps: list[Event]) -> list[Any]:
    """Each update batch's response lengths, and the consumed tokens' staleness."""
    import plotly.graph_objects as go

    boxed = [s for s in steps if s.get("update_batch_lengths")]
    every = max(1, math.ceil(len(boxed) / MAX_BOXES))  # a box per step: a long run's page stays small
    shown = "" if every == 1 else f" (one step in {every} of {len(boxed):,})"
    lens = _fig(f"Response lengths of each update batch{shown}", "step", "tokens")
    for s in boxed[::every]:
        box = {"showlegend": False, "boxpoints": False, "marker_color": PALETTE[0]}
        lens.add_trace(go.Box(y=s["update_batch_lengths"], name=str(s["step"]), **box))
    lens.update_xaxes(type="category")
    parts: list[Any] = [lens] if lens.data else [note("No finished sequences in the trace.")]
    hist: dict[int, int] = {}
    for s in steps:
        for k, v in s.get("staleness", {}).items():
            hist[int(k)] = hist.get(int(k), 0) + v
    if hist and set(hist) != {0}:
        st = _fig("Token staleness (policy versions behind the update)", "staleness", "tokens")
        st.add_trace(go.Bar(x=sorted(hist), y=[hist[k] for k in sorted(hist)], marker_color=PALETTE[4]))
        parts.append(st)
    elif hist:
        parts.append(note(f"All {sum(hist.values())} consumed tokens are on-policy (staleness 0)."))
    return parts


# NVML fields plotted, one figure each: (sample key, title, y-axis label, scale).
GPU_PANELS = (
    ("util", "GPU utilisation", "utilisation %", 1.0),
    ("mem_used_mib", "GPU memory used", "GiB", 1 / 1024),
    ("power_w", "GPU power", "watts", 1.0),
)


def gpu_section(gpu: dict[str, Any] | None, events: Sequence[Event]) -> list[Any]:
    """NVML utilisation, memory and power on the trace's clock, with rollout and update phases shaded, so
    a reader sees what the GPU did in each phase. A field the GPU does not report is left out."""
    import plotly.graph_objects as go

    samples = (gpu or {}).get("samples") or []
    if not (gpu or {}).get("available") or not samples:
        return [note(no_gpu_note(gpu))]
    names = {d["index"]: d.get("name") or f"GPU {d['index']}" for d in gpu.get("devices", [])}
    figures = []
    for key, title, unit, scale in GPU_PANELS:
        if all(s.get(key) is None for s in samples):
            continue
        fig = _fig(f"{title} (NVML; rollout and update phases shaded)", "time (s)", unit, height=300)
        for idx in sorted({s["gpu"] for s in samples}):
            pts = [s for s in samples if s["gpu"] == idx and s.get(key) is not None]
            x, y = [p["t"] for p in pts], [p[key] * scale for p in pts]
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"GPU {idx}: {names.get(idx, '')}"))
        shade_phases(fig, events, (ROLLOUT, UPDATE))
        if key == "util":
            fig.update_yaxes(range=[0, 105])
        figures.append(fig)
    return figures


def worker_section(events: Sequence[Event], summary: dict[str, Any]) -> list[Any]:
    """Busy intervals per worker (back-to-back engine steps merged) and each worker's idle share."""
    import plotly.graph_objects as go

    busy: dict[int, list[list[float]]] = {}
    forwards = [e for e in events if e.get("kind") in FORWARD_KINDS]
    for ev in sorted(forwards, key=lambda e: float(e["t_start"])):
        spans = busy.setdefault(int(ev.get("worker", 0)), [])
        if spans and float(ev["t_start"]) - spans[-1][1] < 1e-3:
            spans[-1][1] = max(spans[-1][1], float(ev["t_end"]))
        else:
            spans.append([float(ev["t_start"]), float(ev["t_end"])])
    fig = _fig("Worker busy time (merged engine steps)", "time (s)", "", height=120 + 40 * len(busy))
    for w, spans in sorted(busy.items()):
        marker = {"color": PALETTE[w % len(PALETTE)], "line": {"width": 0}}
        x, base = [e - s for s, e in spans], [s for s, _ in spans]
        y = [f"worker {w}"] * len(spans)
        fig.add_trace(go.Bar(orientation="h", y=y, x=x, base=base, showlegend=False, marker=marker))
    idle = summary.get("worker_idle_share") or {}
    rows = [{"worker": w, "idle share": v} for w, v in idle.items()]
    caption = (
        '<p class="sub">Idle share = 1 − busy time / the busiest worker\'s busy time, summed over steps '
        "(0 for the slowest worker; higher means worse load balance).</p>"
    )
    return [fig, caption, table(rows)]


def pyspy_links(pyspy: dict[str, Any] | None) -> list[Any]:
    if not pyspy:
        return []
    if not pyspy.get("available"):
        return [note(pyspy.get("reason") or "py-spy did not record.")]
    svg, ss = html.escape(pyspy["svg"]), html.escape(pyspy["speedscope"])
    return [
        f"<p>{pyspy.get('samples', '?')} samples at {pyspy.get('rate_hz', '?')} Hz: "
        f'<a href="{svg}">flame graph (SVG)</a> · <a href="{ss}">speedscope JSON</a> '
        f'(open in <a href="https://www.speedscope.app/">speedscope.app</a>)</p>'
    ]


def headline(doc: dict[str, Any]) -> str:
    s = doc.get("summary", {})
    if not doc.get("steps"):  # a wrapped command: no trace, so no slot metrics
        return kpis(
            {
                "wall time": num(s.get("wall_time_s"), " s"),
                "exit code": str(s.get("exit_code", "n/a")),
                "GPU idle share": pct(s.get("gpu_idle_share"))
                if s.get("gpu_idle_share") is not None
                else "n/a (no GPU)",
            }
        )
    acc = s.get("acceptance_rate")
    return kpis(
        {
            "bubble ratio": pct(s.get("bubble_ratio")),
            "GPU bubble ratio": pct(s.get("bubble_ratio_gpu"))
            if s.get("bubble_ratio_gpu") is not None
            else "n/a (no GPU)",
            TRAINED_LABEL: num(s.get("trained_tokens_per_rollout_s"), digits=4),
            GENERATED_LABEL: num(s.get("rollout_tokens_per_s"), digits=4),
            "mean step time": num(s.get("step_time_s"), " s"),
            "tail time share": pct(s.get("tail_time_share")),
            "acceptance": pct(acc) if acc is not None else "n/a (no drafts)",
            "reward (mean)": num(s.get("reward_mean")),
        }
    )


def _words(parts: Iterable[str]) -> str:
    return ", ".join(parts) or "—"


def summary_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary as a table; its maps read as words (staleness: tokens per lag; idle share per worker)."""
    rows = []
    for k, v in summary.items():
        if k == "staleness" and isinstance(v, dict):
            v = _words(f"{n:,} tokens {lag} version{'s' * (lag != '1')} old" for lag, n in v.items())
        elif k == "engines_lost" and isinstance(v, list):
            v = "; ".join(loss_text(x) for x in v) or "none"
        elif k == "worker_idle_share" and isinstance(v, dict):
            v = _words(f"worker {w}: {pct(share)}" for w, share in v.items())
        elif isinstance(v, dict):
            v = _words(f"{a}: {b:.3g}" if isinstance(b, float) else f"{a}: {b}" for a, b in v.items())
        rows.append({"metric": k, "value": "n/a" if v is None else v})
    return rows


NO_TRACE_NOTE = (
    "No rlbench trace for this run: per-step rollout metrics (bubble ratio, throughput, acceptance) need one."
)


def render_profile(
    run_dir: str | Path, doc: dict[str, Any] | None = None, events: Sequence[Event] | None = None
) -> Path:
    """Write run_dir/report.html from metrics.json (+ trace.jsonl), or from the given doc and events."""
    run_dir = Path(run_dir)
    if doc is None or events is None:
        loaded_doc, loaded_events = load_run(run_dir)
        doc = loaded_doc if doc is None else doc
        events = loaded_events if events is None else events
    steps = doc.get("steps") or []
    meta = doc.get("run") or {}
    subtitle = " · ".join(
        f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}"
        for k, v in meta.items()
        if v is not None and not isinstance(v, (dict, list))
    )
    top: list[Any] = [headline(doc)]
    if meta.get("command"):
        top.append(f"<p><code>{html.escape(shlex.join(meta['command']))}</code></p>")
    sections: list[tuple[str, Sequence[Any]]] = [("Summary", top)]
    if steps:  # beside the speed, what it costs in what is trained (the ledger, read on the spot)
        sections.append(("What the speed costs in training", [cost_html(doc.get("summary") or {})]))
    if doc.get("engine_metrics"):  # observed servers: gauges instead of the trainer's slot maps
        sections.extend(observed_sections(run_dir, doc, list(events)))
    if steps:
        if not doc.get("engine_metrics"):
            sections.append(("Slot occupancy", slot_timeline(events)))
        heldout_path = run_dir / "heldout.json"
        heldout = read_json(heldout_path) if heldout_path.is_file() else None
        sections.extend(step_figures(steps, heldout))
    else:
        sections.append(("Per-step metrics", [note(NO_TRACE_NOTE)]))
    sections.append(("GPU", gpu_section(doc.get("gpu"), events)))
    if doc.get("gpu_replay"):
        sections.append(("GPU replay (a model)", replay_section(doc["gpu_replay"])))
    if len((doc.get("summary") or {}).get("worker_idle_share") or {}) > 1:
        sections.append(("Rollout workers", worker_section(events, doc["summary"])))
    if multi_engine(doc.get("summary") or {}):
        engines = engine_section(steps, doc["summary"])
        sections.append(("Engines: bubble, cross-engine idle, dispatch", engines))
    if doc.get("pyspy"):
        sections.append(("CPU profile (py-spy)", pyspy_links(doc["pyspy"])))
    sections.append(("All summary metrics", [table(summary_rows(doc.get("summary") or {}))]))
    title = f"rlbench profile — {meta['mode']}" if meta.get("mode") else "rlbench profile"
    if doc.get("engine_metrics"):
        title = "rlbench observe — rollout servers" if meta.get("kind") == "observe" else title + " — servers"
    return write_page(run_dir / "report.html", title, sections, subtitle)
