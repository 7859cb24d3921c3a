"""What the rest of the project needs from a rollout engine, as two protocols.

- `RolloutEngine`: what the training loop touches (train/trainer.py): the trace, the policy version it
  tags tokens with, in-place weight updates, and `close`. Every rollout side satisfies it: the reference
  `Engine`, `VLLMEngine`, and the worker pools (rollout/workers.py, whose `WorkerPool` extends it).
- `RequestEngine`: one engine that takes requests: what the strategies (rollout/base.py, rollout/sorted.py),
  eval (rlbench/eval/backends.py) and `rlbench generate` use. `Engine` and `VLLMEngine` satisfy it.

Both are runtime-checkable; tests/test_engine_protocol.py also compares signatures, which isinstance
does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.sequence import Sequence
from reference_trainer.trace.writer import Trace


@runtime_checkable
class RolloutEngine(Protocol):
    trace: Trace  # engine steps (and, for pools, every worker's) go here
    policy_version: int  # the version new tokens are tagged with

    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """New weights in place; in-flight work continues under them. version None: the next one."""
        ...

    def close(self) -> None:
        """Stop in-flight work and free workers; the engine is not used afterwards."""
        ...


@runtime_checkable
class RequestEngine(RolloutEngine, Protocol):
    config: EngineConfig  # strategies read config.max_num_seqs (the slot capacity)
    max_model_len: int

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        seq_id: str | None = None,
        response_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        policy_versions: list[int] | None = None,
        priority: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Sequence:
        """Queue a request; `response_ids` (with log-probs and versions) resumes a partial rollout."""
        ...

    def step(self) -> list[Sequence]:
        """One engine step; returns the sequences that finished in it."""
        ...

    def abort(self, seq: Sequence) -> Sequence:
        """Stop `seq` now; its tokens so far stay on it."""
        ...

    def has_unfinished(self) -> bool: ...

    @property
    def running(self) -> list[Sequence]: ...

    @property
    def waiting(self) -> list[Sequence]:
        """Not yet admitted, in admission order."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        on_finish: Callable[[int, Sequence], None] | None = None,
    ) -> list[Sequence]:
        """Run prompts to completion; their sequences in input order. `on_finish(i, seq)` as each one
        finishes (i: its index in `prompts`)."""
        ...
