"""A rollout run ahead of the update (modes async, sorted+async): k = 0 is the synchronous baseline exactly,
no trained token is more than k versions old, a killed run resumes with nothing lost, and the rollout never
reads half-written weights."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

import pytest
import ring_writer
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ring_writer import filled, template
from test_trainer import Killed, tiny_config

from reference_trainer.errors import UserError
from reference_trainer.modes import MODES
from reference_trainer.rollout.ahead import split_threads
from reference_trainer.rollout.ring import TornRead, WeightRing
from reference_trainer.tasks import TASKS
from reference_trainer.tasks.arith import ArithTask
from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_jsonl
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.grpo import GRPOUpdater
from reference_trainer.train.rows import TIMING_FIELDS
from reference_trainer.train.trainer import Trainer


class Parity(ArithTask):
    """arith prompts rewarded by the parity of a response's distinct characters (conftest's toy task), at
    module level: the rollout process unpickles the task by name."""

    name = "parity"

    def grade(self, problem, response):
        return True, len(set(response)) % 2 == 1


@pytest.fixture
def parity(monkeypatch) -> str:
    monkeypatch.setitem(TASKS, "parity", Parity)
    return "parity"


def _config(model_dir, steps: int, mode: str = "baseline", threads: int = 1, **options) -> TrainConfig:
    """An async mode at k >= 1 splits the threads between its sides: 2 gives each one."""
    return tiny_config(model_dir, steps, task="parity", mode=mode, mode_options=options, threads=threads)


def _run(config: TrainConfig, out) -> tuple[list[dict], list[dict[str, torch.Tensor]]]:
    """The run's rows and the policy's weights after each step."""
    trainer = Trainer(config, out)
    weights = []
    try:
        rows = trainer.run(
            lambda row: weights.append({k: v.clone() for k, v in trainer.policy.state_dict().items()})
        )
    finally:
        trainer.close()
    return rows, weights


def _samples(out) -> list[tuple]:
    return [
        (
            e["step"],
            e["id"],
            e["status"],
            e["response_tokens"],
            e["finish_reason"],
            e["policy_versions"],
            e["reward"],
        )
        for e in read_jsonl(out / "trace.jsonl")
        if e["kind"] == "sequence"
    ]


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


@pytest.mark.e2e
def test_k0_is_the_synchronous_baseline_exactly(tiny_model_dir, tmp_path, parity):
    """At max_staleness 0 the rollout process waits for every update: the same samples (ids, lengths, finish
    reasons, versions, rewards) and the same weights after every step as the baseline's."""
    base_rows, base_weights = _run(_config(tiny_model_dir, 3), tmp_path / "baseline")
    rows, weights = _run(_config(tiny_model_dir, 3, "async", max_staleness=0), tmp_path / "async")
    assert any(0 < r["reward_mean"] < 1 for r in rows)  # the updates move the weights
    assert _samples(tmp_path / "async") == _samples(tmp_path / "baseline")
    for mine, theirs in zip(weights, base_weights, strict=True):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert _untimed(rows) == _untimed(base_rows)
    kinds = {e["kind"] for e in read_jsonl(tmp_path / "async" / "trace.jsonl")}
    assert {"trainer_wait", "rollout", "sync", "decode"} <= kinds


