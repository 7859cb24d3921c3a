"""The comparison's answer in one line per mode: which mode is faster and by how much, the part of the step
that made it so and why, what it costs in training (the ledger), and what a GPU replay makes of it:

    sorted: 1.3x faster steps (rounds 1.1-1.8x; update -11 s: it trains on shorter responses, 22 vs 29
    tokens; rollout +5.9 s: it generates more tokens, 9,871 vs 3,556) · trains 40% of the longest tenth ·
    replayed on NVIDIA H200 (a model): 0.4-0.9x

A pure function of a compare document (compare_summary.compare_doc's reading of it and its GPU replay), so
the page and any printer show the same words for the same numbers. Every number carries its unit, and a
ratio's precision fits its spread over rounds (fitted).
"""

from __future__ import annotations

import math
from typing import Any

from reference_trainer.trace.schema import ROLLOUT, UPDATE
from rlbench.report.compare_summary import compare_doc, runs_and_baseline
from rlbench.report.ledger_legend import TRAINING_KEYS, flags

# A part of the step that moved by less than this share of the baseline's step is unchanged (noise).
UNCHANGED_SHARE = 0.05


def fitted(value: float, low: float | None = None, high: float | None = None) -> str:
    """`value` to the decimals its spread [low, high] supports: a spread of 0.3 leaves one decimal, of 0.03
    two, of 3 none; no spread (one round) keeps two (at most three decimals, never fewer than none)."""
    width = (high - low) if low is not None and high is not None else 0.0
    decimals = 2 if width <= 0 else min(3, max(0, -math.floor(math.log10(width))))
    return f"{value:.{decimals}f}"


def span(low: float, high: float, unit: str = "x") -> str:
    """A range at the precision its own width supports ("0.4-0.9x"; one value where both ends agree)."""
    lo, hi = fitted(low, low, high), fitted(high, low, high)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def seconds(value: float) -> str:
    """Seconds to two significant digits, signed: "-11 s", "+5.9 s", "-0.31 s"."""
    sign = "-" if value < 0 else "+"
    return f"{sign}{float(f'{abs(value):.2g}'):g} s"


def verdict_lines(derived: dict[str, Any], replay: dict[str, Any] | None = None) -> list[str]:
    """One line per mode (the baseline's first, as the reference), from `compare_doc`'s reading of a
    comparison and its `gpu_replay`. Without a baseline run, one line saying there is nothing to compare."""
    runs, baseline = derived["runs"], derived["baseline"]
    base = next((r for r in runs if r["mode"] == baseline), None)
    if base is None:
        return [f"no '{baseline}' run in this comparison: no speed-ups to state"]
    lines = [_baseline_line(baseline, derived["parts"].get(baseline) or {}, base["summary"])]
    ledger = derived.get("ledger", [])
    versus = {row["mode"]: row.get("length KS vs baseline, same prompts") for row in ledger}
    for run in runs:
        if run["mode"] != baseline:
            mode = run["mode"]
            said = [_speed(mode, derived, base["summary"], run["summary"])]
            said += _cost(run["summary"], versus.get(mode))
            said += _replayed(mode, replay)
            lines.append(" · ".join(said))
    return lines


def verdict_block(doc: dict[str, Any]) -> list[str]:
    """What `rlbench compare` prints last: its verdict lines, from compare.json's document alone."""
    runs, baseline = runs_and_baseline(doc)
    derived = compare_doc(runs, baseline, doc.get("workload"))
    return ["verdict:", *(f"  {line}" for line in verdict_lines(derived, doc.get("gpu_replay")))]


def _baseline_line(mode: str, parts: dict[str, Any], summary: dict[str, Any]) -> str:
    secs = parts.get("seconds")
    if not secs:
        return f"{mode}: the reference (step time not measured)"
    split = ", ".join(f"{p} {abs(float(f'{v:.2g}')):g} s" for p, v in secs.items() if v >= 0.05)
    bubble = summary.get("bubble_ratio")
    idle = f"; its slots idle {100 * bubble:.0f}% of the rollout" if bubble is not None else ""
    return f"{mode}: the reference, {sum(secs.values()):.2g} s per step ({split}){idle}"


