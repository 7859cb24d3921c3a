"""The task interface: problems (prompt + gold answer), a reward on responses, and SFT traces.

Each task renders its problems in one of two styles:
- `compact`, the embedded char model's: a terse prompt, and a response that is a short chain of thought
  followed by a final answer section on a line of its own starting with `answer:` (e.g. `answer: 42`).
  Only that section is graded, so reasoning text that happens to look like an answer never counts.
- `chat`, for pretrained instruct models (any tokenizer with a chat template): a natural-language prompt
  that asks for the answer in `\\boxed{}` (arith) or as one "(1) Name is a knight" line per person (kk),
  graded as `rlbench eval` grades (math-verify; the lenient K&K parser).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from reference_trainer.option import Options, option, options_of
from reference_trainer.tasks.prompts import user_message

ANSWER_MARKER = "answer:"
STYLES = ("compact", "chat")
_MARKER_RE = re.compile(r"^[ \t]*answer:", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    prompt_id: str  # stable: task name + seed + index, e.g. "arith-s0-000123"
    prompt: str  # ASCII only: chr(10) and chr(32..126), the char tokenizer's alphabet
    answer: str  # gold final answer, canonical string
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    name: str
    max_response_tokens: int

    def problems(self, n: int, seed: int, start: int = 0) -> list[Problem]: ...

    def reward(self, problem: Problem, response: str) -> float: ...

    def is_correct(self, problem: Problem, response: str) -> bool: ...

    def grade(self, problem: Problem, response: str) -> tuple[bool, bool]: ...

    def reward_of(self, answered: bool, correct: bool) -> float: ...

    def sft_response(self, problem: Problem, rng: random.Random) -> str: ...


def prompt_id(task: str, seed: int, index: int) -> str:
    return f"{task}-s{seed}-{index:06d}"


def problem_rng(task: str, seed: int, index: int) -> random.Random:
    """One generator per problem, so problem i does not depend on how many came before it.

    `random.Random(str)` hashes the string with SHA-512, so this is stable across processes and
    independent of PYTHONHASHSEED.
    """
    return random.Random(f"{task}/{seed}/{index}")


def is_ascii_text(text: str) -> bool:
    return all(ch == "\n" or 32 <= ord(ch) <= 126 for ch in text)


def final_answer_section(response: str) -> str | None:
    """Text after the last `answer:` marker that starts a line, stripped; None when there is none."""
    matches = list(_MARKER_RE.finditer(response))
    return response[matches[-1].end() :].strip() if matches else None


def chat_prompt(text: str, kind: str) -> str:
    """A chat-style prompt: the problem text with `rlbench eval`'s instruction for its kind (math | kk)."""
    return user_message(text, kind)


def error_probability(per_step: float, steps: int, cap: float = 0.95) -> float:
    """Chance that a trace of `steps` steps contains at least one slip, each step slipping with `per_step`."""
    return min(cap, 1.0 - (1.0 - per_step) ** steps)


@dataclass(frozen=True)
class TaskOptions(Options):
    """The options every task takes (`--task-option KEY=VALUE`); a task's record adds its own fields and
    ranges (`check`). Checked on construction, each with the one line `rlbench train` prints."""

    format_reward: float = option(0.0, "reward in [0, 1) for an answer in the requested format that is wrong")
    style: str = option("compact", "how problems are rendered and graded", choices=STYLES)

    def __post_init__(self) -> None:
        for o in options_of(type(self)):
            _check_type(o.key, getattr(self, o.key), o.default)
        self.check()

    def check(self) -> None:
        """The record's ranges (a one-line ValueError)."""
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {self.format_reward}")
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")


def _check_type(key: str, value: Any, default: Any) -> None:
    """A value of the type its default has, where the task compares numbers: its range checks would
    otherwise fail on `'<=' not supported between str and int`."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (isinstance(value, int) or not isinstance(default, int))
    else:
        return
    if not ok:
        kind = "true or false" if isinstance(default, bool) else type(default).__name__
        raise ValueError(f"option {key} must be {kind}, got {value!r}")


class BaseTask:
    """Shared reward logic. Subclasses implement `parse` (response -> answer or None) and `gold`; a chat
    style task overrides `grade`.

    reward = 1.0 if the final answer is correct; otherwise `format_reward` if an answer in the requested
    format is present; otherwise 0.0. `format_reward` is 0 by default, so the reward is plain accuracy.
    """

    name: str = ""
    Options: ClassVar[type[TaskOptions]] = TaskOptions  # the record of the task's options
    # Response budget when a run sets none (train --max-tokens, the card): room for the longest SFT trace.
    max_response_tokens: int = 400
    # What an RL run's task is when --task-option says nothing else (fields of its record).
    run_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, options: TaskOptions | None = None) -> None:
        self.options = options = options or self.Options()
        self.format_reward, self.style = options.format_reward, options.style

    def parse(self, problem: Problem, response: str) -> Any | None:
        raise NotImplementedError

    def gold(self, problem: Problem) -> Any:
        raise NotImplementedError

    def grade(self, problem: Problem, response: str) -> tuple[bool, bool]:
        """(an answer in the requested format is present, it is correct)."""
        parsed = self.parse(problem, response)
        return parsed is not None, parsed is not None and parsed == self.gold(problem)

    def is_correct(self, problem: Problem, response: str) -> bool:
        return self.grade(problem, response)[1]

    def reward_of(self, answered: bool, correct: bool) -> float:
        return 1.0 if correct else self.format_reward if answered else 0.0

    def reward(self, problem: Problem, response: str) -> float:
        return self.reward_of(*self.grade(problem, response))

    def problems(self, n: int, seed: int, start: int = 0) -> list[Problem]:
        return [self.problem(seed, i) for i in range(start, start + n)]

    def problem(self, seed: int, index: int) -> Problem:
        raise NotImplementedError
