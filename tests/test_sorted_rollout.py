"""SortedRL's rollout strategy against a fake engine (property-based), then tiny real-trainer runs of it."""

from __future__ import annotations

import heapq
import itertools
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.modes import MODES, STRATEGY_TABLE
from reference_trainer.rollout.base import PromptStream, RolloutContext
from reference_trainer.rollout.sorted import NEW, REQUEUED, SortedOptions, SortedPartialRollout, SortedRollout
from reference_trainer.tasks.arith import ArithTask
from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.writer import Trace
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.rows import TIMING_FIELDS
from reference_trainer.train.trainer import Trainer


class FakeEngine:
    """The Engine API the strategy uses. A request finishes after a length drawn per (prompt, sample,
    attempt) via its seed, so a resumed request continues to the same target. Checks the invariants the
    strategy must keep as it goes."""

    def __init__(self, capacity: int, lengths: list[int]) -> None:
        self.config = EngineConfig(max_num_seqs=capacity)
        self.trace = Trace()
        self.policy_version = 0
        self.lengths = lengths
        self.strategy: SortedRollout | None = None
        self.ctx: RolloutContext | None = None
        self.idle_slot_steps = 0
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._running: list[Sequence] = []
        self._arrival = itertools.count()

    def target(self, seq: Sequence) -> int:
        return self.lengths[seq.params.seed % len(self.lengths)]

    def _queued(self) -> list[Sequence]:
        return [s for *_, s in self._waiting if s.status == SequenceStatus.WAITING]

    def add_request(self, request: Request) -> Sequence:
        params, priority, response_ids = request.params, request.priority, list(request.response_ids)
        logprobs, policy_versions = request.logprobs, request.policy_versions
        if priority == NEW:  # no new prompt while re-queued work cannot all start at the next step,
            requeued = sum(s.priority == REQUEUED for s in self._queued())
            assert requeued <= self.config.max_num_seqs - len(self._running)
            # nor beyond the oversubscription bound (regenerations may exceed it: they are not admissions)
            assert self.strategy is not None and self.ctx is not None
            assert self.strategy.unfinished() <= self.strategy.max_unfinished(self.ctx)
        assert len(logprobs or []) == len(policy_versions or []) == len(response_ids)
        assert len(response_ids) < self.target_of(params)
        seq = Sequence(
            str(request.seq_id),
            list(request.prompt_ids),
            params,
            response_ids,
            list(logprobs or []),
            list(policy_versions or []),
            priority=priority,
            meta=dict(request.meta),
        )
        seq.t_admit = self.trace.now()
        heapq.heappush(self._waiting, (priority, next(self._arrival), seq))
        return seq

    def target_of(self, params: SamplingParams) -> int:
        return self.lengths[params.seed % len(self.lengths)]

    def abort(self, seq: Sequence) -> Sequence:
        if seq in self._running:
            self._running.remove(seq)
        if not seq.is_finished:
            seq.status, seq.finish_reason, seq.t_finish = SequenceStatus.ABORTED, "abort", self.trace.now()
        return seq

    def has_unfinished(self) -> bool:
        return bool(self._running) or bool(self._queued())

    @property
    def running(self) -> list[Sequence]:
        return list(self._running)

    def step(self) -> list[Sequence]:
        t_start = self.trace.now()
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            seq = heapq.heappop(self._waiting)[2]
            if seq.status == SequenceStatus.WAITING:
                seq.status = SequenceStatus.RUNNING
                self._running.append(seq)
        capacity = self.config.max_num_seqs
        assert len(self._running) <= capacity
        strategy, ctx = self.strategy, self.ctx
        assert strategy is not None and ctx is not None
        if len(self._running) < capacity:  # an idle slot only when the oversubscription bound is reached
            self.idle_slot_steps += 1
            assert strategy.unfinished() + ctx.group_size > strategy.max_unfinished(ctx)
        occupied = {str(i): s.seq_id for i, s in enumerate(self._running)}
        finished = []
        for seq in list(self._running):
            seq.response_ids.append(7)
            seq.logprobs.append(-0.5)
            seq.policy_versions.append(self.policy_version)
            if len(seq.response_ids) >= self.target(seq):
                seq.status, seq.finish_reason, seq.t_finish = SequenceStatus.FINISHED, "eos", self.trace.now()
                self._running.remove(seq)
                finished.append(seq)
        self.trace.engine_step("decode", t_start, self.trace.now(), occupied, capacity, len(occupied))
        return finished


