"""What `rlbench compare` reads from its runs side by side (`compare_doc`: compare.json) and the lines it
prints: the bubble first, then each mode's step time in parts with the speed-up and the part that produced
it, the rollout's throughput, the time to a target accuracy, the GPU replay (a model, replay_summary.py) and
the load-drift note.

The functions behind the numbers are in reference_trainer/trace/compare.py; the page is compare_report.py.
"""

from __future__ import annotations

from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.compare import PHASES, drift_check, per_step_range, speedup_parts, step_speedups
from reference_trainer.trace.ledger import same_prompts_ks
from rlbench.report.ledger_legend import TRAINING_KEYS, flags, legend_lines
from rlbench.report.profile_report import GENERATED_LABEL, TRAINED_LABEL
from rlbench.report.replay_summary import comparison_lines, replay_problem
from rlbench.report.run_doc import summary_problem


def check_compare_doc(doc: Any, source: Any) -> dict[str, Any]:
    """`doc` if it has the shape of compare.json (runs with a mode, a summary and step rows), else a one-line
    UserError naming `source`."""
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("mode"), str)
        and isinstance(r.get("summary"), dict)
        and isinstance(r.get("steps", []), list)
        for r in runs
    ):
        raise UserError(f"{source}: not a comparison (a list of runs, each with a mode, a summary and steps)")
    if "gpu_replay" in doc and (why := replay_problem(doc["gpu_replay"])) is not None:
        raise UserError(f"{source}: {why}")
    for run in runs:
        for n, row in enumerate([run["summary"], *run.get("steps", [])]):
            if isinstance(row, dict) and (why := summary_problem(row)) is not None:
                where = "summary" if n == 0 else f"step row {n}"
                raise UserError(f"{source}: {run['mode']}'s {where}: {why}")
    return doc


