"""A request (what a caller asks an engine for) and a sequence (that request's state as it moves through the
engine)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.engine.config import SamplingParams
from reference_trainer.trace.schema import sequence_event


def resume_seed(seed: int, resumed_tokens: int) -> int:
    """A seeded request's generator seed for vLLM, whose generator is a stream: offset by the tokens it
    resumes with so that a resumed request does not replay its first draws. (The reference engine needs no
    offset: its draws are keyed by token position, engine/sampler.py.)"""
    return seed * 1_000_003 + resumed_tokens


@dataclass
class Request:
    """Everything needed to (re)submit one request to any engine or rollout worker: the one record of the
    request path (`add_request`, the workers' queues, `Sequence.for_request`).

    `response_ids` (with one log-prob and one policy version per token; defaults NaN and the engine's current
    version) resumes a partial rollout: the engine prefills prompt + response and continues after it.
    `lookahead`: a run ahead of the request of the same prompt and seed in an earlier step's bubble
    (speculation/lookahead.py); its work is counted apart in the trace and is never a sample."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: str | None = None  # None: the engine names it
    priority: int = 0  # lower runs first among waiting requests
    meta: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    policy_versions: list[int] | None = None
    lookahead: bool = False


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class Sequence:
    """Prompt, the response so far and, per response token, its sampling log-prob and policy version.

    A partial rollout is resumed by passing its response tokens (with their log-probs and versions) back in:
    the engine prefills prompt + response and continues from there.
    """

    seq_id: str
    prompt_ids: list[int]
    params: SamplingParams
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    priority: int = 0  # lower runs first among waiting requests
    meta: dict[str, Any] = field(default_factory=dict)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "eos" | "stop" | "length" | "abort"
    slot: int | None = None
    num_cached: int = 0  # tokens whose K/V are in this sequence's slot
    t_admit: float | None = None
    t_finish: float | None = None
    drafted: int = 0
    accepted: int = 0
    resumed_tokens: int = 0  # response tokens that came in with the request (not generated here)
    # The response length before which only an EOS token can stop the sequence (no stop tokens or strings,
    # below max_tokens and the context's end): a decode step checks the stop rules of the rest only. 0:
    # check every token (a sequence not built by `for_request`).
    stops_only_on_eos_below: int = 0
    lookahead: bool = False  # Request.lookahead: work counted apart, never a sample

    @classmethod
    def for_request(
        cls, request: Request, seq_id: str, *, max_model_len: int, policy_version: int
    ) -> Sequence:
        """A new request, validated: it fits `max_model_len`, has a prompt, and a resumed response comes
        with one log-prob and one policy version per token (defaults: NaN and `policy_version`)."""
        response_ids = list(request.response_ids)
        params = request.params
        total = len(request.prompt_ids) + len(response_ids)
        if total >= max_model_len:
            raise ValueError(f"request of {total} tokens does not fit max_model_len {max_model_len}")
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        seq = cls(
            seq_id=seq_id,
            prompt_ids=list(request.prompt_ids),
            params=params,
            response_ids=response_ids,
            logprobs=list(request.logprobs or [float("nan")] * len(response_ids)),
            policy_versions=list(request.policy_versions or [policy_version] * len(response_ids)),
            priority=request.priority,
            meta=dict(request.meta),
            resumed_tokens=len(response_ids),
            lookahead=request.lookahead,
        )
        if not params.stop and not params.stop_token_ids:
            seq.stops_only_on_eos_below = min(params.max_tokens, max_model_len - len(seq.prompt_ids))
        if len(seq.logprobs) != len(response_ids) or len(seq.policy_versions) != len(response_ids):
            raise ValueError("logprobs and policy_versions must have one entry per response token")
        return seq

    def request(self) -> Request:
        """The request that submits this sequence again from scratch (to another worker, say)."""
        return Request(
            self.prompt_ids,
            self.params,
            self.seq_id,
            self.priority,
            dict(self.meta),
            lookahead=self.lookahead,
        )

    @property
    def all_ids(self) -> list[int]:
        """Prompt and response, copied: for a prefill; a decode step needs only `last_token`."""
        return self.prompt_ids + self.response_ids

    @property
    def last_token(self) -> int:
        return self.response_ids[-1] if self.response_ids else self.prompt_ids[-1]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.ABORTED)

    def trace_record(self) -> dict[str, Any]:
        """The trace contract's `sequence` event for this sequence."""
        status = self.status.value if self.is_finished else "cached"  # finished, aborted, or cached
        return sequence_event(
            self.seq_id,
            str(self.meta.get("prompt_id", self.seq_id)),
            int(self.meta.get("sample", 0)),
            self.t_admit,
            self.t_finish,
            status,
            self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            response_tokens=len(self.response_ids),
            policy_versions=list(self.policy_versions) if self.policy_versions else None,
            drafted=self.drafted,
            accepted=self.accepted,
        )


# `generate`'s arguments (engine/protocol.py): one sampling for every prompt, or one each (None: the default);
# and the callback told of each sequence as it finishes, with its prompt's index.
Params = SamplingParams | list[SamplingParams] | None
OnFinish = Callable[[int, Sequence], None] | None
