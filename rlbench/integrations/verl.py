"""verl's logs as an rlbench run: the file logger's JSONL and, optionally, the rollout_data_dir dumps.

- `trainer.logger=[console,file]` writes `$VERL_FILE_LOGGER_ROOT/{project}/{experiment}.jsonl`, one line
  per step: `{"step": N, "data": {metric: value}}`. Read here: `timing_s/gen`, `timing_s/step`,
  `timing_s/reward`, `timing_s/update_actor`, `response_length/{mean,max,min,clip_ratio}`,
  `agent_loop/generate_sequences/{min,mean,max}` (per-sample wall times) and verl's own utilisation figures
  (`fully_async/{rollouter,trainer}/idle_ratio`, `dynamic_resource/rollout_resource_utilization`). A line
  without `timing_s/gen` and `timing_s/step` (the validation before training) is not a training step.
- `trainer.rollout_data_dir=DIR` writes `DIR/{step}.jsonl`, one line per sample with the decoded `input` and
  `output` text and the `step`. Samples with the same `input` in a step are one prompt group; their lengths
  are the texts re-tokenised with the run's tokenizer.

Steps are laid end to end on one clock: rollout from the step's start for `timing_s/gen`, the reward after
it, the actor update ending the step. With per-sample lengths the rollout's slots are rebuilt
(lengthlog.rebuild) inside that window; without, the trace holds the phases only and the bubble is the
stated estimate `bubble_if_concurrent` below, never a measurement.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import REWARD, ROLLOUT, UPDATE, is_number
from rlbench.integrations.lengthlog import Group

GEN, STEP, REWARD_T, UPDATE_T = "timing_s/gen", "timing_s/step", "timing_s/reward", "timing_s/update_actor"
LENGTH = "response_length/{}"
SAMPLE_TIME = "agent_loop/generate_sequences/{}"
VERL_OWN = (
    "fully_async/rollouter/idle_ratio",
    "fully_async/trainer/idle_ratio",
    "dynamic_resource/rollout_resource_utilization",
    "response_length/clip_ratio",
)
LIMITS = [
    "verl's file log holds per-step means and extremes, not per-sample lengths or times: without "
    "--rollout-dir the bubble is an estimate (bubble_if_concurrent), not a measurement.",
    "The engine's slots (vLLM max_num_seqs per server) and the servers a sample ran on are not logged: "
    "pass --slots; the rebuilt batch runs on one engine.",
    "Lengths from --rollout-dir are the decoded texts re-tokenised: special tokens dropped in decoding "
    "(the stop token) are not counted.",
    "No GPU timeline: run verl under `rlbench profile --engine-metrics URL -- CMD` for the servers' gauges.",
]


def _check_line(row: dict[str, Any]) -> str | None:
    if type(row.get("step")) is not int or row["step"] < 0:
        return f"step is {row.get('step')!r}, not an integer >= 0"
    if not isinstance(row.get("data"), dict):
        return 'data is not an object (verl\'s file logger writes {"step": N, "data": {...}})'
    return None


def read_log(path: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The training steps of a verl file log ({step: data}) and notes on what was skipped."""
    rows = read_jsonl(path, ("step", "data"), check=_check_line)
    steps: dict[int, dict[str, Any]] = {}
    skipped, repeated = 0, 0
    for row in rows:
        data = row["data"]
        if not (is_number(data.get(GEN)) and is_number(data.get(STEP))):
            skipped += 1
            continue
        if data[GEN] < 0 or data[STEP] < 0:
            raise UserError(f"{path}: step {row['step']}: negative {GEN} or {STEP}")
        repeated += row["step"] in steps
        steps[row["step"]] = data  # a resumed run logs a step again: the later line is the one that ran
    if not steps:
        raise UserError(f"{path}: no training step in this verl log (no line has {GEN} and {STEP})")
    notes = [f"{skipped} line(s) without {GEN}/{STEP} (validation) skipped"] if skipped else []
    notes += [f"{repeated} step(s) logged twice (a resumed run): the later line kept"] if repeated else []
    return dict(sorted(steps.items())), notes


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


def timeline(steps: dict[int, dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, tuple[float, float]]]:
    """The phases of every step laid end to end, and each step's rollout window."""
    events: list[dict[str, Any]] = []
    windows: dict[int, tuple[float, float]] = {}
    clock = 0.0
    for step, data in steps.items():
        gen, total = float(data[GEN]), max(float(data[STEP]), float(data[GEN]))
        windows[step] = (clock, clock + gen)
        events.append(
            {"kind": ROLLOUT, "step": step, "t_start": clock, "t_end": clock + gen, "source": "verl"}
        )
        if is_number(data.get(REWARD_T)):
            end = min(clock + total, clock + gen + float(data[REWARD_T]))
            events.append({"kind": REWARD, "step": step, "t_start": clock + gen, "t_end": end})
        if is_number(data.get(UPDATE_T)):
            start = max(clock + gen, clock + total - float(data[UPDATE_T]))
            events.append({"kind": UPDATE, "step": step, "t_start": start, "t_end": clock + total})
        else:  # the step's end must still be on the clock: its update is unknown, not absent
            events.append({"kind": UPDATE, "step": step, "t_start": clock + total, "t_end": clock + total})
        clock += total
    return events, windows


def per_step(steps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """verl's own figures per step, and the estimates that need no per-sample data."""
    rows = []
    for step, data in steps.items():
        row: dict[str, Any] = {
            "step": step,
            "verl timing_s/gen": data[GEN],
            "verl timing_s/step": data[STEP],
            "rollout share": data[GEN] / data[STEP] if data[STEP] > 0 else None,
            "response_length mean": data.get(LENGTH.format("mean")),
            "response_length max": data.get(LENGTH.format("max")),
            # 1 - mean/max: exact for a synchronous batch whose samples all start together with a slot each;
            # an engine with more slots than samples idles more (a lower bound), queueing idles less
            "bubble_if_concurrent (lengths)": _bubble_if_concurrent(data, LENGTH),
            "bubble_if_concurrent (sample times)": _bubble_if_concurrent(data, SAMPLE_TIME),
        }
        row.update({key: data[key] for key in VERL_OWN if key in data})
        rows.append(row)
    return rows
