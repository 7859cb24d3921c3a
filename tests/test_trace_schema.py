"""The trace schema (reference_trainer/trace/schema.py): what the writer records is what the readers accept,
and a malformed trace is one line naming the event for every reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

from reference_trainer.errors import UserError
from reference_trainer.trace.schema import (
    FORWARD_KINDS,
    PHASE_KINDS,
    ROLLOUT_WAIT,
    SEQUENCE,
    TRAINER_WAIT,
    check_events,
    read_trace,
)
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("run")
    config = TrainConfig(model=str(tiny_model_dir), steps=1, prompts_per_step=2, group_size=2, max_tokens=8,
                         eval_every=1, eval_problems=2, eval_samples=1, checkpoint_every=100,
                         max_num_seqs=4)  # fmt: skip
    Trainer(config, out).run()
    return out


def test_a_trained_run_writes_only_known_kinds_and_passes_the_check(run_dir: Path) -> None:
    events = read_trace(run_dir / "trace.jsonl")
    kinds = {e["kind"] for e in events}
    assert kinds <= {*FORWARD_KINDS, *PHASE_KINDS, SEQUENCE}
    synchronous = set(PHASE_KINDS) - {TRAINER_WAIT, ROLLOUT_WAIT}  # the waits of a rollout run ahead
    assert {"prefill", "decode", SEQUENCE, *synchronous} <= kinds  # the held-out evaluation included


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda e: e.pop("t_end"), "t_end is None, not a number"),
        (lambda e: e.update(active_slots="3"), "active_slots is '3', not a number"),
        (lambda e: e.update(worker=-1), "worker is -1, not a worker index"),
        (lambda e: e.update(slots=[1, 2]), "slots is not a {slot: sequence id} map"),
    ],
)
def test_every_reader_refuses_a_malformed_event_in_one_line(run_dir, tmp_path, change, why) -> None:
    events = read_trace(run_dir / "trace.jsonl")
    n = next(i for i, e in enumerate(events) if e["kind"] == "decode")
    change(events[n])
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with pytest.raises(UserError, match=f"event {n + 1} \\(decode\\): {why}"):
        check_events(events, "trace")
    for args in (["report", str(bad)], ["trace", "export", str(bad)]):
        assert_one_line_error(cli(*args), why)
