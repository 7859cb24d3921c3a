"""The trainer under faults: a resume keeps every finished step, a run stopped in its final held-out
evaluation or before its config was written still resumes, stale checkpoint temps are cleaned, and a loss or
weights that stop being finite end the run with one line, keeping the last good checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_trainer import Killed, tiny_config

from reference_trainer.errors import UserError
from reference_trainer.model.loader import load_model
from reference_trainer.trace.records import read_jsonl
from reference_trainer.train.trainer import Trainer


def _kill_after(step: int):
    def on_step(row):
        if row["step"] == step:
            raise Killed

    return on_step


def test_a_resume_keeps_the_steps_finished_after_the_last_checkpoint(tiny_model_dir, tmp_path, toy_task):
    config = tiny_config(tiny_model_dir, 4, task=toy_task)
    config.checkpoint_every = 5  # no checkpoint before the kill
    with pytest.raises(Killed):
        Trainer(config, tmp_path).run(_kill_after(1))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    trace_before = (tmp_path / "trace.jsonl").read_bytes()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    stale = tmp_path / "checkpoints" / ".step-000002.tmp4242"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / ".metrics.jsonl.4242-abcd.tmp").write_text("partial")
    resumed = Trainer(config, tmp_path, resume=True)
    assert not stale.exists() and not (tmp_path / ".metrics.jsonl.4242-abcd.tmp").exists()
    rows = resumed.run()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    logged = (tmp_path / "metrics.jsonl").read_bytes()
    assert logged.startswith(before)  # the first run's rows, timings included, kept as written
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    assert (tmp_path / "trace.jsonl").read_bytes().startswith(trace_before)
    rollouts = [e["step"] for e in read_jsonl(tmp_path / "trace.jsonl") if e["kind"] == "rollout"]
    assert rollouts == [0, 1, 2, 3]  # the re-run steps' events are not written twice
    straight = Trainer(tiny_config(tiny_model_dir, 4, task=toy_task), tmp_path / "straight")
    straight.run()
    for name, param in straight.policy.state_dict().items():
        assert torch.equal(param, resumed.policy.state_dict()[name]), name


def test_a_run_stopped_in_its_final_heldout_evaluation_writes_it_on_resume(
    tiny_model_dir, tmp_path, monkeypatch
):
    config = tiny_config(tiny_model_dir, 2, eval_every=5, eval_problems=4, eval_samples=1)

    def killed(self):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "write_heldout_summary", killed)
        with pytest.raises(Killed):
            Trainer(config, tmp_path).run()
    assert not (tmp_path / "heldout.json").exists()
    assert Trainer(config, tmp_path, resume=True).run() == []  # every step was finished
    curve = json.loads((tmp_path / "heldout.json").read_text())["curve"]
    assert [point["step"] for point in curve] == [0, 2]


def test_a_run_stopped_before_its_parts_were_built_resumes(tiny_model_dir, tmp_path, monkeypatch):
    from reference_trainer.train import trainer as trainer_module
    from reference_trainer.train.config import load_run_config

    config = tiny_config(tiny_model_dir, 2)

    def killed(*args):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(trainer_module, "assemble", killed)  # a kill while the model loads
        with pytest.raises(Killed):
            Trainer(config, tmp_path)
    assert load_run_config(tmp_path) == config
    assert [r["step"] for r in Trainer(config, tmp_path, resume=True).run()] == [0, 1]


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_model_dir, tmp_path, toy_task):
    trainer = Trainer(tiny_config(tiny_model_dir, 4, task=toy_task), tmp_path)
    reward_of = trainer.task.reward_of
    trainer.task.reward_of = lambda *a: math.nan if trainer.step == 2 else reward_of(*a)
    with pytest.raises(UserError, match=r"step 2: the loss is nan .* last good checkpoint is .*step-000002"):
        trainer.run()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    good = load_model(tmp_path / "checkpoints" / "step-000002")
    assert all(torch.isfinite(p).all() for p in good.state_dict().values())
    assert all(torch.isfinite(p).all() for p in trainer.policy.state_dict().values())  # never stepped


def test_weights_made_non_finite_by_a_step_stop_the_run(tiny_model_dir, tmp_path, toy_task):
    trainer = Trainer(tiny_config(tiny_model_dir, 2, task=toy_task), tmp_path)
    step = trainer.updater.optimizer.step

    def overflowing_step(*args, **kwargs):
        step(*args, **kwargs)
        with torch.no_grad():
            trainer.policy.lm_head.weight[0, 0] = math.inf

    trainer.updater.optimizer.step = overflowing_step
    message = "step 0: an optimizer step made the weights non-finite.*before its first"
    with pytest.raises(UserError, match=message):
        trainer.run()
    assert not (tmp_path / "metrics.jsonl").exists()