class _Jitter:
    """Random pauses on both sides (the thread backend shares the patched code), so the two interleave
    differently from run to run."""

    def __init__(self, seed: int, scale_s: float) -> None:
        self.rng, self.scale = random.Random(seed), scale_s

    def __call__(self) -> None:
        time.sleep(self.rng.random() * self.scale)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    k=st.integers(0, 3),
    steps=st.integers(1, 5),
    sorted_mode=st.booleans(),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.0, 0.01, 0.05]),
)
def test_no_trained_token_is_more_than_k_versions_old(
    tiny_model_dir, tmp_path_factory, k, steps, sorted_mode, seed, scale
):
    """Whatever the timing on either side: every trained token is exactly min(step, k) versions behind the
    update (step t rolls out on version t - k), the metrics say the same, and the trainer would refuse
    anything older."""
    from reference_trainer.engine.engine import Engine

    mode = "sorted+async" if sorted_mode else "async"
    out = tmp_path_factory.mktemp("staleness")
    config = tiny_config(
        tiny_model_dir, steps, mode=mode, mode_options={"max_staleness": k, "backend": "thread"}
    )
    jitter = _Jitter(seed, scale)
    step, update = Engine.step, GRPOUpdater.update
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "step", lambda self: (jitter(), step(self))[1])
        patch.setattr(GRPOUpdater, "update", lambda self, batch: (jitter(), update(self, batch))[1])
        _run(config, out)
    events = read_jsonl(out / "trace.jsonl")
    versions = {e["step"]: e["policy_version"] for e in events if e["kind"] == "update"}
    trained = [e for e in events if e["kind"] == "sequence" and e["status"] == "finished"]
    assert len(trained) == steps * config.prompts_per_step * config.group_size
    for e in trained:
        assert {versions[e["step"]] - v for v in e["policy_versions"]} <= {min(e["step"], k)}
    summary = metrics.compute(events)["summary"]
    assert summary["staleness_max"] == min(steps - 1, k)


def test_the_trainer_refuses_samples_older_than_the_bound(tiny_model_dir, tmp_path):
    """A rollout side that ran further ahead than k (a scheduling bug) is an error, never trained on."""
    from reference_trainer.rollout import ahead

    config = tiny_config(
        tiny_model_dir, 3, mode="async", mode_options={"max_staleness": 1, "backend": "thread"}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ahead.AheadSpec, "version_for", lambda self, step: 0)  # always the first weights
        trainer = Trainer(config, tmp_path)
        try:
            with pytest.raises(RuntimeError, match="more than 1 behind"):
                trainer.run()
        finally:
            trainer.close()


