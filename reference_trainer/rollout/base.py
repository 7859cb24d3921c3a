"""Rollout strategies: which prompts enter the engine, when, and which finished groups an update consumes.

The trainer loop calls `strategy.collect(ctx)` once per step and trains on the groups it returns; a mode
(baseline, SortedRL, ...) is one strategy class, never a branch inside the loop.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.protocol import RequestEngine
from reference_trainer.engine.sequence import Sequence
from reference_trainer.engine.workers import Request
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.tasks.base import Problem, Task


@dataclass
class Group:
    """All `group_size` samples of one prompt."""

    index: int  # the prompt's position in the stream
    problem: Problem
    samples: list[Sequence]


class PromptStream:
    """The task's problems in a fixed order; the position is part of the run's resumable state."""

    def __init__(self, task: Task, seed: int, pool: int | None = None) -> None:
        self.task, self.seed, self.next_index = task, seed, 0
        self.pool = pool  # cycle a fixed pool of this many problems: epochs repeat prompts

    def take(self) -> tuple[int, Problem]:
        index = self.next_index
        self.next_index += 1
        return index, self.problem(index)

    def problem(self, index: int) -> Problem:
        start = index % self.pool if self.pool else index
        return self.task.problems(1, seed=self.seed, start=start)[0]

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_index = int(state["next_index"])


def request_seed(run_seed: int, index: int, sample: int, attempt: int = 0) -> int:
    """A per-request sampling seed fixed by (run, prompt, sample, attempt): the same in every mode, so modes
    are compared on the same samples, and the same after a resume."""
    return zlib.crc32(f"{run_seed}/{index}/{sample}/{attempt}".encode())


@dataclass
class RolloutContext:
    """What a strategy needs from the run: the engine, the prompt stream and the sampling settings."""

    engine: RequestEngine  # a WorkerPool (workers.py) for PlacedRollout (placed.py)
    tokenizer: Any
    stream: PromptStream
    group_size: int
    update_batch: int  # groups per update
    params: SamplingParams
    seed: int
    _prompt_ids: dict[int, list[int]] = field(default_factory=dict)

    def prompt_ids(self, index: int, problem: Problem) -> list[int]:
        if index not in self._prompt_ids:
            self._prompt_ids[index] = encode_prompt(self.tokenizer, problem.prompt)
        return self._prompt_ids[index]

    def request(
        self, index: int, problem: Problem, sample: int, attempt: int = 0, priority: int = 0
    ) -> Request:
        """One sample's request: its seed depends only on (run seed, prompt position, sample, attempt)."""
        suffix = f"#{attempt}" if attempt else ""
        return Request(
            self.prompt_ids(index, problem),
            replace(self.params, seed=request_seed(self.seed, index, sample, attempt)),
            seq_id=f"{problem.prompt_id}/{sample}{suffix}",
            priority=priority,
            meta={"prompt_id": problem.prompt_id, "sample": sample, "index": index},
        )

    def submit(
        self, index: int, problem: Problem, sample: int, attempt: int = 0, priority: int = 0, **resume: Any
    ) -> Sequence:
        """Queue one sample; `resume` (response_ids, logprobs, policy_versions) continues a partial one."""
        r = self.request(index, problem, sample, attempt, priority)
        return self.engine.add_request(
            r.prompt_ids, r.params, seq_id=r.seq_id, priority=r.priority, meta=r.meta, **resume
        )

    def record(self, seq: Sequence, status: str | None = None, **extra: Any) -> None:
        """Append the sequence's trace event (status overrides: e.g. 'cached' for a kept partial)."""
        record = seq.trace_record()
        if status is not None:
            record["status"] = status
        record.update(extra)
        self.engine.trace.add(record)


class RolloutStrategy(Protocol):
    name: str

    def collect(self, ctx: RolloutContext) -> list[Group]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def run_to_completion(engine: RequestEngine) -> None:
    while engine.has_unfinished():
        engine.step()


class SynchronousRollout:
    """The baseline: admit `update_batch` prompts x `group_size` samples and wait for every one to finish.
    The slowest sample sets the step's length, which is where the bubbles come from."""

    name = "baseline"

    def collect(self, ctx: RolloutContext) -> list[Group]:
        groups = []
        for _ in range(ctx.update_batch):
            index, problem = ctx.stream.take()
            groups.append(
                Group(index, problem, [ctx.submit(index, problem, k) for k in range(ctx.group_size)])
            )
        run_to_completion(ctx.engine)
        for group in groups:
            for seq in group.samples:
                ctx.record(seq)
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
