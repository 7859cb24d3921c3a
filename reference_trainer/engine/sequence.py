"""One request's state as it moves through the engine."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.engine.config import SamplingParams
from reference_trainer.trace.schema import SEQUENCE


def resume_seed(seed: int, resumed_tokens: int) -> int:
    """A seeded request's generator seed for vLLM, whose generator is a stream: offset by the tokens it
    resumes with so that a resumed request does not replay its first draws. (The reference engine needs no
    offset: its draws are keyed by token position, engine/sampler.py.)"""
    return seed * 1_000_003 + resumed_tokens


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

    @classmethod
    def for_request(
        cls,
        seq_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        max_model_len: int,
        policy_version: int,
        response_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        policy_versions: list[int] | None = None,
        priority: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Sequence:
        """A new request, validated: it fits `max_model_len`, has a prompt, and a resumed response
        (`response_ids`) comes with one log-prob and one policy version per token (defaults: NaN and
        `policy_version`)."""
        response_ids = list(response_ids or [])
        total = len(prompt_ids) + len(response_ids)
        if total >= max_model_len:
            raise ValueError(f"request of {total} tokens does not fit max_model_len {max_model_len}")
        if not prompt_ids:
            raise ValueError("empty prompt")
        seq = cls(
            seq_id=seq_id,
            prompt_ids=list(prompt_ids),
            params=params,
            response_ids=response_ids,
            logprobs=list(logprobs or [float("nan")] * len(response_ids)),
            policy_versions=list(policy_versions or [policy_version] * len(response_ids)),
            priority=priority,
            meta=dict(meta or {}),
            resumed_tokens=len(response_ids),
        )
        if not params.stop and not params.stop_token_ids:
            seq.stops_only_on_eos_below = min(params.max_tokens, max_model_len - len(prompt_ids))
        if len(seq.logprobs) != len(response_ids) or len(seq.policy_versions) != len(response_ids):
            raise ValueError("logprobs and policy_versions must have one entry per response token")
        return seq

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
        status = {SequenceStatus.FINISHED: "finished", SequenceStatus.ABORTED: "aborted"}.get(
            self.status, "cached"
        )
        return {
            "kind": SEQUENCE,
            "id": self.seq_id,
            "prompt_id": str(self.meta.get("prompt_id", self.seq_id)),
            "sample": int(self.meta.get("sample", 0)),
            "prompt_tokens": len(self.prompt_ids),
            "response_tokens": len(self.response_ids),
            "t_admit": self.t_admit,
            "t_finish": self.t_finish,
            "policy_versions": list(self.policy_versions) if self.policy_versions else None,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "status": status,
            "finish_reason": self.finish_reason,
        }
