"""verl's logs as an rlbench run: the file logger's JSONL and, optionally, the rollout_data_dir dumps.

Checked against verl's source at CHECKED_AT; docs/integrations.md ("verl") says what is read from each key.
The fully-async trainer logs several lines per step: they are merged, a later training line replacing an
earlier one (a resumed run); validation lines (`val-*` keys only) are skipped. Samples with the same `input`
in a step of the dumps are one prompt group; their lengths are the texts re-tokenised.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import (
    MAX_MAGNITUDE,
    REWARD,
    ROLLOUT,
    SYNC,
    UPDATE,
    is_number,
    phase_event,
)
from rlbench.integrations.lengthlog import Group

CHECKED_AT = (
    "verl-project/verl 1dda039b (0.10.0.dev), 266fdced (0.8.0.dev); volcengine/verl b178a3cd (0.8.0.dev)"
)
GEN, STEP = "timing_s/gen", "timing_s/step"
REWARD_T = "timing_s/reward"
# The trainer's work on a batch, in the order verl's fit() runs it (ray_trainer.py): rlbench `update` phases.
TRAINER_WORK = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
# Weight hand-over to the rollout: `update_weights` (synchronous trainer), `param_sync` (fully async, which
# names its timer "timing_s/param_sync", so compute_timing_metrics may prefix it once more).
WEIGHT_SYNC = ("update_weights", "param_sync", "timing_s/param_sync")
LENGTH = "response_length/{}"
SAMPLE_TIME = "timing_s/agent_loop/generate_sequences/{}"
SCORE = "critic/score/mean"  # the reward functions' score, before any KL penalty (compute_data_metrics)
TOKENS = "perf/total_num_tokens"  # prompt + response tokens of the step's batch (compute_throughout_metrics)
# verl's own idle and utilisation figures, and the verl versions that write each name.
IDLE_KEYS: dict[str, tuple[str, str]] = {
    # name: (what it is, where)
    "fully_async/trainer/idle_ratio": ("trainer", "verl 0.8.0.dev from 9aaa5761 (#5487, 2026-03-10) on"),
    "trainer/idle_ratio": ("trainer", "verl 0.8.0.dev before 9aaa5761"),
    "fully_async/rollouter/idle_ratio": ("rollouter", "verl 0.8.0.dev from 9aaa5761 (#5487, 2026-03-10) on"),
    "rollouter/idle_ratio": ("rollouter", "verl 0.8.0.dev before 9aaa5761"),
    "dynamic_resource/rollout_resource_utilization": ("slots", "verl 0.9.0.dev from 298fdc71 (#6556) on"),
}
VERSION_TIME = ("fully_async/rollouter/version_time", "rollouter/version_time")
GENERATED = "fully_async/count/total_generated_samples"
PROCESSING_MEAN = "fully_async/processing_time/avg"
LIMITS = [
    "verl's file log holds per-step means and extremes, not per-sample lengths or times: without "
    "--rollout-dir the bubble is an estimate (bubble_if_concurrent), not a measurement.",
    "The engine's slots (vLLM max_num_seqs per server) and the servers a sample ran on are not logged: "
    "pass --slots; the rebuilt batch runs on one engine.",
    "Lengths from --rollout-dir are the decoded texts re-tokenised: special tokens dropped in decoding "
    "(the stop token) are not counted.",
    "verl's timers are laid end to end in fit()'s order; time no timer covers (checkpoints, dumps, the "
    "gaps between timers) is the page's 'other'.",
    "No GPU timeline: run verl under `rlbench profile --engine-metrics URL -- CMD` for the servers' gauges.",
]


COUNTED = ("prompt_length/", "response_length/", TOKENS, GENERATED, PROCESSING_MEAN)


def _check_value(key: str, value: Any) -> str | None:
    """What is wrong with one value the import believes (a timer, the score, verl's own shares), or None.
    Other keys are carried as they are, or not at all."""
    timed = key.startswith("timing_s/")
    counted = key.startswith(COUNTED)  # sizes the audit divides by: non-negative like a time
    if value is None or not (timed or counted or key == SCORE or key in IDLE_KEYS):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} is {type(value).__name__}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} is {value}, not a finite number"
    if abs(value) > MAX_MAGNITUDE:
        return f"{key} is {str(value)[:24]}, not a time or score a run logs"
    if (timed or counted) and value < 0:
        return f"negative {key} ({value:g}): a time cannot be negative"
    if key in IDLE_KEYS and not 0 <= value <= 1:
        return f"{key} is {value:g}, not a share in [0, 1]"
    return None


def _check_line(row: dict[str, Any]) -> str | None:
    if type(row.get("step")) is not int or not 0 <= row["step"] <= MAX_COUNT:
        return f"step is {repr(row.get('step'))[:40]}, not an integer in 0..{MAX_COUNT}"
    if not isinstance(row.get("data"), dict):
        return 'data is not an object (verl\'s file logger writes {"step": N, "data": {...}})'
    for key, value in row["data"].items():  # what becomes a time, a reward or a share on the trace
        if (why := _check_value(str(key), value)) is not None:
            return why
    return None


def _training(data: dict[str, Any]) -> bool:
    return is_number(data.get(GEN)) and is_number(data.get(STEP))


def read_log(path: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The training steps of a verl file log ({step: data}, the lines of a step merged) and notes on what
    was skipped or merged."""
    rows = read_jsonl(path, ("step", "data"), check=_check_line)
    trained: dict[int, dict[str, Any]] = {}
    extra: dict[int, dict[str, Any]] = {}
    validation = repeated = merged = empty = 0
    for row in rows:
        step, data = row["step"], row["data"]
        if not data:
            empty += 1
        elif _training(data):
            if data[GEN] < 0 or data[STEP] < 0:
                raise UserError(f"{path}: step {step}: negative {GEN} or {STEP}")
            repeated += step in trained
            trained[step] = data  # a resumed run logs a step again: the later line is the one that ran
        elif data and all(str(k).startswith("val-") for k in data):
            validation += 1
        else:  # the fully-async rollouter's line, the param-sync timers: part of that step
            extra.setdefault(step, {}).update(data)
            merged += 1
    if not trained:
        raise UserError(f"{path}: no training step in this verl log (no line has {GEN} and {STEP})")
    steps = {s: {**extra.get(s, {}), **trained[s]} for s in sorted(trained)}
    notes = [f"{validation} validation line(s) skipped"] if validation else []
    notes += [f"{repeated} step(s) logged twice (a resumed run): the later line kept"] if repeated else []
    used = sum(1 for s in extra if s in trained)
    notes += [f"{merged} line(s) without {GEN} merged into the step they name"] if used else []
    if orphans := sorted(s for s in extra if s not in trained):  # said, never dropped without a word
        notes.append(
            f"{len(orphans)} step(s) with lines but no training line ({GEN} and {STEP}) left out: "
            f"{', '.join(map(str, orphans[:5]))}{' ...' if len(orphans) > 5 else ''}"
        )
    notes += [f"{empty} line(s) with an empty data object skipped"] if empty else []
    return steps, notes


def key_generations(steps: dict[int, dict[str, Any]]) -> dict[str, str]:
    """Which of verl's idle and utilisation names the log holds, and the verl versions that write them."""
    seen = {k for data in steps.values() for k in data}
    return {key: where for key, (_, where) in IDLE_KEYS.items() if key in seen}


def declared(data: dict[str, Any], side: str) -> tuple[float | None, str | None]:
    """verl's own idle ratio of `side` ("trainer" or "rollouter") in one step, and the key it came from."""
    for key, (what, _) in IDLE_KEYS.items():
        if what == side and is_number(data.get(key)):
            return float(data[key]), key
    return None, None


def first_number(data: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    return next((float(data[k]) for k in keys if is_number(data.get(k))), None)


def read_rollout_dir(directory: Path, tokenizer: Any) -> list[Group]:
    """Prompt groups from `DIR/{step}.jsonl`: samples sharing an `input` text in a step form one group,
    named by a hash of that text so a prompt seen again in a later step keeps its name."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory (verl's trainer.rollout_data_dir)")
    files = sorted((p for p in directory.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
    if not files:
        raise UserError(f"{directory}: no {{step}}.jsonl files (verl's trainer.rollout_data_dir dumps)")
    groups: list[Group] = []
    for path in files:
        order: dict[str, list[int]] = {}
        prompt_len: dict[str, int] = {}
        for n, row in enumerate(read_jsonl(path, ("input", "output"), torn_tail=False), 1):
            if not isinstance(row["input"], str) or not isinstance(row["output"], str):
                raise UserError(f"{path}:{n}: input and output must be text")
            key = hashlib.sha1(row["input"].encode()).hexdigest()[:12]
            if key not in prompt_len:
                prompt_len[key] = len(tokenizer(row["input"], add_special_tokens=False)["input_ids"])
            length = len(tokenizer(row["output"], add_special_tokens=False)["input_ids"])
            order.setdefault(key, []).append(max(1, length))
        groups += [Group(int(path.stem), key, tuple(v), prompt_len[key]) for key, v in order.items()]
    return groups


def _bubble_if_concurrent(data: dict[str, Any], template: str) -> float | None:
    mean, top = data.get(template.format("mean")), data.get(template.format("max"))
    return 1.0 - mean / top if is_number(mean) and is_number(top) and top > 0 else None


def timer(data: dict[str, Any], name: str) -> float:
    value = data.get(f"timing_s/{name}")
    return max(0.0, float(value)) if is_number(value) else 0.0


def timeline(steps: dict[int, dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, tuple[float, float]]]:
    """The phases of every step laid end to end in fit()'s order, and each step's rollout window: `gen`
    (rollout), `reward`, the trainer's work (update phases, each named by its verl timer), the weight
    sync; the step ends at `timing_s/step`, the time no timer covers left as a gap."""
    events: list[dict[str, Any]] = []
    windows: dict[int, tuple[float, float]] = {}
    clock = 0.0
    for step, data in steps.items():
        gen, total = float(data[GEN]), max(float(data[STEP]), float(data[GEN]))
        end = clock + total
        windows[step] = (clock, clock + gen)
        events.append(phase_event(ROLLOUT, clock, clock + gen, step=step, source="verl gen"))
        at = clock + gen
        reward = phase_event(REWARD, at, min(end, at + timer(data, "reward")), step=step)
        if is_number(data.get(SCORE)):
            reward["reward_mean"] = float(data[SCORE])
        if is_number(data.get(REWARD_T)) or "reward_mean" in reward:
            events.append(reward)
            at = reward["t_end"]
        for kind, names in ((UPDATE, TRAINER_WORK), (SYNC, WEIGHT_SYNC)):
            for name in names:
                if is_number(data.get(f"timing_s/{name}")):
                    stop = min(end, at + timer(data, name))
                    events.append(phase_event(kind, at, stop, step=step, name=name))
                    at = stop
        # the step's end must be on the clock even when no timer reaches it (its work is unknown)
        events.append(phase_event(SYNC, end, end, step=step, name="step end"))
        clock = end
    return events, windows


def per_step(steps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """verl's own figures per step (every timer, the idle ratios under the name the log gives), and the
    estimates that need no per-sample data."""
    rows = []
    for step, data in steps.items():
        row: dict[str, Any] = {
            "step": step,
            "rollout share": data[GEN] / data[STEP] if data[STEP] > 0 else None,
            "response_length mean": data.get(LENGTH.format("mean")),
            "response_length max": data.get(LENGTH.format("max")),
            SCORE: data.get(SCORE),
            # 1 - mean/max: exact for a synchronous batch whose samples all start together with a slot each;
            # an engine with more slots than samples idles more (a lower bound), queueing idles less
            "bubble_if_concurrent (lengths)": _bubble_if_concurrent(data, LENGTH),
            "bubble_if_concurrent (sample times)": _bubble_if_concurrent(data, SAMPLE_TIME),
        }
        row.update({f"verl {k}": v for k, v in data.items() if k.startswith("timing_s/") and is_number(v)})
        row.update({f"verl {k}": data[k] for k in IDLE_KEYS if k in data})
        rows.append(row)
    return rows
