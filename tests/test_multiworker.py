"""Rollout over several workers: same samples as one engine, migration, weight sync, resume, real Ray."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

from reference_trainer.errors import UserError
from reference_trainer.rollout.base import PromptStream, RolloutContext
from reference_trainer.rollout.dispatch import DispatchOptions
from reference_trainer.rollout.placed import PlacedRollout
from reference_trainer.rollout.workers import LocalWorkerPool, WorkerSpec
from reference_trainer.trace.metrics import compute
from reference_trainer.trace.writer import Trace
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer


def config(
    model_dir, task, mode="histopipe", workers=2, steps=2, worker_backend="local", **kw
) -> TrainConfig:
    cfg = TrainConfig(
        eval_every=0,
        steps=steps,
        model=str(model_dir),
        task=task,
        mode=mode,
        prompts_per_step=3,
        group_size=3,
        max_tokens=20,
        max_num_seqs=4,
        max_model_len=256,
        prompt_pool=3,
        checkpoint_every=1,
        workers=workers,
        worker_backend=worker_backend,
        **kw,
    )
    cfg.grpo.lr = 1e-2
    cfg.grpo.micro_batch_size = 4
    return cfg


def responses(trainer: Trainer) -> dict[str, list[int]]:
    groups = trainer.strategy.collect(trainer.ctx)
    return {s.seq_id: s.response_ids for g in groups for s in g.samples}


@pytest.mark.parametrize("mode", ["baseline", "histopipe", "rhyme"])
def test_two_workers_give_the_samples_of_one_engine(tiny_model_dir, toy_task, tmp_path, mode):
    one = Trainer(config(tiny_model_dir, toy_task, "baseline", workers=1), tmp_path / "one")
    two = Trainer(config(tiny_model_dir, toy_task, mode, workers=2), tmp_path / "two")
    assert isinstance(two.engine, LocalWorkerPool)
    for _ in range(2):  # the second epoch places by history (and drafts from it in rhyme)
        expected, got = responses(one), responses(two)
        assert got == expected
    workers = {e["worker"] for e in two.trace.events if e["kind"] in ("decode", "verify")}
    assert workers == {0, 1}


def test_weights_reach_every_worker_after_an_update(tiny_model_dir, toy_task, tmp_path):
    trainer = Trainer(config(tiny_model_dir, toy_task), tmp_path / "run")
    trainer.run()
    policy = trainer.policy.state_dict()
    for worker in trainer.engine.workers:
        assert worker.engine.policy_version == 2
        for name, value in worker.engine.model.state_dict().items():
            if name in policy:
                torch.testing.assert_close(value, policy[name].to(value.dtype))


def test_idle_worker_takes_unstarted_requests_from_the_busiest(tiny_model_dir, toy_task, tmp_path):
    trainer = Trainer(config(tiny_model_dir, toy_task, "baseline", workers=1), tmp_path / "one")
    spec = WorkerSpec(trainer.policy.config, trainer.engine.config, sorted(trainer.tokenizer.eos_token_ids))
    spec.engine_config.max_num_seqs = 1  # one slot per worker: queued requests wait long enough to move
    pool = LocalWorkerPool(spec, trainer.policy.state_dict(), 2, Trace())
    ctx = RolloutContext(
        pool, trainer.tokenizer, PromptStream(trainer.task, 0), 3, 3, trainer.ctx.params, seed=0
    )
    # round-robin with migration switched on: worker 0 gets groups 0 and 2, worker 1 only group 1
    strategy = PlacedRollout(DispatchOptions("round-robin", migrate=True))
    groups = strategy.collect(ctx)
    moves = [e for e in pool.trace.events if e["kind"] == "migrate"]
    assert moves and all(m["from"] != m["to"] and m["requests"] >= 1 for m in moves)
    seqs = [e for e in pool.trace.events if e["kind"] == "sequence"]
    assert sorted(s["id"] for s in seqs) == sorted(s.seq_id for g in groups for s in g.samples)
    assert len(seqs) == 9 and all(len(g.samples) == 3 for g in groups)
    # Each sequence is credited to the worker whose engine ran it.
    ran_on = {
        seq_id: e["worker"]
        for e in pool.trace.events
        if e["kind"] in ("prefill", "decode")
        for seq_id in e["slots"].values()
    }
    assert all(ran_on[s["id"]] == s["worker"] for s in seqs)
    assert any(s.meta["worker"] != g % 2 for g, group in enumerate(groups) for s in group.samples)


def test_resume_with_workers_matches_an_uninterrupted_run(tiny_model_dir, toy_task, tmp_path):
    straight = Trainer(config(tiny_model_dir, toy_task, steps=3), tmp_path / "straight")
    rows = straight.run()

    class Kill(Exception):
        pass

    def kill_after_first_step(row):  # told after the step's checkpoint: the resume starts at step 1
        if row["step"] == 0:
            raise Kill

    with pytest.raises(Kill):
        Trainer(config(tiny_model_dir, toy_task, steps=3), tmp_path / "killed").run(kill_after_first_step)
    resumed = Trainer(config(tiny_model_dir, toy_task, steps=3), tmp_path / "killed", resume=True)
    assert resumed.step == 1 and resumed.strategy.history.last  # length history restored
    last = resumed.run()[-1]
    assert last["reward_mean"] == rows[-1]["reward_mean"]
    assert last["response_len_mean"] == rows[-1]["response_len_mean"]


def test_lookahead_modes_take_several_workers_under_the_controller(tiny_model_dir, toy_task, tmp_path):
    """Each engine fills its own bubble (rollout/base.py EngineFill): each worker has its own lookahead
    drafter and cost gate (tests/test_lookahead.py runs them)."""
    from reference_trainer.rollout.multi import MultiEngine
    from reference_trainer.speculation.lookahead import LookaheadDrafter

    options = {"spec": {"cost_model": [[1, 1, 1.0], [64, 16, 1.0]]}}
    trainer = Trainer(config(tiny_model_dir, toy_task, "lookahead", mode_options=options), tmp_path / "run")
    assert isinstance(trainer.engine, MultiEngine) and len(trainer.engine.pool.workers) == 2
    assert trainer.engine.dispatch == "round-robin"  # the controller's default policy, as the baseline's
    assert all(isinstance(w.speculator.drafter, LookaheadDrafter) for w in trainer.engine.pool.workers)


def test_missing_ray_is_a_clear_error(tiny_model_dir, toy_task, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UserError, match=r"pip install 'rlbench\[ray\]'"):
        Trainer(config(tiny_model_dir, toy_task, worker_backend="ray"), tmp_path / "run")


@pytest.mark.e2e
def test_two_ray_actors_end_to_end(tiny_model_dir, toy_task, tmp_path, monkeypatch, capfd):
    ray = pytest.importorskip("ray")
    # Ray's defaults: token auth with a token written to ~/.ray/auth_token (outside the run) and a WARNING
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLBENCH_RAY_TMPDIR", tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    local = Trainer(config(tiny_model_dir, toy_task, steps=2), tmp_path / "local")
    local_rows = local.run()
    trainer = Trainer(config(tiny_model_dir, toy_task, steps=2, worker_backend="ray"), tmp_path / "ray")
    try:
        rows = trainer.run()
        pids = ray.get(
            [a.__ray_call__.remote(lambda self: os.getpid()) for a in trainer.engine.actors], timeout=120
        )
    finally:
        trainer.close()
        ray.shutdown()
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two real actor processes
    out = capfd.readouterr()
    assert "Token authentication" not in out.err + out.out and "Started a local Ray" not in out.err + out.out
    assert os.environ["RAY_AUTH_MODE"] == "token" and not (tmp_path / "home").exists()  # auth on, no file
    # Same samples and the same updates as the in-process pool.
    assert [r["response_len_mean"] for r in rows] == [r["response_len_mean"] for r in local_rows]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in local_rows]
    metrics = compute(trainer.trace.events)
    for step in metrics["steps"]:
        assert set(step["worker_idle_share"]) == {"0", "1"}
        assert min(step["worker_idle_share"].values()) == 0.0  # the slowest worker is never idle
        assert step["capacity"] == 2 * 4  # bubble ratio counts both workers' slots