@pytest.mark.e2e
def test_a_killed_async_run_resumes_with_nothing_lost(tiny_model_dir, tmp_path, parity):
    """k = 2: the checkpoint after step 2 keeps the weights of versions 1 and 2 that steps 3 and 4 roll out
    on; the resumed run re-runs step 2 and ends with the rows, trace steps and weights of an uninterrupted
    run."""
    straight_rows, straight_weights = _run(
        _config(tiny_model_dir, 5, "async", threads=2, max_staleness=2), tmp_path / "a"
    )

    def kill_after_step_2(row):
        if row["step"] == 2:
            raise Killed

    killed = Trainer(_config(tiny_model_dir, 5, "async", threads=2, max_staleness=2), tmp_path / "b")
    with pytest.raises(Killed):
        killed.run(kill_after_step_2)
    killed.close()
    assert len(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == 3
    resumed = Trainer(
        _config(tiny_model_dir, 5, "async", threads=2, max_staleness=2), tmp_path / "b", resume=True
    )
    try:
        assert resumed.step == 2 and sorted(resumed.rollout.history()) == [0, 1]
        resumed.run()
    finally:
        resumed.close()
    assert _untimed(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == _untimed(straight_rows)
    assert _samples(tmp_path / "b") == _samples(tmp_path / "a")
    for name, param in straight_weights[-1].items():
        assert torch.equal(param, resumed.policy.state_dict()[name]), name


# ---- the weight ring ------------------------------------------------------------------------------------


def test_a_slot_rewritten_while_it_is_read_is_a_torn_read_never_weights():
    ring = WeightRing(template(), 2, threading.Condition())
    try:
        ring.publish(filled(0), 0)
        ring.publish(filled(1), 1)
        assert ring.read(1)["a"].eq(1).all() and ring.versions() == [0, 1]

        def interrupted(slot):
            part = slot["a"][:32].clone()
            ring.publish(filled(3), 3)  # version 3 takes version 1's slot mid-copy
            return part

        with pytest.raises(TornRead):
            ring.read_into(1, interrupted)
        with pytest.raises(RuntimeError, match="not published"):
            ring.read(1)
    finally:
        ring.close()


@pytest.mark.parametrize("side", ["thread", pytest.param("process", marks=pytest.mark.e2e)])
def test_reads_racing_a_writer_are_whole_versions_or_refused(side):
    """A writer (a thread, or a process of its own) publishing as fast as it can over a 2-slot ring, no
    protocol holding it back: every read the rollout side completes holds exactly one version, the one it
    asked for; the rest are refused."""
    if side == "process":
        mp = multiprocessing.get_context("spawn")
        ring = WeightRing(template(), 2, mp.Condition())
        writer = mp.Process(target=ring_writer.publish, args=(ring, 150), daemon=True)
    else:
        ring = WeightRing(template(), 2, threading.Condition())
        writer = threading.Thread(target=ring_writer.publish, args=(ring, 150), daemon=True)
    writer.start()
    whole = torn = 0
    try:
        while writer.is_alive() or whole == 0:
            with ring.lock:
                stamps = [int(v) for v in ring.stamps.tolist() if v >= 0]
            for version in stamps:
                try:
                    got = ring.read(version)
                except (TornRead, RuntimeError):
                    torn += 1
                    continue
                assert all(t.eq(version).all() for t in got.values()), version
                whole += 1
    finally:
        writer.join(timeout=30)
        ring.close()
    assert whole > 0


# ---- the thread budget and the checks -------------------------------------------------------------------


def test_the_two_sides_split_the_thread_budget():
    assert split_threads(4, 1) == (2, 2)
    assert split_threads(3, 2, rollout=1) == (1, 2)
    assert split_threads(1, 0) == (1, 1)  # k = 0: the sides never run at once
    assert split_threads(1, 1) == (1, 1)  # one free core: each side one thread, sharing it
    with pytest.raises(UserError, match="leaves the update none of --threads 2: pass --threads 3"):
        split_threads(2, 1, rollout=2)
    assert split_threads(3, 1, rollout=2) == (2, 1)  # the fix the refusal names works


def test_an_async_mode_on_one_free_core_runs_and_says_so_before_any_folder(tmp_path, capsys):
    from typer.testing import CliRunner

    from rlbench.cli import app_
    from rlbench.training import build_configs

    configs = build_configs(["baseline", "async"], threads=1, device="cpu")
    assert set(configs) == {"baseline", "async"}  # the default on a 2-core machine is accepted
    said = capsys.readouterr().err
    assert "async runs rollout and update side by side" in said and "each side takes 1" in said
    assert "baseline" not in said  # a synchronous mode has nothing to split
    out = tmp_path / "cmp"
    asked = ["compare", "--modes", "baseline,async", "--threads", "2", "--device", "cpu", "--out", str(out)]
    refused = CliRunner().invoke(app_, [*asked, "--mode-option", "rollout_threads=2"])
    assert isinstance(refused.exception, UserError) and "pass --threads 3" in str(refused.exception)
    assert not out.exists()  # checked before any work or folder: the named fix then meets no leftovers


def test_async_modes_refuse_what_they_cannot_run(tmp_path):
    with pytest.raises(UserError, match="reference engine"):
        MODES["async"].check_options({}, engine="vllm")
    # W engines: the rollout process drives them under one controller (rollout/multi.py)
    TrainConfig(mode="sorted+async", workers=2, worker_backend="local").check()
    with pytest.raises(UserError, match="max_staleness must be >= 0"):
        TrainConfig(mode="async", mode_options={"max_staleness": -1}).check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_async_runs_rollout_and_update_side_by_side_on_a_gpu(tiny_model_dir, tmp_path, parity):
    """The same code on CUDA: the rollout process shares the run's GPU (or takes the second one), its tokens
    are k versions old, and k = 0 is the baseline exactly there too."""
    device = "cuda:1" if torch.cuda.device_count() > 1 else None
    config = _config(tiny_model_dir, 3, "async", max_staleness=1, rollout_device=device)
    config.device = "cuda"
    rows, _ = _run(config, tmp_path / "k1")
    assert [r["staleness"] for r in rows][1:] == [
        {"1": r["response_len_mean"] * r["samples"]} for r in rows[1:]
    ]
    base = _config(tiny_model_dir, 2)
    base.device = "cuda"
    same = _config(tiny_model_dir, 2, "async", max_staleness=0)
    same.device = "cuda"
    _run(base, tmp_path / "base")
    _run(same, tmp_path / "k0")
    assert _samples(tmp_path / "k0") == _samples(tmp_path / "base")
