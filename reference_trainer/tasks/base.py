"""The task interface: problems (prompt + gold answer), a reward on responses, and SFT traces.

A response is a short chain of thought followed by a final answer section that starts on a line of its
own with `answer:` (e.g. `answer: 42`). Only that section is graded, so reasoning text that happens to
look like an answer never counts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ANSWER_MARKER = "answer:"
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

    def problems(self, n: int, seed: int, start: int = 0) -> list[Problem]: ...

    def reward(self, problem: Problem, response: str) -> float: ...

    def is_correct(self, problem: Problem, response: str) -> bool: ...

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


def error_probability(per_step: float, steps: int, cap: float = 0.95) -> float:
    """Chance that a trace of `steps` steps contains at least one slip, each step slipping with `per_step`."""
    return min(cap, 1.0 - (1.0 - per_step) ** steps)


class BaseTask:
    """Shared reward logic. Subclasses implement `parse` (response -> answer or None) and `gold`.

    reward = 1.0 if the final answer is correct; otherwise `format_reward` if the answer section is present
    and well formed; otherwise 0.0. `format_reward` is 0 by default, so the reward is plain accuracy.
    """

    name: str = ""

    def __init__(self, format_reward: float = 0.0) -> None:
        if not 0.0 <= format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
        self.format_reward = format_reward

    def parse(self, problem: Problem, response: str) -> Any | None:
        raise NotImplementedError

    def gold(self, problem: Problem) -> Any:
        raise NotImplementedError

    def is_correct(self, problem: Problem, response: str) -> bool:
        parsed = self.parse(problem, response)
        return parsed is not None and parsed == self.gold(problem)

    def reward(self, problem: Problem, response: str) -> float:
        parsed = self.parse(problem, response)
        if parsed is None:
            return 0.0
        return 1.0 if parsed == self.gold(problem) else self.format_reward

    def problems(self, n: int, seed: int, start: int = 0) -> list[Problem]:
        return [self.problem(seed, i) for i in range(start, start + n)]

    def problem(self, seed: int, index: int) -> Problem:
        raise NotImplementedError