def runs_and_baseline(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A compare document's runs (a list, each with its mode) and the mode the others are compared with."""
    return doc.get("runs") or [], str(doc.get("baseline", "baseline"))


def _div(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b not in (None, 0) else None


def percent(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def points(value: Any, reference: Any) -> float | None:
    """`value` - `reference` in percentage points; None where either is unknown."""
    return None if value is None or reference is None else 100.0 * (value - reference)


def ratio_rows(runs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """One row per mode: its summary (shares in percent) and its ratios to the baseline (speed-up > 1 means
    faster; the bubble's change in percentage points)."""
    base = next((r["summary"] for r in runs if r["mode"] == baseline), None)
    rows = []
    for r in runs:
        s = r["summary"]
        row: dict[str, Any] = {
            "mode": r["mode"],
            "bubble (%)": percent(s.get("bubble_ratio")),
            "step time (s)": s.get("step_time_s"),
            TRAINED_LABEL: s.get("trained_tokens_per_rollout_s"),
            GENERATED_LABEL: s.get("rollout_tokens_per_s"),
            "GPU idle in rollout (%)": percent(s.get("bubble_ratio_gpu")),
            "tail share (%)": percent(s.get("tail_time_share")),
            "acceptance (%)": percent(s.get("acceptance_rate")),
            # The bubble's slot-time lookahead took; blank where none ran (no lookahead, or its cost gate).
            "lookahead fill (%)": percent(
                s.get("lookahead_slot_share") if s.get("lookahead_tokens") else None
            ),
            "reward": s.get("reward_mean"),
            "accuracy": s.get("accuracy"),
        }
        if base is not None:
            row["bubble vs baseline (pts)"] = points(s.get("bubble_ratio"), base.get("bubble_ratio"))
            row["speed-up (step time)"] = _div(base.get("step_time_s"), s.get("step_time_s"))
            # both throughputs, the trained first: a mode can generate more while training on less
            trained, generated = "trained_tokens_per_rollout_s", "rollout_tokens_per_s"
            row["trained throughput ×"] = _div(s.get(trained), base.get(trained))
            row["generated throughput ×"] = _div(s.get(generated), base.get(generated))
            row["reward ×"] = _div(s.get("reward_mean"), base.get("reward_mean"))
        rows.append(row)
    return rows


def ledger_rows(runs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """What each mode buys its speed-up with (docs/metrics.md, "The ledger"), beside it: the trained lengths
    against the generated ones and against the baseline's on the same prompts (KS distance), the longest
    decile's trained share, the oldest waiting prompt, the trained tokens' staleness, reward over completed
    and over all generations, and which side bounds the run."""
    base = next((r for r in runs if r["mode"] == baseline), None)
    base_lengths = ((base or {}).get("ledger") or {}).get("trained_lengths_by_prompt")
    base_step = (base or {}).get("summary", {}).get("step_time_s")
    rows = []
    for r in runs:
        s, mine = r["summary"], (r.get("ledger") or {}).get("trained_lengths_by_prompt")
        versus = same_prompts_ks(mine, base_lengths) if mine and base_lengths and r is not base else None
        rows.append(
            {
                "mode": r["mode"],
                "speed-up (step time)": _div(base_step, s.get("step_time_s")),
                "length KS, trained vs generated": s.get("trained_vs_generated_ks"),
                "length KS vs baseline, same prompts": versus,
                "longest 10% trained (%)": percent(s.get("long_decile_trained_share")),
                "oldest waiting prompt (versions)": s.get("oldest_waiting_age_max"),
                "staleness mean": s.get("staleness_mean"),
                "staleness max": s.get("staleness_max"),
                "reward, completed": s.get("reward_completed"),
                "reward, all": s.get("reward_all"),
                "trainer waits (%)": percent(s.get("trainer_wait_share")),
                "rollout waits (%)": percent(s.get("rollout_wait_share")),
                "bound": s.get("bound"),
                "worrying": "; ".join(flags(s, versus, TRAINING_KEYS)) or "nothing",
            }
        )
    return rows


# Why a column can be empty for every mode: said under the table instead of showing blank cells.
UNMEASURED_WHY = {
    "GPU idle in rollout (%)": "NVML's GPU utilisation, on a GPU",
    "acceptance (%)": "no mode drafts tokens",
    "lookahead fill (%)": "no mode runs lookahead",
}


def compare_doc(
    runs: list[dict[str, Any]], baseline: str, workload: dict[str, Any] | None = None
) -> dict[str, Any]:
    """compare.json: the runs, and what is read from them side by side."""
    summaries = {r["mode"]: r["summary"] for r in runs}
    steps = {r["mode"]: r.get("steps") or [] for r in runs}
    return {
        "baseline": baseline,
        "workload": workload or {},
        "interleaved": True,
        "runs": runs,
        "ratios": ratio_rows(runs, baseline),
        "bubble_per_round": per_step_range(steps, "bubble_ratio"),
        "speedup_per_round": step_speedups(steps, baseline),
        "parts": speedup_parts(summaries, baseline),
        # A run ahead's update is slower by design (fewer threads, beside the rollout): not load drift.
        "drift": drift_check({m: s for m, s in summaries.items() if not s.get("run_ahead")}),
        "ledger": ledger_rows(runs, baseline),
    }


def span_text(spread: dict[str, Any] | None, scale: float = 1.0, unit: str = "") -> str:
    if not spread or spread.get("min") is None:
        return ""
    digits = 1 if scale != 1 else 2
    return f"{scale * spread['min']:.{digits}f}-{scale * spread['max']:.{digits}f}{unit}"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """What `rlbench compare` prints: the bubble first, then each mode's step time in parts with the
    speed-up and the part that produced it, then the rollout's throughput and the trained lengths."""
    runs, baseline = runs_and_baseline(doc)
    derived = compare_doc(runs, baseline, doc.get("workload"))
    summaries = {r["mode"]: r["summary"] for r in runs}
    base = summaries.get(baseline, {})
    lines = ["bubble: idle slot-time in rollout, % of the slots' capacity (range over rounds)"]
    for mode, s in summaries.items():
        b = s.get("bubble_ratio")
        gpu = (
            f", GPU idle {100 * s['bubble_ratio_gpu']:.1f}%" if s.get("bubble_ratio_gpu") is not None else ""
        )
        pts = _cell(points(b, base.get("bubble_ratio")), "+.1f")
        versus = f"  {pts} pts vs {baseline}" if mode != baseline else ""
        span = span_text(derived["bubble_per_round"].get(mode), 100.0) or "n/a"
        text = f"{'n/a':>6}" if b is None else f"{100 * b:5.1f}%"
        lines.append(f"{mode:>16}: {text} ({span}){gpu}{versus}")
    # The reference named as it is: without a baseline run, compare measures against its first mode, and a
    # header saying "vs baseline" would put a "1.00x vs baseline" beside a mode that is not one.
    no_baseline = "" if baseline == "baseline" else f"; no baseline run, so {baseline} is the reference"
    lines.append(
        "time per step (s): rollout + update + reward + other (rollout: what the update waited for); "
        f"speed-up vs {baseline} (range per round){no_baseline}"
    )
    for mode, parts in derived["parts"].items():
        lines.append(step_line(mode, parts, derived["speedup_per_round"].get(mode), mode == baseline))
    lines.append(
        "rollout: trained / generated tokens per rollout-second; trained response length mean / longest"
    )
    for mode, s in summaries.items():
        gen, trained = s.get("rollout_tokens_per_s"), s.get("trained_tokens_per_rollout_s")
        aside = max(0, int(s.get("rollout_tokens") or 0) - int(s.get("trained_tokens") or 0))
        lines.append(
            f"{mode:>16}: {trained or 0:.0f} / {gen or 0:.0f} tok/s ({aside:,} generated tokens not "
            f"trained); length {lengths_text(s)}"
        )
    lines += ledger_lines(derived["ledger"])
    lines += accuracy_lines(doc.get("time_to_accuracy"))
    if doc.get("gpu_replay"):
        lines += comparison_lines(doc["gpu_replay"])
    return lines


def ledger_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The ledger beside each speed-up: a gain bought by deferring long, hard samples or by training on
    stale ones says so."""
    lines = [
        "what the speed is bought with: trained-length KS vs generated / vs baseline on the same prompts; "
        "longest 10% of generations trained; oldest waiting prompt; staleness mean / max; reward over "
        "completed / all generations; which side waits (each number's meaning and thresholds below)"
    ]
    for r in rows:
        speed = f"{r['speed-up (step time)']:.2f}x" if r["speed-up (step time)"] is not None else "n/a"
        trainer, rollout = _cell(r["trainer waits (%)"], ".0f"), _cell(r["rollout waits (%)"], ".0f")
        waits = f"trainer waits {trainer}%, rollout {rollout}%"
        lines.append(
            f"{r['mode']:>16}: {speed}  KS {_cell(r['length KS, trained vs generated'])} / "
            f"{_cell(r['length KS vs baseline, same prompts'])}, longest 10% trained "
            f"{_cell(r['longest 10% trained (%)'], '.0f')}%, oldest waiting "
            f"{_cell(r['oldest waiting prompt (versions)'], 'd')} versions, staleness "
            f"{_cell(r['staleness mean'])} / {_cell(r['staleness max'], 'd')}, reward "
            f"{_cell(r['reward, completed'], '.3f')} / {_cell(r['reward, all'], '.3f')}; "
            f"{r['bound'] or 'n/a'} ({waits})"
        )
        lines.append(f"{'':>16}  worrying: {r['worrying']}")
    return [*lines, "the ledger's numbers:", *legend_lines()]


def _cell(value: Any, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def accuracy_lines(spent: dict[str, Any] | None) -> list[str]:
    """Time to a held-out accuracy: per mode, the training time before it was reached (held-out evaluations
    excluded), the rollout and update time inside it, the trained samples and the rollout tokens."""
    if not spent:
        return []
    lines = [
        f"time to held-out greedy accuracy {spent['target']:.2f} (budget {spent['budget_steps']} steps): "
        "training s (rollout + update), trained samples, rollout tokens"
    ]
    for mode, t in spent["modes"].items():
        figures = (
            f"{t['wall_s']:.1f} s ({t['rollout_s']:.1f} + {t['update_s']:.1f}), {t['samples']:,} samples, "
            f"{t['rollout_tokens']:,} tokens"
        )
        where = f"after {t['steps']} steps" if t["reached"] else f"not reached; the budget spent {figures}"
        lines.append(f"{mode:>16}: {figures}, {where}" if t["reached"] else f"{mode:>16}: {where}")
    return lines


def step_line(mode: str, parts: dict[str, Any], spread: dict[str, Any] | None, is_baseline: bool) -> str:
    """A mode's step time in parts, its speed-up over the baseline with the range per round, and the parts
    that produced it. One shape whatever the values (a speed-up or range that cannot be computed reads n/a),
    so a fast machine whose step times round to 0.00 s prints the same fields as a slow one."""
    secs = parts["seconds"]
    if secs is None:
        return f"{mode:>16}: not measured"
    split = " + ".join(f"{secs[p]:.2f}" for p in PHASES) + f" = {sum(secs.values()):.2f} s"
    speed = "n/a" if parts["speedup"] is None else f"{parts['speedup']:.2f}x"
    if is_baseline:  # 1.00x by definition: no range, and nothing produced it
        return f"{mode:>16}: {split}  {speed} (the reference)"
    return f"{mode:>16}: {split}  {speed} ({span_text(spread, unit='x') or 'n/a'}){produced_by(parts)}"


def produced_by(parts: dict[str, Any]) -> str:
    """Which two parts of the step produced a mode's change in step time, in one shape whatever the values:
    `: update saved 4.47 s (96%), other cost 0.06 s (-1%)`. A share that cannot be computed (no baseline,
    or no step time saved to speak of) reads n/a; a part that saved 0.00 s says `saved 0.00 s`."""
    saved, share = parts.get("saved_s"), parts.get("share")
    if not saved:
        return ": n/a"
    total = sum(saved.values())
    if share and abs(total) < 0.02 * (sum(parts["seconds"].values()) + total):
        share = None  # no step time saved to speak of: shares of about nothing are noise
    order = sorted(PHASES, key=lambda p: -abs(saved[p]))[:2]
    # The word follows the printed figure (`cost` only for one below -0.00) and round() drops the sign of
    # a share about zero, so no value prints `cost 0.00 s` or `-0%`.
    said = ", ".join(
        f"{p} {'cost' if round(saved[p], 2) < 0 else 'saved'} {abs(saved[p]):.2f} s "
        f"({f'{round(100 * share[p])}%' if share else 'n/a'})"
        for p in order
    )
    return f": {said}"


def drift_note(drift: dict[str, Any]) -> str | None:
    if not drift.get("flagged"):
        return None
    costs = ", ".join(f"{m} {c:.3g}" for m, c in drift["s_per_ktoken"].items() if c)
    return (
        f"Machine load drifted during this comparison: the update, which no mode changes, cost {costs} s per "
        f"1,000 trained tokens ({drift['ratio']:.2f}x apart, tolerance {drift['tolerance']:.2f}x). Treat the "
        "speed-ups as unreliable and rerun on a quiet machine."
    )


def lengths_text(summary: dict[str, Any]) -> str:
    return f"{summary.get('response_len_mean') or 0:.0f} / {summary.get('response_len_max') or 0}"
