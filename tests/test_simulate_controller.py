"""SortedRL on two engines replayed under the trainer's own controller (rlbench/simulate/controller.py): on
a recorded run whose engines report in a fixed order (the in-process pool), the replay's dispatch decisions
(each admission's engines, per dispatch event) and every engine's forwards equal the run's, step by step;
replayed under another policy than the run's, the decisions differ and the verdict says so. Counts and
decisions, not timings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import small_arith_run

from rlbench.simulate.controller import CUT, drives, recorded
from rlbench.simulate.replay import validate


def sorted_run(tmp_path_factory, mode: str, policy: str) -> Path:
    """A 3-step run of `mode` on 2 in-process engines of 4 slots: 4 prompts x 4 per update, so the
    oversubscribed pool (32 samples) is four times the slots, and early termination cuts work short."""
    return small_arith_run(
        tmp_path_factory,
        mode=mode,
        steps=3,
        prompts_per_step=4,
        max_num_seqs=4,
        workers=2,
        mode_options={"dispatch": policy},
    )


@pytest.mark.e2e  # a whole training run, then the replay
@pytest.mark.parametrize(("mode", "policy"), [("sorted", "round-robin"), ("sorted-partial", "least-tokens")])
def test_controller_replay_gives_the_runs_dispatch_and_forwards(tmp_path_factory, mode, policy):
    run = sorted_run(tmp_path_factory, mode, policy)
    assert drives(mode, {"dispatch": policy}, 2) and not drives(mode, {"dispatch": policy}, 1)
    doc = validate(run)
    assert doc["workers"] == 2 and len(doc["steps"]) == 3
    events = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    # the run cut work short at the quota: the replay must cut it at the same forwards
    assert any(e.get("kind") == "sequence" and e.get("finish_reason") == "abort" for e in events)
    for row in doc["steps"]:
        assert row["simulated_dispatch"] == row["measured_dispatch"], row["step"]
        assert len(row["measured_dispatch"]) > 1  # admissions dispatched one at a time, not once a step
        assert row["simulated_engine_forwards"] == row["measured_engine_forwards"], row["step"]
        assert row["simulated_slot_steps"] == row["measured_slot_steps"], row["step"]
    assert doc["verdict"]["forwards_equal"] and doc["verdict"]["dispatch_equal"]
    assert "dispatch decisions equal" in doc["verdict"]["text"]

    other = tmp_path_factory.mktemp("other-policy")
    shutil.copy(run / "trace.jsonl", other)
    config = json.loads((run / "train_config.json").read_text())
    config["mode_options"]["dispatch"] = "group-spread"  # a group's samples over both engines
    (other / "train_config.json").write_text(json.dumps(config))
    altered = validate(other)
    assert altered["verdict"]["dispatch_equal"] is False and not altered["verdict"]["holds"]
    assert "dispatch decisions differ" in altered["verdict"]["text"]


def test_recorded_lengths_come_from_sequence_events_or_the_forwards_slots():
    """A finished request's length is its event's; a request cut at the quota is kept apart (what the run
    saw of it); a kept partial that finished with no event after its cut is counted from the forwards that
    name it in their slots (all of them, the earlier steps' included)."""

    def seq(step: int, sample: int, status: str, reason: str, tokens: int) -> dict:
        fields = {"prompt_index": 7, "prompt_id": "p7", "id": f"p7/{sample}", "prompt_tokens": 5}
        ends = {"status": status, "finish_reason": reason, "response_tokens": tokens}
        return {"kind": "sequence", "step": step, **fields, **ends}

    def fwd(step: int, *samples: int) -> dict:
        slots = {str(i): f"p7/{s}" for i, s in enumerate(samples)}
        return {"kind": "decode", "step": step, "worker": 0, "slots": slots}

    events = [fwd(0, 0, 1), fwd(0, 0, 1), seq(0, 0, "finished", "eos", 2), seq(0, 1, "cached", "abort", 2)]
    events += [fwd(1, 1), fwd(1, 1), fwd(1, 1)]
    lengths, prompts = recorded(events)
    assert prompts == {7: ("p7", 5)}
    assert lengths[7, "p7/0"] == 2  # its event
    assert lengths[7, "p7/1" + CUT] == 2  # cut in step 0 at 2 tokens
    assert lengths[7, "p7/1"] == 5  # then 3 more forwards in step 1, and no event: finished at 5


def test_recorded_lengths_of_a_prompt_seen_again_count_only_its_own_epoch():
    """A prompt the stream cycles back to (a later epoch, at another index) gives its requests the same ids:
    a kept partial of the later epoch that finished with no event is counted from its own forwards, not
    from the earlier epoch's too."""

    def seq(step: int, index: int, status: str, reason: str, tokens: int) -> dict:
        fields = {"prompt_index": index, "prompt_id": "p7", "id": "p7/1", "prompt_tokens": 5}
        return {"kind": "sequence", "step": step, **fields, "status": status, "finish_reason": reason,
                "response_tokens": tokens}  # fmt: skip

    def fwd(step: int) -> dict:
        return {"kind": "decode", "step": step, "worker": 0, "slots": {"0": "p7/1"}}

    events = [fwd(0), fwd(0), seq(0, 7, "finished", "eos", 2)]  # epoch 1, at index 7
    events += [fwd(1), fwd(1), seq(1, 9, "cached", "abort", 2), fwd(2), fwd(2), fwd(2)]  # epoch 2, index 9
    lengths, _ = recorded(events)
    assert lengths[7, "p7/1"] == 2 and lengths[9, "p7/1" + CUT] == 2
    assert lengths[9, "p7/1"] == 5  # 2 before its cut and 3 after, in epoch 2 alone
