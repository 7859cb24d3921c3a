"""The run trace: engine steps, phases and sequences, named as the trace contract in docs/metrics.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import extend_jsonl, write_jsonl
from reference_trainer.trace.schema import ENGINE_KINDS, forward_event, phase_event


class Trace:
    """An append-only list of events with times in seconds from the trace's start.

    One Trace is shared by the engine (prefill/decode/verify events), the trainer (phase events) and the
    rollout strategy (sequence events). `flush_to` appends new events to a JSONL file, so a long run streams
    its trace instead of holding it to the end.
    """

    def __init__(self, worker: int = 0, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.worker = worker
        self.events: list[dict[str, Any]] = []
        self.step = 0  # the RL step the current events belong to; the trainer sets it
        self._flushed = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, event: dict[str, Any]) -> None:
        event.setdefault("step", self.step)
        if event.get("kind") in ENGINE_KINDS:  # an engine's trace is its worker's: every event names it
            event.setdefault("worker", self.worker)
        self.events.append(event)

    def engine_step(
        self,
        kind: str,
        t_start: float,
        t_end: float,
        slots: dict[str, str],
        capacity: int,
        tokens: int,
        **extra: Any,
    ) -> None:
        """One engine forward. `slots`: str(slot) -> sequence id of every occupied slot, keyed as JSON keys
        them, recorded as given (the caller passes a map of its own: the engine a copy of its scheduler's)."""
        self.add(
            forward_event(
                kind, t_start, t_end, len(slots), capacity, tokens, worker=self.worker, slots=slots, **extra
            )
        )

    @contextmanager
    def phase(self, kind: str, **extra: Any) -> Iterator[dict[str, Any]]:
        """Record a rollout/reward/update/sync phase around a block; the block may add fields to the
        yielded dict (e.g. the reward phase's `reward_mean`)."""
        t_start = self.now()
        fields: dict[str, Any] = dict(extra)
        try:
            yield fields
        finally:
            self.add_phase(kind, t_start, self.now(), **fields)

    def add_phase(self, kind: str, t_start: float, t_end: float, **fields: Any) -> None:
        """A phase already over (a rollout run ahead's, timed by its own side)."""
        self.add(phase_event(kind, t_start, t_end, **fields))

    def flush_to(self, path: str | Path) -> None:
        """Append the events not yet written to a JSONL file (fsync'd, so a kill loses nothing written)."""
        new = self.events[self._flushed :]
        if not new:
            return
        extend_jsonl(path, new)
        self._flushed = len(self.events)

    def drop_since(self, index: int) -> None:
        """Forget the events from `index` on (not yet flushed): work re-done only to rebuild state."""
        if index < self._flushed:
            raise ValueError(f"events from {index} on were already flushed (up to {self._flushed})")
        del self.events[index:]

    def write_jsonl(self, path: str | Path) -> None:
        write_jsonl(path, self.events)
