"""A finished TRL GRPOTrainer run, from what it leaves in its output_dir (no callback needed): the
completions parquet files (`log_completions=True`) and trainer_state.json; docs/integrations.md ("A finished
TRL run") says what each holds. No file holds when generation ran, so the run's time unit is the decode step,
as for a length log. Steps keep TRL's numbers (global_step after the step, from 1), as the callback's do.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.inputs import open_input
from reference_trainer.trace.records import read_json
from reference_trainer.trace.schema import MAX_MAGNITUDE, REWARD, ROLLOUT, SEQUENCE, phase_event
from rlbench.integrations.lengthlog import MAX_TOKENS, Group

LENGTH_COLUMN = "completion_tokens"  # the length probe's column (rlbench.integrations.trl)
MAX_ROWS = 1 << 22  # samples over all completions files (each a generation batch of a logging step)
CHECKED_AT = "trl 1.16.0 (PyPI), GRPOTrainer.log and transformers' trainer_state.json"
TRL_KEYS = ("step_time", "reward", "reward_std", "completions/mean_length", "completions/max_length",
            "completions/clipped_ratio")  # fmt: skip
LIMITS = [
    "TRL's output_dir records no generation times: the page's times are decode steps.",
    "The completions parquet holds the last generation batch of each logging step: with logging_steps > 1 "
    "the other steps' samples are missing.",
    "Without the length probe's completion_tokens column, lengths are the decoded texts re-tokenised: "
    "special tokens (the stop token) are not counted.",
]


def find_state(output_dir: Path) -> Path | None:
    """output_dir's trainer_state.json, else the latest checkpoint's (None when there is neither)."""
    if (output_dir / "trainer_state.json").is_file():
        return output_dir / "trainer_state.json"
    checkpoints = [p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    for checkpoint in sorted(checkpoints, key=lambda p: int(p.name.split("-")[-1]), reverse=True):
        if (checkpoint / "trainer_state.json").is_file():
            return checkpoint / "trainer_state.json"
    return None


def read_state(path: Path) -> dict[int, dict[str, Any]]:
    """TRL's own per-step figures from log_history, keyed by TRL's global_step."""
    history = read_json(path)
    history = history.get("log_history") if isinstance(history, dict) else None
    if not isinstance(history, list):
        raise UserError(f"{path}: no log_history list (not a transformers trainer_state.json)")
    steps = {}
    for n, entry in enumerate(history):
        if isinstance(entry, dict) and "step_time" in entry and type(entry.get("step")) is int:
            for key in TRL_KEYS:
                if key in entry and (why := _bad_figure(key, entry[key])) is not None:
                    raise UserError(f"{path}: log_history[{n}] (step {entry['step']}): {key} {why}")
            steps[entry["step"]] = {k: entry[k] for k in TRL_KEYS if k in entry}
    return steps


def _bad_figure(key: str, value: Any) -> str | None:
    """What makes one of TRL's logged figures unbelievable (None: nothing): a number, finite, in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {type(value).__name__}, not a number"
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        return f"is {str(value)[:24]}, not a finite number a run logs"
    if key == "completions/clipped_ratio" and not 0 <= value <= 1:
        return f"is {value:g}, not a share in [0, 1]"
    if key != "reward" and value < 0:  # a reward may be negative; times, spreads and lengths may not
        return f"is {value:g}, and cannot be negative"
    return None


def reward_phases(events: list[dict[str, Any]], logged: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """A reward phase of no length at the end of each step's rollout, carrying TRL's logged `reward` (the
    weighted sum of the reward functions, averaged over the logging step), so the run's reward is TRL's."""
    ends: dict[int, float] = {}
    for e in events:
        if e["kind"] == ROLLOUT or e["kind"] == SEQUENCE:
            end = e["t_end"] if e["kind"] == ROLLOUT else e["t_finish"]
            ends[e["step"]] = max(ends.get(e["step"], end), end)
    return [
        phase_event(REWARD, end, end, step=step, reward_mean=logged[step]["reward"])
        for step, end in sorted(ends.items())
        if isinstance(logged.get(step, {}).get("reward"), (int, float))
    ]


def _length(row: dict[str, Any], tokenizer: Any, where: str) -> int:
    value = row.get(LENGTH_COLUMN)
    if value is not None:
        if type(value) is not int or not 1 <= value <= MAX_TOKENS:
            raise UserError(f"{where}: {LENGTH_COLUMN} is {value!r}, not a token count")
        return value
    if tokenizer is None:
        raise UserError(
            f"{where}: no {LENGTH_COLUMN} column (the rlbench length probe's) and no --tokenizer to count "
            "the completions' tokens"
        )
    text = row.get("completion")
    if isinstance(text, list):  # conversational: the assistant's messages
        text = "".join(str(m.get("content", "")) for m in text if isinstance(m, dict))
    if not isinstance(text, str):
        raise UserError(f"{where}: completion is {type(text).__name__}, not text")
    return max(1, len(tokenizer(text, add_special_tokens=False)["input_ids"]))


def _rows(path: Path, tokenizer: Any, room: int) -> Iterator[dict[str, Any]]:
    """A completions parquet's rows, only the columns read, in batches (a file's prompts and completions
    are never all in memory); a file claiming more than `room` rows is refused from its footer, before any
    row is read (a 233 kB file can claim 20 million)."""
    with open_input(path) as fh:  # a regular file: no FIFO or device
        try:
            table = pq.ParquetFile(fh)
            if table.metadata.num_rows > room:
                raise UserError(
                    f"{path}: {table.metadata.num_rows:,} rows; the completions files hold at most "
                    f"{MAX_ROWS:,} samples in all"
                )
            names = set(table.schema_arrow.names)
            wanted = ["step", "prompt", LENGTH_COLUMN] + (["completion"] if tokenizer is not None else [])
            for batch in table.iter_batches(batch_size=1 << 14, columns=[c for c in wanted if c in names]):
                yield from batch.to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise UserError(f"{path}: not a readable parquet table ({str(err).splitlines()[0]})") from None


def read_completions(directory: Path, tokenizer: Any = None) -> list[Group]:
    """Prompt groups from the completions parquet files: samples of one file sharing a prompt are a group."""
    files = sorted(directory.glob("completions_*.parquet"))
    if not files:
        raise UserError(f"{directory}: no completions_*.parquet (run TRL with log_completions=True)")
    groups: list[Group] = []
    read = 0
    for path in files:
        order: dict[tuple[int, str], list[int]] = {}  # by step too: a file may hold more than one step
        for n, row in enumerate(_rows(path, tokenizer, MAX_ROWS - read), 1):
            if type(row.get("step")) is not int or not 1 <= row["step"] <= MAX_COUNT:
                shown = repr(row.get("step"))[:40]
                raise UserError(f"{path}: row {n}: step is {shown}, not TRL's global step (1..{MAX_COUNT})")
            # TRL's global_step when it logged: the step that generated these samples
            key = (row["step"], json.dumps(row.get("prompt"), sort_keys=True, default=str))
            order.setdefault(key, []).append(_length(row, tokenizer, f"{path}: row {n}"))
            read += 1
        # named by a hash of the prompt, as the callback names them, so a prompt seen again keeps its name
        groups += [
            Group(step, hashlib.sha1(k.encode()).hexdigest()[:12], tuple(v)) for (step, k), v in order.items()
        ]
    if not groups:
        raise UserError(f"{directory}: the completions files hold no rows")
    return groups