def _speed(mode: str, derived: dict[str, Any], base: dict[str, Any], mine: dict[str, Any]) -> str:
    parts = derived["parts"].get(mode) or {}
    speedup, saved = parts.get("speedup"), parts.get("saved_s")
    if speedup is None or not saved:
        return f"{mode}: step time not measured"
    rounds = derived.get("speedup_per_round", {}).get(mode) or {}
    low, high = rounds.get("min"), rounds.get("max")
    if speedup >= 1:
        head = f"{mode}: {fitted(speedup, low, high)}x faster steps"
    else:
        head = f"{mode}: {fitted(1 / speedup, *_inverse(low, high))}x slower steps"
    ranged = [f"rounds {span(low, high)}"] if low is not None and high is not None and low != high else []
    base_step = sum((derived["parts"].get(derived["baseline"]) or {}).get("seconds", {}).values())
    moved = sorted(saved, key=lambda p: -abs(saved[p]))[:2]
    causes = [_cause(p, -saved[p], base_step, base, mine) for p in moved]
    return f"{head} ({'; '.join(ranged + causes)})"


def _inverse(low: float | None, high: float | None) -> tuple[float | None, float | None]:
    return (1 / high, 1 / low) if low and high else (None, None)


def _cause(phase: str, delta: float, base_step: float, base: dict[str, Any], mine: dict[str, Any]) -> str:
    """A part's change in seconds per step and, where the runs show it, why."""
    if abs(delta) < UNCHANGED_SHARE * base_step:
        return f"{phase} unchanged (±{float(f'{abs(delta):.1g}'):g} s)"
    why = _why(phase, delta, base, mine)
    return f"{phase} {seconds(delta)}" + (f": {why}" if why else "")


def _why(phase: str, delta: float, base: dict[str, Any], mine: dict[str, Any]) -> str | None:
    if phase == UPDATE:
        a, b = mine.get("response_len_mean"), base.get("response_len_mean")
        if a and b and abs(a - b) >= 0.1 * b:
            return f"it trains on {'shorter' if a < b else 'longer'} responses, {a:.0f} vs {b:.0f} tokens"
        if mine.get("run_ahead") and delta > 0:
            return "its update runs beside the rollout, on fewer threads"
    if phase == ROLLOUT:
        a, b = mine.get("bubble_ratio"), base.get("bubble_ratio")
        if delta < 0 and a is not None and b is not None and b - a >= 0.05:
            return f"its slots idle less, {100 * a:.0f}% vs {100 * b:.0f}%"
        x, y = mine.get("rollout_tokens"), base.get("rollout_tokens")
        if x and y and abs(x - y) >= 0.1 * y and (x > y) == (delta > 0):
            return f"it generates {'more' if x > y else 'fewer'} tokens, {x:,} vs {y:,} in all"
    return None


def _cost(mine: dict[str, Any], versus: float | None) -> list[str]:
    """What the speed costs in training: the longest tenth's trained share, and the worst other flag."""
    said = []
    if (share := mine.get("long_decile_trained_share")) is not None:
        said.append(f"trains {100 * share:.0f}% of the longest tenth")
    other = flags(mine, versus, tuple(k for k in TRAINING_KEYS if k != "long_decile_trained_share"))
    return said + other[:1]


def _replayed(mode: str, replay: dict[str, Any] | None) -> list[str]:
    """The GPU replay's step speed-up over the baseline's (its range over the swept admission costs)."""
    if not replay or not replay.get("calibration"):
        return []
    if mode in (replay.get("not_modelled") or {}):
        return [f"not replayed on {replay['calibration']['device']}"]
    steps = [p["step"] for p in (replay.get("speedup") or {}).get(mode, []) if p.get("step") is not None]
    if not steps:
        return []
    return [f"replayed on {replay['calibration']['device']} (a model): {span(min(steps), max(steps))}"]
