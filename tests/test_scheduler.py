"""The scheduler keeps what a decode step reads of its running set (the rows in slot order, the trace's
slot map, the membership count) between the admissions and releases that change it: after any sequence of
them, those views equal what the running set says."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.scheduler import Scheduler
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
            kind, seqs = scheduler.schedule()
            if kind == "decode":
                assert seqs == [scheduler.running[slot] for slot in sorted(scheduler.running)]
                assert scheduler.membership == before  # nothing changed: the kept list
                seqs.clear()  # a caller's list is its own
            else:
                assert scheduler.membership == before + len(seqs)
        assert scheduler.occupied == {str(slot): s.seq_id for slot, s in scheduler.running.items()}
    if scheduler.running and not scheduler.num_waiting:
        assert scheduler.schedule()[1] == [scheduler.running[slot] for slot in sorted(scheduler.running)]
