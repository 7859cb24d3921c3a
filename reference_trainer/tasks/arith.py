"""Multi-step arithmetic with a heavy-tailed chain length: the long-tail workload rollout bubbles come from.

A problem is a start value and a list of operations applied left to right (no precedence), e.g.

    prompt:   "Start with 7, apply in order: +3 *2 -5 +4. Result?"
    response: "7 +3*2-5+4\\n10 *2-5+4\\n20 -5+4\\n15 +4\\n19\\nanswer: 19"

The number of operations k is drawn from a truncated discrete power law, P(k) ~ k^-alpha on
[min_ops, max_ops]. The response carries the state from line to line: the running value and the
operations still to apply, so a step reads only the line above it (no counting into the prompt, which a
tiny char model cannot learn in minutes). Its length grows as ~k^2, which makes the tail heavier still:
with the defaults the median response is 37 chars and the p99 345 (9x). Operands are single digits and
the exact running value stays in [0, 99].
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass

from reference_trainer.option import option
from reference_trainer.tasks.base import (
    ANSWER_MARKER,
    BaseTask,
    Problem,
    TaskOptions,
    chat_prompt,
    error_probability,
    final_answer_section,
    problem_rng,
    prompt_id,
)
from reference_trainer.tasks.grading import grade_math

MAX_VALUE = 19  # the running value stays in [0, 19]: an arithmetic table a tiny model learns in minutes


_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def apply_op(value: int, op: str, k: int) -> int:
    if op not in _APPLY:
        raise ValueError(f"unknown op {op!r}")
    return _APPLY[op](value, k)


@dataclass(frozen=True)
class ArithOptions(TaskOptions):
    """arith's options."""

    min_ops: int = option(2, "fewest operations in a chain (>= 1)")
    max_ops: int = option(16, "most operations in a chain (>= min_ops)")
    tail_exponent: float = option(1.6, "alpha of P(k) ~ k^-alpha over the chain length k (> 0)")
    sft_step_error: float = option(0.03, "chance that one step of an SFT trace slips")

    def check(self) -> None:
        super().check()
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if self.tail_exponent <= 0:
            raise ValueError(f"tail_exponent must be > 0, got {self.tail_exponent}")


class ArithTask(BaseTask):
    """Left-to-right arithmetic chains.

    SFT traces (`sft_response`) are deliberately imperfect: with probability
    1 - (1 - sft_step_error)^k (so longer chains fail more often) exactly one step, chosen uniformly, writes
    a value off by +-1 or +-2, and every later step is computed correctly from that wrong value. Since +, -
    and *k (k >= 2) all keep a nonzero difference nonzero, a slipped trace always ends in a wrong answer:
    SFT accuracy is exactly 1 - E[slip probability]. With sft_step_error=0 the traces are always correct.
    """

    name = "arith"
    Options = ArithOptions

    def __init__(self, options: ArithOptions | None = None) -> None:
        super().__init__(options)
        o = self.options
        self.min_ops, self.max_ops, self.tail_exponent = o.min_ops, o.max_ops, o.tail_exponent
        self.sft_step_error = o.sft_step_error
        self._op_counts = list(range(o.min_ops, o.max_ops + 1))
        self._op_weights = [k**-o.tail_exponent for k in self._op_counts]

    def problem(self, seed: int, index: int) -> Problem:
        rng = problem_rng(self.name, seed, index)
        num_ops = rng.choices(self._op_counts, weights=self._op_weights)[0]
        value = start = rng.randint(1, MAX_VALUE)
        ops: list[tuple[str, int]] = []
        for _ in range(num_ops):
            op, k = self._sample_op(rng, value)
            ops.append((op, k))
            value = apply_op(value, op, k)
        return Problem(
            prompt_id=prompt_id(self.name, seed, index),
            prompt=self._prompt(start, ops),
            answer=str(value),
            meta={"num_ops": num_ops, "start": start, "ops": ops},
        )

    def _prompt(self, start: int, ops: list[tuple[str, int]]) -> str:
        if self.style == "compact":
            return f"Start with {start}, apply in order: {' '.join(f'{op}{k}' for op, k in ops)}. Result?"
        steps = ", then ".join(f"{_OP_WORDS[op]} {k}" for op, k in ops)
        return chat_prompt(
            f"Start with {start}. Apply these operations in order, left to right: {steps}. "
            "What is the result?",
            "math",
        )

    @staticmethod
    def _sample_op(rng: random.Random, value: int) -> tuple[str, int]:
        # Pick the operation type first so '*' is as common as '+'/'-' whenever it is allowed.
        choices: dict[str, list[int]] = {
            "+": [k for k in range(1, 10) if value + k <= MAX_VALUE],
            "-": [k for k in range(1, 10) if value - k >= 0],
            "*": [k for k in (2, 3) if 0 < value * k <= MAX_VALUE],
        }
        op = rng.choice([o for o, ks in choices.items() if ks])
        return op, rng.choice(choices[op])

    def gold(self, problem: Problem) -> int:
        return int(problem.answer)

    def parse(self, problem: Problem, response: str) -> int | None:
        """The integer in the final answer section; None if missing or if anything else is there."""
        section = final_answer_section(response)
        body = section[1:] if section and section.startswith("-") else section
        return int(section) if body and body.isdigit() and body.isascii() else None

    def grade(self, problem: Problem, response: str) -> tuple[bool, bool]:
        if self.style == "compact":
            return super().grade(problem, response)

        return "\\boxed{" in response, grade_math(response, problem.answer, problem=problem.prompt)[1]

    def sft_response(self, problem: Problem, rng: random.Random) -> str:
        """One line per state: the running value, then the operations still to apply. Each line applies the
        first operation of the line before and copies the rest, so every step reads only its neighbour."""
        ops: list[tuple[str, int]] = [tuple(o) for o in problem.meta["ops"]]  # type: ignore[misc]
        slip_at = -1
        if rng.random() < error_probability(self.sft_step_error, len(ops)):
            slip_at = rng.randrange(len(ops))
        value = int(problem.meta["start"])
        lines = [f"{value} {_ops_text(ops)}"]
        for i, (op, k) in enumerate(ops):
            value = apply_op(value, op, k)
            if i == slip_at:
                value += rng.choice((-2, -1, 1, 2))
            lines.append(f"{value} {_ops_text(ops[i + 1 :])}".rstrip())
        chat = f"The result is \\boxed{{{value}}}."
        lines.append(f"{ANSWER_MARKER} {value}" if self.style == "compact" else chat)
        return "\n".join(lines)


_OP_WORDS = {"+": "add", "-": "subtract", "*": "multiply by"}


def _ops_text(ops: list[tuple[str, int]]) -> str:
    return "".join(f"{op}{k}" for op, k in ops)