def make_ctx(engine: FakeEngine, group_size: int, update_batch: int, seed: int = 0) -> RolloutContext:
    return RolloutContext(
        engine=engine,  # type: ignore[arg-type]
        tokenizer=CharTokenizer(),
        stream=PromptStream(ArithTask(), seed),
        group_size=group_size,
        update_batch=update_batch,
        params=SamplingParams(max_tokens=10_000),
        seed=seed,
    )


def drive(cls, options, ctx, steps: int, checkpoint_at: int | None = None):
    """The trainer loop with a fake update (a version bump); optionally a checkpoint round trip mid-run.
    Returns the strategy and, per step, (version, consumed groups as plain data)."""
    engine = ctx.engine
    strategy = cls(SortedOptions(**options))
    engine.strategy, engine.ctx = strategy, ctx
    log = []
    for step in range(steps):
        engine.trace.step = step
        version = engine.policy_version
        groups = strategy.collect(ctx)
        assert not engine.has_unfinished()  # nothing survives a collect inside the engine
        log.append(
            (
                version,
                [
                    (
                        g.index,
                        [
                            (
                                s.meta["sample"],
                                s.finish_reason,
                                list(s.response_ids),
                                list(s.logprobs),
                                list(s.policy_versions),
                            )
                            for s in g.samples
                        ],
                    )
                    for g in groups
                ],
            )
        )
        engine.policy_version += 1
        if step == checkpoint_at:
            state = json.loads(json.dumps({"ctrl": strategy.state_dict(), "stream": ctx.stream.state_dict()}))
            strategy = cls(SortedOptions(**options))
            strategy.load_state_dict(state["ctrl"])
            ctx.stream = PromptStream(ctx.stream.task, ctx.stream.seed)
            ctx.stream.load_state_dict(state["stream"])
            engine.strategy = strategy
    return strategy, log


workloads = st.fixed_dictionaries(
    {
        "partial": st.booleans(),
        "group_size": st.integers(1, 4),
        "update_batch": st.integers(1, 4),
        "capacity": st.integers(1, 12),
        "oversubscription": st.sampled_from([1.0, 1.5, 2.0, 3.0]),
        "max_staleness": st.integers(0, 3),
        "max_attempts": st.none() | st.integers(1, 3),
        "lengths": st.lists(st.integers(1, 30), min_size=1, max_size=24),
        "steps": st.integers(1, 6),
    }
)


def split(w: dict):
    cls = SortedPartialRollout if w["partial"] else SortedRollout
    options = {k: w[k] for k in ("oversubscription", "max_staleness", "max_attempts")}
    return cls, options


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads)
def test_sorted_rollout_invariants(w):
    cls, options = split(w)
    engine = FakeEngine(w["capacity"], w["lengths"])
    ctx = make_ctx(engine, w["group_size"], w["update_batch"])
    strategy, log = drive(cls, options, ctx, w["steps"])
    trained: list[int] = []
    for version, groups in log:
        assert len(groups) == w["update_batch"]  # the update fires on exactly update_batch groups
        for index, samples in groups:
            trained.append(index)
            assert [s[0] for s in samples] == list(range(w["group_size"]))  # complete groups only
            for _, reason, tokens, logprobs, versions in samples:
                assert reason == "eos" and len(tokens) == len(logprobs) == len(versions) >= 1
                staleness = [version - v for v in versions]
                assert min(staleness) >= 0
                bound = w["max_staleness"] if w["partial"] else 0
                assert max(staleness) <= bound
        lengths = [sum(len(s[2]) for s in samples) for _, samples in groups]
        assert len(lengths) == len(set(trained[-len(groups) :]))
    # Every admitted prompt is trained (once), dropped (only with max_attempts), or still in the buffer.
    active = [p.index for p in strategy.active]
    assert len(trained) == len(set(trained))
    assert sorted(trained + strategy.dropped + active) == list(range(ctx.stream.next_index))
    assert not strategy.dropped or w["max_attempts"] is not None
    assert strategy.stats["admitted"] == ctx.stream.next_index
    if w["partial"]:
        assert strategy.stats["aborted"] == 0 and not strategy.dropped


