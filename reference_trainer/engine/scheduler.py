"""Continuous batching: admit waiting sequences into free slots, otherwise decode every running one."""

from __future__ import annotations

import heapq
import itertools

from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    """Waiting requests are admitted by (priority, arrival); a step is a prefill when any can be admitted."""

    def __init__(self, slots: SlotManager, max_prefill_tokens: int) -> None:
        self.slots = slots
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._arrival = itertools.count()
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        # What a decode step reads of `running`, kept between the steps that change it (an admission or a
        # release): a decode step runs in series with the GPU, so it should not re-sort and re-key 256 rows.
        self.membership = 0  # counts changes to `running`
        self.occupied: dict[str, str] = {}  # str(slot) -> seq_id, as the trace records a step's slots
        self._decode: list[Sequence] | None = []  # running sequences by slot; None: to be rebuilt
        self.lookahead_running = 0  # running sequences that are lookahead runs (the trace counts them apart)

    def add(self, seq: Sequence) -> None:
        heapq.heappush(self._waiting, (seq.priority, next(self._arrival), seq))

    @property
    def waiting(self) -> list[Sequence]:
        """Sequences not yet admitted, in admission order."""
        return [
            s for *_, s in sorted(self._waiting, key=lambda e: e[:2]) if s.status == SequenceStatus.WAITING
        ]

    @property
    def num_waiting(self) -> int:
        return sum(1 for *_, s in self._waiting if s.status == SequenceStatus.WAITING)

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def schedule(self) -> tuple[str, list[Sequence]]:
        """("prefill", admitted) when a waiting sequence fits in a free slot, else ("decode", running)."""
        admitted: list[Sequence] = []
        longest = 0
        while self._waiting and self.slots.num_free > 0:
            seq = self._waiting[0][2]
            if seq.status != SequenceStatus.WAITING:  # aborted while waiting
                heapq.heappop(self._waiting)
                continue
            longest_if = max(longest, seq.length)
            if admitted and longest_if * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            heapq.heappop(self._waiting)
            seq.slot = self.slots.allocate()
            seq.status = SequenceStatus.RUNNING
            self._occupy(seq.slot, seq)
            admitted.append(seq)
            longest = longest_if
        if admitted:
            return "prefill", admitted
        if self._decode is None:
            self._decode = [self.running[s] for s in sorted(self.running)]
        return "decode", list(self._decode)

    def release(self, seq: Sequence) -> None:
        """Free a finished or aborted sequence's slot."""
        if seq.slot is not None and self.running.get(seq.slot) is seq:
            self._occupy(seq.slot, None)
            self.slots.release(seq.slot)
        seq.slot = None

    def _occupy(self, slot: int, seq: Sequence | None) -> None:
        """Put `seq` in `slot` (None: empty it), keeping the decode order and the trace's view in step."""
        if seq is None:
            self.lookahead_running -= self.running[slot].lookahead
            del self.running[slot], self.occupied[str(slot)]
        else:
            self.running[slot], self.occupied[str(slot)] = seq, seq.seq_id
            self.lookahead_running += seq.lookahead
        self._decode = None
        self.membership += 1
