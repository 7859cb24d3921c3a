"""What the speculator asks of a drafter (histospec.py, suffix.py, lookahead.py implement it)."""

from __future__ import annotations

from typing import Any, Protocol

from reference_trainer.engine.sequence import Sequence
from reference_trainer.option import option


def max_draft() -> Any:
    """The longest draft: a field of every drafter's options (HistoSpec's, SuffixDecoding's, lookahead's)."""
    return option(8, "longest draft", minimum=1, simulated=True)


class Drafter(Protocol):
    def draft(self, seq: Sequence, limit: int) -> list[int]:
        """Up to `limit` tokens that may continue `seq`'s response (the engine verifies them exactly)."""

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """How many of `seq`'s `drafted` tokens the last verify accepted."""

    def on_done(self, seq: Sequence, epoch: int) -> None:
        """`seq` left the engine (finished or aborted) under policy version `epoch`."""

    def add_response(self, prompt_ids: list[int], response_ids: list[int], epoch: int = 0) -> None:
        """A response generated elsewhere (another worker, an earlier run), as history."""

    def stats(self) -> dict[str, Any]:
        """What the drafter holds (for benchmarks and reports)."""
