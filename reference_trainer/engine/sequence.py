"""One request's state as it moves through the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.config import SamplingParams


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

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

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
            "kind": "sequence",
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
            "status": self.meta.get("trace_status", status),
            "finish_reason": self.finish_reason,
        }