@settings(max_examples=60, deadline=None)
@given(workloads, st.data())
def test_checkpoint_round_trip_replays_the_run(w, data):
    cls, options = split(w)
    steps = w["steps"] + 1
    at = data.draw(st.integers(0, steps - 2))
    straight = drive(
        cls,
        options,
        make_ctx(FakeEngine(w["capacity"], w["lengths"]), w["group_size"], w["update_batch"]),
        steps,
    )[1]
    resumed = drive(
        cls,
        options,
        make_ctx(FakeEngine(w["capacity"], w["lengths"]), w["group_size"], w["update_batch"]),
        steps,
        checkpoint_at=at,
    )[1]
    assert resumed == straight


def test_shortest_groups_first_and_partial_resume():
    # Two samples per prompt, room for all of them: prompt lengths come from the seeds, so compare the
    # consumed groups with the fake's own targets.
    engine = FakeEngine(capacity=8, lengths=[3, 25, 4, 9, 2, 30, 5])
    ctx = make_ctx(engine, group_size=2, update_batch=1)
    strategy, log = drive(SortedPartialRollout, {"oversubscription": 4.0, "max_staleness": 5}, ctx, 3)
    first = log[0][1][0][1]
    # The update fires on the first group to complete: no later than the shortest-longest sample of the 4
    # prompts admitted at the start (later admissions start later, so only a shorter one can beat it).
    longest = [max(engine.lengths[_seed(ctx, i, k) % 7] for k in range(2)) for i in range(4)]
    assert max(len(s[2]) for s in first) <= min(longest)
    assert strategy.stats["cached"] > 0  # the rest was cached and resumed, not restarted
    resumed = [s for _, groups in log[1:] for _, samples in groups for s in samples if len(set(s[4])) > 1]
    assert resumed, "some consumed sample must carry tokens of two policy versions"


def _seed(ctx: RolloutContext, index: int, sample: int) -> int:
    from reference_trainer.rollout.base import request_seed

    return request_seed(ctx.seed, index, sample)


def test_sorted_regenerates_with_a_new_attempt():
    engine = FakeEngine(capacity=4, lengths=[2, 40, 3, 35, 2, 50])
    ctx = make_ctx(engine, group_size=2, update_batch=1)
    strategy, _ = drive(SortedRollout, {"oversubscription": 3.0}, ctx, 2)
    assert strategy.stats["regenerated"] > 0 and strategy.stats["aborted"] > 0
    attempts = [s.attempt for p in strategy.active for s in p.samples]
    assert max(attempts) >= 1
    aborted = [e for e in engine.trace.events if e.get("kind") == "sequence" and e["status"] == "aborted"]
    assert aborted and all(e["step"] in (0, 1) for e in aborted)


def test_a_prompt_pool_smaller_than_the_prompts_held_is_one_line():
    """A pool cycled while its prompt is still active would give two live requests one id (a silent mix-up
    of their tokens on W engines, a KeyError on one): the config refuses the pool before anything loads,
    and a strategy that meets it anyway says so in one line."""
    from reference_trainer.errors import UserError
    from reference_trainer.rollout.sorted import prompts_held

    assert prompts_held(2.0, 2, 2) == 4 and prompts_held(1.5, 3, 4) == 4 and prompts_held(1.0, 3, 3) == 3
    small = {"prompts_per_step": 2, "group_size": 2, "mode_options": {"oversubscription": 2.0}}
    for mode in ("sorted", "sorted-partial", "sorted+lookahead"):
        with pytest.raises(UserError, match="--prompt-pool 3 is smaller than the 4 prompts SortedRL") as err:
            TrainConfig(mode=mode, prompt_pool=3, eval_every=0, **small).check()
        assert "\n" not in str(err.value) and "use --prompt-pool >= 4" in str(err.value)
        TrainConfig(mode=mode, prompt_pool=4, eval_every=0, **small).check()
    TrainConfig(mode="baseline", prompt_pool=2, eval_every=0, prompts_per_step=2).check()  # one step's only
    engine = FakeEngine(capacity=8, lengths=[5, 9])
    ctx = make_ctx(engine, group_size=2, update_batch=2)
    ctx.stream = PromptStream(ArithTask(), 0, pool=2)
    with pytest.raises(
        UserError, match=r"came round again while SortedRL still holds it \(2 prompts active\)"
    ):
        drive(SortedPartialRollout, {"oversubscription": 2.0}, ctx, 1)


