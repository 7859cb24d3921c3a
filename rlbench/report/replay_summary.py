"""The GPU replay (rlbench/simulate/gpu_replay.py) as `compare` and `profile` print it and their pages show
it: labelled a model, naming its calibration, the swept terms' values, each figure beside the measured one."""

from __future__ import annotations

from typing import Any

from rlbench.report.figures import note
from rlbench.report.page import table

# A swept term's values in a readable unit: its unit's seconds ("s per ...") scaled.
SWEEP_SCALE = {
    "prefill": (1e3, "ms"),
    "update": (1e6, "µs"),
    "host": (1e3, "ms"),
    "update_residual": (1e3, "ms"),
}


def _values(term: str, values: list[float], unit: str) -> str:
    scale, prefix = SWEEP_SCALE.get(term, (1.0, "s"))
    return " / ".join(f"{scale * v:g}" for v in values) + f" {prefix}{unit.removeprefix('s')}"


def header(doc: dict[str, Any]) -> list[str]:
    """What the figures are: a model, on which GPU, from which calibration; its measured and swept terms."""
    cal = doc.get("calibration")
    if not cal:
        return [f"GPU replay: none ({doc.get('why', 'no calibration')})"]
    swept = "; ".join(f"{t} at {_values(t, s['values'], s['unit'])}" for t, s in cal["swept"].items())
    return [
        f"GPU replay (a model, not a measurement): each forward of the run at its cost on {cal['device']}, "
        f"calibration {cal['name']} ({cal['model']}, commit {str(cal['commit'])[:7]}, {cal['date']})"
        + _engine_age(cal),
        f"  measured: {', '.join(cal['measured'])}" + (f"; never measured, swept: {swept}" if swept else ""),
    ]


def _engine_age(cal: dict[str, Any]) -> str:
    """ "measured on an older engine" where the calibration's engine is not the one that replayed it."""
    if not cal.get("older_engine"):
        return ""
    measured_on = cal.get("engine") or "not recorded"
    return f"; measured on an older engine (engine {measured_on}, replayed on {cal.get('replaying_engine')})"


def replay_problem(doc: Any) -> str | None:
    """What is wrong with a saved `gpu_replay` for the lines and pages below (None: nothing), so a hand-edited
    file is one line, not a traceback deep in a report."""
    if not isinstance(doc, dict):
        return "gpu_replay is not an object"
    cal = doc.get("calibration")
    if cal is None:
        return None
    if not isinstance(cal, dict) or not {"name", "model", "device", "commit", "date", "measured"} <= set(cal):
        return "gpu_replay's calibration does not name its file, model, device, commit and date"
    if not isinstance(cal.get("swept"), dict):
        return "gpu_replay's calibration has no swept terms map"
    runs = doc.get("runs") if "runs" in doc else {"run": doc}
    if not isinstance(runs, dict):
        return "gpu_replay's runs is not an object"
    for mode, run in runs.items():
        keys = {"points", "measured", "per_step", "beyond_measured"}
        if not isinstance(run, dict) or not keys <= set(run) or not isinstance(run["points"], list):
            return f"gpu_replay's {mode} lacks its points, measured times or forward counts"
    if "runs" in doc and not all(isinstance(doc.get(k), dict) for k in ("speedup", "break_even_prefill_s")):
        return "gpu_replay lacks its speed-ups over the baseline"
    return None


def _span(values: list[float | None], unit: str = "", digits: int = 2) -> str:
    known = sorted(v for v in values if v is not None)
    if not known:
        return "n/a"
    lo, hi = (f"{v:.{digits}f}" for v in (known[0], known[-1]))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _times(run: dict[str, Any]) -> str:
    points, measured = run["points"], run["measured"]
    rollout, step = _span([p["rollout_s"] for p in points], " s"), _span([p["step_s"] for p in points], " s")
    per = ", ".join(f"{n:g} {k}" for k, n in run["per_step"].items() if n and k != "admissions")
    per += f" ({run['per_step']['admissions']:g} admitting)"
    beyond = run["beyond_measured"]
    return (
        f"rollout {rollout} (measured here {_num(measured['rollout_s'])} s), "
        f"step {step} (here {_num(measured['step_s'])} s); "
        f"forwards per step: {per}"
        + (f"; {beyond} beyond the measured sizes" if beyond else "")
        + _host(run.get("host"))
    )


