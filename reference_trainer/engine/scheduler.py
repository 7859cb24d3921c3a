"""Continuous batching: every step decodes the running sequences, and waiting ones admitted into free slots
ride in that step (a prefill of its own only when nothing runs), as vLLM's chunked prefill mixes them."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.trace.schema import DECODE, PREFILL


class AdmissionGate:
    """Whether admissions ride in the next decode step, or wait.

    A step with admissions may cost more than a plain decode step: on a GPU each replays a CUDA graph of its
    own, and the admitting one also runs the admitted prompts' tokens (engine/mixed.py). `overhead(batch)`
    is that extra cost, in plain decode steps at `batch` running rows (measured by the engine:
    Engine.measure_admission_overhead). Waiting costs the free slots' idle time; admitting costs the
    overhead for every running row. Ski rental: idle slot-steps accrue while admissions wait, and they ride
    once those reach the overhead times the running rows, which costs at most twice the better of the two
    choices in hindsight (Karlin, Manasse, Rudolph and Sleator, 1988). With no overhead (the CPU, where every
    forward runs eagerly) they ride at once."""

    def __init__(self, overhead: Callable[[int], float] | None = None) -> None:
        self.overhead = overhead
        self.owed = 0.0  # idle slot-steps accrued since admissions began to wait

    def admit(self, running: int, ready: int) -> bool:
        """Whether `ready` admissible requests ride in a decode step of `running` rows now."""
        if self.overhead is None or running == 0:
            return True
        self.owed += ready
        if self.owed < self.overhead(running) * running:
            return False
        self.owed = 0.0
        return True


class Scheduler:
    """Waiting requests are admitted by (priority, arrival) into free slots: into a decode step of the
    running sequences when any run (as the gate allows), else as a prefill of their own."""

    def __init__(
        self, slots: SlotManager, max_prefill_tokens: int, gate: AdmissionGate | None = None
    ) -> None:
        self.slots = slots
        self.max_prefill_tokens = max_prefill_tokens
        self.gate = gate or AdmissionGate()
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

    def schedule(self) -> tuple[str, list[Sequence], list[Sequence]]:
        """("prefill", [], admitted) when nothing runs and a waiting sequence fits a free slot; else
        ("decode", running, admitted): the running sequences' decode step, with the sequences admitted into
        free slots riding in it (none while the gate holds them back)."""
        if self._decode is None:
            self._decode = [self.running[s] for s in sorted(self.running)]
        running = self._decode
        free = self.slots.num_free
        ready = min(free, self.num_waiting) if free and self._waiting else 0
        admitted = self._admit() if ready and self.gate.admit(len(running), ready) else []
        if not running:
            return (PREFILL, [], admitted) if admitted else (DECODE, [], [])
        return DECODE, list(running), admitted

    def _admit(self) -> list[Sequence]:
        """Waiting sequences into free slots, in admission order, while their padded prefill fits
        `max_prefill_tokens`."""
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
        return admitted

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