def test_registries_and_options():
    assert {"sorted", "sorted-partial"} <= set(MODES) and MODES["sorted-partial"].tis_cap == 2.0
    assert STRATEGY_TABLE["sorted"].load() is SortedRollout
    assert STRATEGY_TABLE["sorted-partial"].load() is SortedPartialRollout
    with pytest.raises(ValueError):
        SortedRollout(SortedOptions(oversubscription=0.5))
    with pytest.raises(ValueError):
        SortedRollout(SortedOptions(max_staleness=-1))


# ---- the real trainer at tiny shapes -------------------------------------------------------------------


def tiny_config(model_dir, mode: str, steps: int, **kw) -> TrainConfig:
    config = TrainConfig(
        eval_every=0,
        steps=steps,
        model=str(model_dir),
        mode=mode,
        prompts_per_step=2,
        group_size=3,
        max_tokens=16,
        max_num_seqs=6,
        max_model_len=256,
        checkpoint_every=2,
        mode_options={"oversubscription": 2.0, "max_staleness": 2},
        **kw,
    )
    config.grpo.lr = 1e-2
    config.grpo.micro_batch_size = 4
    return config


class Killed(Exception):
    pass


@pytest.mark.parametrize("mode", ["sorted", "sorted-partial"])
def test_trainer_resume_reproduces_uninterrupted_run(tiny_model_dir, tmp_path, toy_task, mode, one_thread):
    straight = Trainer(tiny_config(tiny_model_dir, mode, 4, task=toy_task), tmp_path / "straight")
    straight.run()

    def kill_after_step_2(row):
        if row["step"] == 2:
            raise Killed  # after step 2 was logged, before its checkpoint (checkpoints at 2 and 4)

    with pytest.raises(Killed):
        Trainer(tiny_config(tiny_model_dir, mode, 4, task=toy_task), tmp_path / "killed").run(
            kill_after_step_2
        )
    resumed = Trainer(tiny_config(tiny_model_dir, mode, 4, task=toy_task), tmp_path / "killed", resume=True)
    assert resumed.step == 2
    assert resumed.strategy.state_dict() == json.loads(json.dumps(resumed.strategy.state_dict()))
    resumed.run()

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]

    rows = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert strip(read_jsonl(tmp_path / "killed" / "metrics.jsonl")) == strip(rows)
    assert all(r["samples"] == 6 for r in rows)
    assert ("tis_weight_mean" in rows[0]) == (mode == "sorted-partial")
    for name, param in straight.policy.state_dict().items():
        assert torch.equal(param, resumed.policy.state_dict()[name]), name

    # The bubble ratio recomputed by hand from trace.jsonl equals what reference_trainer.trace.metrics
    # reports.
    events = read_jsonl(tmp_path / "straight" / "trace.jsonl")
    report = metrics.compute(straight.trace.events)
    slot_time = capacity_time = 0.0
    for step in range(4):
        rollout = next(e for e in events if e["kind"] == "rollout" and e["step"] == step)
        wall = rollout["t_end"] - rollout["t_start"]
        engine = [e for e in events if e["kind"] in ("prefill", "decode") and e["step"] == step]
        busy = sum(e["active_slots"] * (e["t_end"] - e["t_start"]) for e in engine)
        assert all(rollout["t_start"] <= e["t_start"] <= e["t_end"] <= rollout["t_end"] for e in engine)
        assert report["steps"][step]["bubble_ratio"] == pytest.approx(1 - busy / (6 * wall), abs=1e-12)
        slot_time, capacity_time = slot_time + busy, capacity_time + 6 * wall
        consumed = [
            e for e in events if e["kind"] == "sequence" and e["step"] == step and e["status"] == "finished"
        ]
        assert len(consumed) == 6 and report["steps"][step]["update_batch_lengths"] == sorted(
            e["response_tokens"] for e in consumed
        )
    assert report["summary"]["bubble_ratio"] == pytest.approx(1 - slot_time / capacity_time, abs=1e-12)
    staleness = report["summary"]["staleness"]
    assert mode == "sorted-partial" or set(staleness) == {"0"}
    assert max(int(k) for k in staleness) <= 2
    assert not math.isnan(report["summary"]["rollout_tokens_per_s"])
