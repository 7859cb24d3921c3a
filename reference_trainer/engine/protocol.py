"""What the rest of the project needs from a rollout engine, and what the engine asks of speculation.

- `RolloutEngine`: what the training loop touches (train/trainer.py): the trace, the policy version it
  tags tokens with, in-place weight updates, and `close`. Every rollout side satisfies it: the reference
  `Engine`, `VLLMEngine`, and the worker pools (rollout/workers.py, whose `WorkerPool` extends it).
- `RequestEngine`: one engine that takes requests: what the strategies (rollout/base.py, rollout/sorted.py),
  eval (rlbench/eval/backends.py) and `rlbench generate` use. `Engine` and `VLLMEngine` satisfy it.
- `Speculation`: the hook the reference engine consults before each decode step (speculation/speculator.py
  implements it). The hook chooses; the engine runs every forward itself, a plain decode or its exact
  `Engine.verify` of the hook's drafts, and reports back what the step did (`DecodeReport`).

The engine protocols are runtime-checkable; tests/test_engine_protocol.py also compares signatures, which
isinstance does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, astuple, dataclass
from typing import Any, Protocol, runtime_checkable

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.sequence import OnFinish, Params, Request, Sequence
from reference_trainer.trace.writer import Trace


@runtime_checkable
class RolloutEngine(Protocol):
    trace: Trace  # engine steps (and, for pools, every worker's) go here
    policy_version: int  # the version new tokens are tagged with

    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """New weights in place; in-flight work continues under them. version None: the next one."""

    def prepare(self, params: SamplingParams) -> None:
        """Before a run's first timed step: whatever its steps would otherwise pay for inside the clock
        (graph captures, compiles, cost measurements) for requests sampled with `params`."""

    def close(self) -> None:
        """Stop in-flight work and free workers; the engine is not used afterwards."""


@runtime_checkable
class RequestEngine(RolloutEngine, Protocol):
    config: EngineConfig  # strategies read config.max_num_seqs (the slot capacity)
    max_model_len: int

    def add_request(self, request: Request) -> Sequence:
        """Queue a request; its `response_ids` (with log-probs and versions) resume a partial rollout."""

    def step(self) -> list[Sequence]:
        """One engine step; returns the sequences that finished in it."""

    def abort(self, seq: Sequence) -> Sequence:
        """Stop `seq` now; its tokens so far stay on it."""

    def has_unfinished(self) -> bool: ...

    @property
    def running(self) -> list[Sequence]: ...

    @property
    def waiting(self) -> list[Sequence]:
        """Not yet admitted, in admission order."""

    def generate(
        self, prompts: list[list[int]], params: Params = None, on_finish: OnFinish = None
    ) -> list[Sequence]:
        """Run prompts to completion; their sequences in input order. `on_finish(i, seq)` as each one
        finishes (i: its index in `prompts`)."""


@dataclass(frozen=True)
class VerifyCounts:
    """A verify forward's tokens, of one sequence or (summed) of the forward: its `verify` event's counts."""

    emitted: int = 0
    lookahead: int = 0  # emitted by lookahead requests
    drafted: int = 0
    accepted: int = 0  # drafted tokens accepted and emitted
    draft_seqs: int = 0  # sequences with a draft
    draft_emitted: int = 0  # emitted by sequences with a draft

    def __add__(self, other: VerifyCounts) -> VerifyCounts:
        return VerifyCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def event_counts(self) -> dict[str, int]:
        """The counts the `verify` event carries besides its tokens."""
        return {k: v for k, v in asdict(self).items() if k not in ("emitted", "lookahead")}


@dataclass
class DecodeReport:
    """What one decode step did, for the `Speculation` hook: a plain decode (`drafts` None) or a verify of
    `drafts`, with `accepted[i]` of sequence i's draft tokens accepted; `seconds`: the forward with its
    sampling and read-back (drafting excluded), what a cost model predicts (None for a step that also
    carried admissions: not the forward a cost table times)."""

    seqs: list[Sequence]
    seconds: float | None
    drafts: list[list[int]] | None = None
    accepted: list[int] | None = None

    @property
    def width(self) -> int:
        """Tokens per row of the forward: 1 for a plain decode, 1 + the longest draft for a verify."""
        return 1 + max((len(d) for d in self.drafts), default=0) if self.drafts else 1


class Speculation(Protocol):
    """The reference engine's speculation hook (speculation/speculator.py): drafts in, observations back."""

    # The accept rule of `Engine.verify` (sampler.coupled_accept: exact); another only to show what it costs.
    accept_rule: Callable[[Any, Any, Any], Any]

    def propose(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]] | None:
        """Drafts for this decode step, one list per sequence and at most `rooms[i]` tokens each (the room
        left by its max_tokens, the cache and the verify width); None: a plain decode step."""

    def observe(self, report: DecodeReport) -> None:
        """What the decode step did (its time, and per sequence what was accepted)."""

    def released(self, seq: Sequence) -> None:
        """`seq` left the engine, finished or aborted (a finished response is history for its siblings)."""
