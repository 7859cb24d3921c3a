"""The scheduler keeps what a decode step reads of its running set (the rows in slot order, the trace's
slot map, the membership count) between the admissions and releases that change it: after any sequence of
them, those views equal what the running set says."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.scheduler import AdmissionGate, Scheduler
from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.model.config import ModelConfig

CONFIG = ModelConfig(
    vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=64,
)  # fmt: skip


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["add", "schedule", "release"]), st.integers(0, 7)), max_size=40)
)
def test_decode_views_follow_admissions_and_releases(ops: list[tuple[str, int]]) -> None:
    scheduler = Scheduler(SlotManager(CONFIG, 4, 32, torch.device("cpu"), torch.float32), 64)
    made = 0
    for op, pick in ops:
        before = scheduler.membership
        if op == "add":
            scheduler.add(Sequence(f"s{made}", [1, 2], SamplingParams()))
            made += 1
        elif op == "release" and scheduler.running:
            seq = list(scheduler.running.values())[pick % len(scheduler.running)]
            seq.status = SequenceStatus.FINISHED
            scheduler.release(seq)
            assert scheduler.membership > before
        elif op == "schedule" and scheduler.has_work():
            running_before = [scheduler.running[slot] for slot in sorted(scheduler.running)]
            kind, running, admitted = scheduler.schedule()
            assert running == running_before  # the decode rows: what ran before, in slot order
            assert scheduler.membership == before + len(admitted)
            assert set(scheduler.running.values()) == {*running, *admitted}
            assert kind == ("prefill" if admitted and not running else "decode")
            running.clear()  # a caller's list is its own
        assert scheduler.occupied == {str(slot): s.seq_id for slot, s in scheduler.running.items()}
    if scheduler.running and not scheduler.num_waiting:
        assert scheduler.schedule()[1] == [scheduler.running[slot] for slot in sorted(scheduler.running)]


def test_admissions_ride_at_once_without_overhead_and_wait_out_a_measured_one() -> None:
    """The gate's ski rental: with no overhead admissions ride in the next step; with an overhead of k
    decode steps at B running rows they wait until the free slots' idle slot-steps reach k x B."""
    assert all(AdmissionGate().admit(running, 1) for running in (0, 1, 64))
    gate = AdmissionGate(overhead=lambda batch: 0.5)  # an admitting step costs half a decode step more
    waited = 0
    while not gate.admit(8, 1):  # one ready request at 8 running rows: 0.5 x 8 = 4 idle slot-steps
        waited += 1
    assert waited == 3 and gate.owed == 0  # accrued 1, 2, 3: wait; 4: ride, and the debt starts over
    assert gate.admit(0, 3)  # nothing running: a prefill of its own, nothing to wait for
    assert AdmissionGate(overhead=lambda batch: 0.5).admit(8, 4)  # four ready slots pay it at once