def _host(host: Any) -> str:
    """The replayed rollout's host time: its source and its share of the figure (older files: nothing)."""
    if not isinstance(host, dict) or host.get("s_per_rl_step") is None:
        return ""
    shares = _span([100 * s if s is not None else None for s in host.get("share_of_rollout") or []], "%", 0)
    lo, hi = host.get("s_per_rl_step_range") or [host["s_per_rl_step"]] * 2
    here = host.get("this_cpu_s_per_engine_step")
    beside = f"; this CPU's, not in it: {1e3 * here:.2f} ms per engine step" if here is not None else ""
    return (
        f"; host {_span([1e3 * lo, 1e3 * hi], ' ms', 1)} per step ({shares} of it) from {host.get('label')}"
        + beside
    )


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _by_prefill(points: list[dict[str, Any]]) -> str:
    """A mode's rollout speed-up at each swept admission cost (or its one value where none is swept), each a
    range where the host work per engine step is swept too."""
    seen: dict[float | None, list[float | None]] = {}
    for p in points:  # at each admission cost, the range over the other swept terms (host work per step)
        seen.setdefault(p["assumed"].get("prefill"), []).append(p["rollout"])
    if list(seen) == [None]:
        return _span(seen[None], "x")
    values = " / ".join(_span(r, "x") for r in seen.values())
    scale, prefix = SWEEP_SCALE["prefill"]
    return f"{values} at " + " / ".join(f"{scale * a:g}" for a in seen if a is not None) + f" {prefix}"


def run_lines(doc: dict[str, Any]) -> list[str]:
    """`profile`'s lines: the header and the run's replayed times beside the measured ones."""
    if not doc.get("calibration"):
        return header(doc)
    return [*header(doc), f"  {_times(doc)}"]


def comparison_lines(doc: dict[str, Any]) -> list[str]:
    """`compare`'s lines: the header; per mode its replayed times, and its speed-ups over the baseline's
    replay with the admission cost at which its rollout breaks even."""
    lines = header(doc)
    if not doc.get("calibration"):
        return lines
    for mode, run in doc["runs"].items():
        lines.append(f"{mode:>16}: {_times(run)}")
    for mode, why in (doc.get("not_modelled") or {}).items():
        lines.append(f"{mode:>16}: not replayed: {why}")
    for mode, points in doc["speedup"].items():
        if mode == doc["baseline"]:
            continue
        even = doc["break_even_prefill_s"].get(mode)
        said = f" (break-even {1e3 * even:.1f} ms per admission)" if even is not None else ""
        lines.append(
            f"{mode:>16}: vs {doc['baseline']}: rollout {_by_prefill(points)}{said}; "
            f"step {_span([p['step'] for p in points], 'x')}"
        )
    return lines


def replay_section(doc: dict[str, Any] | None) -> list[Any]:
    """The replay on a page: its header as a note, and a table of each run's replayed and measured times."""
    if not doc:
        return []
    if not doc.get("calibration"):
        return [note(" ".join(header(doc)))]
    runs = doc.get("runs") or {"this run": doc}
    speedup = doc.get("speedup") or {}
    rows = []
    for mode, run in runs.items():
        points = run["points"]
        row = {
            "run": mode,
            "replayed rollout (s)": _span([p["rollout_s"] for p in points]),
            "measured rollout (s)": run["measured"]["rollout_s"],
            "replayed step (s)": _span([p["step_s"] for p in points]),
            "measured step (s)": run["measured"]["step_s"],
            "forwards beyond the measured sizes": run["beyond_measured"],
        }
        if mode in speedup and mode != doc.get("baseline"):
            row["rollout speed-up (replayed)"] = _by_prefill(speedup[mode])
            row["step speed-up (replayed)"] = _span([p["step"] for p in speedup[mode]], "x")
        rows.append(row)
    columns = list(dict.fromkeys(c for r in rows for c in r))
    return [note(" ".join(header(doc))), table(rows, columns)]
