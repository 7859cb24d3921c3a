"""SortedRL over W rollout engines (rollout/multi.py): the global quota against fake engines (property-based,
with engines of random speeds and one lost mid-run), then the tiny real model: a kept partial resumed on
another engine, W = 1 unchanged, a run resumed with another W, an engine lost mid-step."""

from __future__ import annotations

import heapq
import itertools
import json
import random
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.rollout.base import PromptStream, RolloutContext
from reference_trainer.rollout.dispatch import DISPATCH
from reference_trainer.rollout.multi import MultiEngine
from reference_trainer.rollout.sorted import SortedOptions, SortedPartialRollout, SortedRollout
from reference_trainer.rollout.workers import LocalWorkerPool, WorkerLost, WorkerReport, WorkerSpec
from reference_trainer.tasks.arith import ArithTask
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import ENGINE_LOST
from reference_trainer.trace.writer import Trace
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer

pytestmark = pytest.mark.multi_engine


def token(seed: int, position: int) -> int:
    """The fake sampler: a token fixed by (request seed, position), as the real one's draws are keyed."""
    return (seed * 31 + position * 7) % 50 + 1


class FakeWorker:
    """One engine: slots, a priority queue, one token per running sequence per step, finished at a length
    fixed by the request's seed."""

    def __init__(self, worker: int, capacity: int, lengths: list[int], held: dict[str, int]) -> None:
        self.worker, self.capacity, self.lengths, self.held = worker, capacity, lengths, held
        self.version = 0
        self.waiting: list[tuple[int, int, Sequence]] = []
        self.running: list[Sequence] = []
        self.arrival = itertools.count()

    def submit(self, requests: list[Request]) -> None:
        for r in requests:
            assert r.seq_id not in self.held, "a request held by two engines at once"
            self.held[str(r.seq_id)] = self.worker
            seq = Sequence.for_request(r, str(r.seq_id), max_model_len=10**6, policy_version=self.version)
            heapq.heappush(self.waiting, (r.priority, next(self.arrival), seq))

    def advance(self, steps: int) -> WorkerReport:
        finished = []
        for _ in range(steps):
            while self.waiting and len(self.running) < self.capacity:
                seq = heapq.heappop(self.waiting)[2]
                seq.status, seq.t_admit = SequenceStatus.RUNNING, 0.0
                self.running.append(seq)
            for seq in list(self.running):
                t = token(seq.params.seed, len(seq.response_ids))
                seq.response_ids.append(t)
                seq.logprobs.append(-t / 100)
                seq.policy_versions.append(self.version)
                if len(seq.response_ids) >= self.lengths[seq.params.seed % len(self.lengths)]:
                    seq.status, seq.finish_reason = SequenceStatus.FINISHED, "eos"
                    self.running.remove(seq)
                    del self.held[seq.seq_id]
                    finished.append(seq)
        waiting = [s.seq_id for *_, s in sorted(self.waiting)]
        return WorkerReport(self.worker, finished, [], waiting, len(self.running))

    def take_unstarted(self, seq_ids: list[str]) -> list[Request]:
        chosen = set(seq_ids)
        taken = [s for *_, s in sorted(self.waiting) if s.seq_id in chosen]
        self.waiting = [e for e in self.waiting if e[2].seq_id not in chosen]
        heapq.heapify(self.waiting)
        for seq in taken:
            del self.held[seq.seq_id]
        return [Request(s.prompt_ids, s.params, s.seq_id, meta=s.meta, response_ids=list(s.response_ids),
                        logprobs=list(s.logprobs), policy_versions=list(s.policy_versions))
                for s in taken]  # fmt: skip

    def abort_all(self) -> WorkerReport:
        waiting = [s.seq_id for *_, s in sorted(self.waiting)]
        held = self.running + [s for *_, s in self.waiting]
        for seq in held:
            seq.status, seq.finish_reason = SequenceStatus.ABORTED, "abort"
            del self.held[seq.seq_id]
        self.running, self.waiting = [], []
        return WorkerReport(self.worker, held, [], waiting, 0)


class FakePool:
    """The WorkerPool protocol over fake workers; reports come back in an order the test's generator picks
    (engines of different speeds), and worker `lose[0]` dies at its `lose[1]`-th slice."""

    def __init__(
        self, workers: int, capacity: int, lengths: list[int], rng: random.Random, lose=None
    ) -> None:
        self.size, self.capacity, self.drafts, self.trace = workers, capacity, False, Trace()
        self.policy_version, self.rng, self.lose = 0, rng, lose
        self.held: dict[str, int] = {}
        self.workers = [FakeWorker(w, capacity, lengths, self.held) for w in range(workers)]
        self.pending: list[int] = []
        self.slices = [0] * workers
        self.retired: set[int] = set()
        self.history: dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}

    def submit(self, worker: int, requests: list[Request]) -> None:
        assert worker not in self.retired
        self.workers[worker].submit(requests)

    def advance(self, worker: int, step: int) -> None:
        assert worker not in self.retired and worker not in self.pending
        self.pending.append(worker)

    def next_report(self) -> WorkerReport:
        w = self.pending.pop(self.rng.randrange(len(self.pending)))
        self.slices[w] += 1
        if self.lose is not None and (w, self.slices[w]) == tuple(self.lose):
            for seq_id in [k for k, v in self.held.items() if v == w]:
                del self.held[seq_id]  # its engine's state is gone with it
            self.workers[w] = FakeWorker(w, self.capacity, [1], self.held)
            return WorkerReport(w, [], [], [], 0, lost=True)
        return self.workers[w].advance(self.rng.randint(1, 4))

    def halt(self, workers: list[int]) -> list[WorkerReport]:
        reports = [self.next_report() for _ in range(len(self.pending))]
        return reports + [self.workers[w].abort_all() for w in workers if w not in self.retired]

    def retire(self, worker: int) -> None:
        self.retired.add(worker)

    def take_unstarted(self, worker: int, seq_ids: list[str]) -> list[Request]:
        assert worker not in self.retired
        return self.workers[worker].take_unstarted(seq_ids)

    def add_history(self, worker: int, responses: list[tuple[list[int], list[int]]]) -> None:
        self.history.setdefault(worker, []).extend((tuple(p), tuple(r)) for p, r in responses)

    def update_weights(self, state_dict, version=None) -> None:
        self.policy_version = self.policy_version + 1 if version is None else version
        for w in self.workers:
            w.version = self.policy_version


workloads = st.fixed_dictionaries(
    {
        "partial": st.booleans(),
        "workers": st.integers(2, 4),
        "capacity": st.integers(1, 4),
        "group_size": st.integers(1, 3),
        "update_batch": st.integers(1, 3),
        "oversubscription": st.sampled_from([1.0, 2.0, 3.0]),
        "lengths": st.lists(st.integers(1, 12), min_size=1, max_size=12),
        "dispatch": st.sampled_from(sorted(DISPATCH)),
        "migrate": st.booleans(),
        "seed": st.integers(0, 2**16),
        "lose": st.none() | st.tuples(st.integers(0, 1), st.integers(1, 3)),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads)
def test_a_step_trains_its_quota_of_complete_groups_each_sample_once(w):
    rng = random.Random(w["seed"])
    pool = FakePool(w["workers"], w["capacity"], w["lengths"], rng, w["lose"])
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=w["capacity"]), w["dispatch"], w["migrate"])  # type: ignore[arg-type]
    assert engine.config.max_num_seqs == w["workers"] * w["capacity"]  # oversubscription counts every slot
    ctx = RolloutContext(engine, CharTokenizer(), PromptStream(ArithTask(), 0), w["group_size"],  # type: ignore[arg-type]
                         w["update_batch"], SamplingParams(max_tokens=10_000), seed=0)  # fmt: skip
    cls = SortedPartialRollout if w["partial"] else SortedRollout
    strategy = cls(SortedOptions(oversubscription=w["oversubscription"], max_staleness=3))
    trained: list[str] = []
    for step in range(4):
        pool.trace.step, version = step, engine.policy_version
        groups = strategy.collect(ctx)
        assert not engine.has_unfinished() and not pool.held  # every engine is empty between steps
        assert len(groups) == w["update_batch"]  # the quota, global over the engines
        for g in groups:
            assert [s.meta["sample"] for s in g.samples] == list(range(w["group_size"]))
            for s in g.samples:
                seed, n = s.params.seed, len(s.response_ids)
                assert s.finish_reason == "eos" and n == w["lengths"][seed % len(w["lengths"])]
                # The same seeded tokens whichever engines ran (and resumed) it, nothing lost or doubled.
                assert s.response_ids == [token(seed, i) for i in range(n)]
                assert s.logprobs == [-t / 100 for t in s.response_ids]
                assert all(0 <= version - v <= (3 if w["partial"] else 0) for v in s.policy_versions)
                trained.append(s.seq_id)
        engine.update_weights({})
    assert len(trained) == len(set(trained))
    prompts = [t.split("/")[0] for t in trained]
    assert len(set(prompts)) * w["group_size"] == len(trained)  # no prompt trained twice
    lost = [e for e in pool.trace.events if e["kind"] == ENGINE_LOST]
    assert [e["worker"] for e in lost] == sorted(pool.retired)
    if lost:  # nothing goes to a lost engine after it is marked
        after = [
            e for e in pool.trace.events if e["kind"] == "dispatch" and e["t_start"] >= lost[0]["t_start"]
        ]
        assert all(lost[0]["worker"] not in e["engines"] for e in after)


def test_drafting_engines_get_every_other_engines_responses():
    """sorted+rhyme / sorted+suffix on W engines: each engine's drafter sees the step's finished responses
    of the other engines (its own it kept as it finished them)."""
    pool = FakePool(3, 2, [3, 5, 8, 2], random.Random(7))
    pool.drafts = True
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=2), "least-in-flight")  # type: ignore[arg-type]
    ctx = RolloutContext(engine, CharTokenizer(), PromptStream(ArithTask(), 0), 2, 3,  # type: ignore[arg-type]
                         SamplingParams(max_tokens=100), seed=0)  # fmt: skip
    groups = SortedRollout(SortedOptions(oversubscription=2.0)).collect(ctx)
    samples = [s for g in groups for s in g.samples]
    assert {s.meta["worker"] for s in samples} == {0, 1, 2}
    for w in range(3):
        got = set(pool.history[w])
        for s in samples:
            pair = (tuple(s.prompt_ids), tuple(s.response_ids))
            assert (pair in got) == (s.meta["worker"] != w)


@pytest.mark.parametrize("migrate", [False, True])
def test_an_engine_run_dry_takes_unstarted_requests_from_the_busiest(migrate):
    """Every request dispatched to engine 0: with migration, idle engine 1 takes requests that have not
    started (traced as `migrate` events), and each sample still comes out once with its seeded tokens."""
    pool = FakePool(2, 1, [6, 9, 4], random.Random(3))
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=1), "round-robin", migrate)  # type: ignore[arg-type]
    engine.policy = Fixed(0)
    ctx = RolloutContext(engine, CharTokenizer(), PromptStream(ArithTask(), 0), 2, 3,  # type: ignore[arg-type]
                         SamplingParams(max_tokens=100), seed=0)  # fmt: skip
    groups = SortedRollout(SortedOptions(oversubscription=2.0)).collect(ctx)
    samples = [s for g in groups for s in g.samples]
    assert len(samples) == 6 and len({s.seq_id for s in samples}) == 6
    assert all(
        s.response_ids == [token(s.params.seed, i) for i in range(len(s.response_ids))] for s in samples
    )
    moves = [e for e in pool.trace.events if e["kind"] == "migrate"]
    on_1 = [s for s in samples if s.meta["worker"] == 1]
    if not migrate:
        assert not moves and not on_1
        return
    assert moves and all((e["from"], e["to"]) == (0, 1) for e in moves)
    assert on_1 and len(on_1) <= sum(e["requests"] for e in moves)


def test_an_engine_found_dead_at_a_weight_update_is_lost_between_steps():
    """A Ray actor that died between steps shows at the weight update (the pool lists it in `dead`): the
    controller marks it lost and the next step runs on the others."""
    pool = FakePool(2, 2, [3, 6], random.Random(1))
    pool.dead = []
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=2), "round-robin")  # type: ignore[arg-type]
    ctx = RolloutContext(engine, CharTokenizer(), PromptStream(ArithTask(), 0), 2, 2,  # type: ignore[arg-type]
                         SamplingParams(max_tokens=100), seed=0)  # fmt: skip
    strategy = SortedPartialRollout(SortedOptions(oversubscription=2.0))
    assert {s.meta["worker"] for g in strategy.collect(ctx) for s in g.samples} == {0, 1}
    pool.dead.append(1)
    pool.retired.add(1)
    engine.update_weights({})
    assert [(e["worker"], e["requests"]) for e in pool.trace.events if e["kind"] == ENGINE_LOST] == [(1, 0)]
    pool.trace.step = 1
    groups = strategy.collect(ctx)
    assert len(groups) == 2
    later = [e for e in pool.trace.events if e["kind"] == "dispatch" and e["step"] == 1]
    assert later and all(set(e["engines"]) == {0} for e in later)


def test_a_report_from_an_engine_already_lost_is_dropped():
    """A slice in flight on an engine that is then lost (a submit to it failed) may still report: what it
    finished is not trained (its requests were dispatched again to the others) and its events are not kept."""
    pool = FakePool(2, 2, [4], random.Random(0))
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=2), "round-robin")  # type: ignore[arg-type]
    engine.policy = Fixed(1)
    seq = engine.add_request(Request([1, 2], SamplingParams(seed=5, max_tokens=100), seq_id="p/0"))
    engine._dispatch()
    report = pool.workers[1].advance(10)  # its slice ran the request to the end, then the actor died
    report.events.append({"kind": "decode", "t_start": 0.0, "t_end": 0.0, "worker": 1})
    assert [s.seq_id for s in report.finished] == ["p/0"]
    engine._lose(1, halting=False)  # as a submit to it that raised WorkerLost does
    engine._dispatch()  # its request goes to engine 0
    assert engine._absorb(report) == []
    assert seq.meta["worker"] == 0 and seq.status == SequenceStatus.WAITING and not seq.response_ids
    assert not [e for e in pool.trace.events if e["kind"] == "decode"]
    while engine.has_unfinished():  # engine 0 runs it: it finishes once, there
        engine.step()
    assert seq.status == SequenceStatus.FINISHED and seq.response_ids == [token(5, i) for i in range(4)]


def test_the_controller_learns_lengths_per_group_and_keeps_them_across_a_resume():
    """One history record per prompt per step (its samples' mean, as placed.py records a group), checkpointed
    with the strategy's state so a resumed controller predicts as the uninterrupted one; group-sticky's memory
    forgets the groups a step no longer holds."""
    pool = FakePool(2, 2, [3, 6, 9, 4], random.Random(5))
    engine = MultiEngine(pool, EngineConfig(max_num_seqs=2), "group-sticky")  # type: ignore[arg-type]
    ctx = RolloutContext(engine, CharTokenizer(), PromptStream(ArithTask(), 0), 3, 2,  # type: ignore[arg-type]
                         SamplingParams(max_tokens=100), seed=0)  # fmt: skip
    strategy = SortedRollout(SortedOptions(oversubscription=1.0))  # every admitted group is trained
    for step in range(3):
        pool.trace.step = step
        groups = strategy.collect(ctx)
        for g in groups:
            prompt_id = g.samples[0].meta["prompt_id"]
            assert engine.history.last[prompt_id] == sum(len(s.response_ids) for s in g.samples) / 3
        engine.update_weights({})
    ran = {
        (e["step"], e["prompt_id"])
        for e in pool.trace.events
        if e["kind"] == "sequence" and e["finish_reason"] == "eos"
    }
    eos = [e for e in pool.trace.events if e["kind"] == "sequence" and e["finish_reason"] == "eos"]
    assert engine.history._fit[0] == len(ran) < len(eos)  # one record per prompt per step, not per sample
    pool.trace.step = 3
    engine._dispatch()  # the next step's start: none of the trained groups is held any more
    assert engine.policy.engine_of == {}
    fresh = MultiEngine(FakePool(3, 2, [1], random.Random(0)), EngineConfig(max_num_seqs=2))  # type: ignore[arg-type]
    fresh.load_dispatch_state(json.loads(json.dumps(engine.dispatch_state())))  # as a checkpoint holds it
    assert fresh.history.state_dict() == engine.history.state_dict()


# ---- the tiny real model ----------------------------------------------------------------------------------
class Fixed:
    """A dispatch policy that sends everything to one engine (the test moves it)."""

    name = "fixed"

    def __init__(self, engine: int) -> None:
        self.engine = engine

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units, load):
        for u in units:
            load.add(self.engine, u.work)
        return [self.engine] * len(units)


def _pool(model_dir, workers: int, slice_steps: int = 3):
    from reference_trainer.model.loader import load_model
    from reference_trainer.model.tokenizer import load_tokenizer

    model, tokenizer = load_model(model_dir, device="cpu", dtype="float32"), load_tokenizer(model_dir)
    config = EngineConfig(max_num_seqs=2, max_model_len=256)
    spec = WorkerSpec(model.config, config, sorted(tokenizer.eos_token_ids), tokenizer)
    pool = LocalWorkerPool(spec, model.state_dict(), workers, Trace(), slice_steps=slice_steps)
    return pool, model, tokenizer, config


def test_a_kept_partial_resumed_on_another_engine_is_exact(tiny_model_dir, one_thread):
    pool, model, tokenizer, config = _pool(tiny_model_dir, 2)
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=1234, ignore_eos=True)
    request = Request(tokenizer.encode("12+34="), params, seq_id="p/0")
    alone = Engine(model, config, sorted(tokenizer.eos_token_ids), tokenizer)
    straight = alone.generate([request.prompt_ids], params)[0]

    multi = MultiEngine(pool, config)
    multi.policy = Fixed(0)
    seq = multi.add_request(request)
    multi.step()  # one slice of 3 engine steps on engine 0
    multi.halt()
    multi.abort(seq)
    assert 0 < len(seq.response_ids) < len(straight.response_ids) and seq.meta["worker"] == 0
    multi.update_weights(model.state_dict(), version=1)  # the next step's policy: its tokens say version 1
    multi.policy = Fixed(1)
    kept = Request(request.prompt_ids, params, seq_id="p/0", response_ids=seq.response_ids,
                   logprobs=seq.logprobs, policy_versions=seq.policy_versions)  # fmt: skip
    resumed = multi.add_request(kept)
    while multi.has_unfinished():
        multi.step()
    assert resumed.meta["worker"] == 1 and resumed.status == SequenceStatus.FINISHED
    n = len(seq.response_ids)
    assert resumed.response_ids == straight.response_ids
    # The new tokens' log-probs come from a prefill over the kept ones instead of a decode step: equal up to
    # float rounding (as a resume on the same engine), the tokens drawn from them exactly equal.
    torch.testing.assert_close(
        torch.tensor(resumed.logprobs), torch.tensor(straight.logprobs), rtol=0, atol=1e-5
    )
    assert resumed.logprobs[:n] == seq.logprobs  # the kept tokens' log-probs travel as they are
    assert resumed.policy_versions == [0] * n + [1] * (len(straight.response_ids) - n)


SORTED_OPTIONS = {"oversubscription": 2.0, "max_staleness": 2}


def _config(
    model_dir, task, mode: str, steps: int, backend: str = "local", options=None, **kw
) -> TrainConfig:
    config = TrainConfig(eval_every=0, steps=steps, model=str(model_dir), task=task, mode=mode,
                         prompts_per_step=2, group_size=3, max_tokens=16, max_num_seqs=3, max_model_len=256,
                         checkpoint_every=1, mode_options=SORTED_OPTIONS if options is None else options,
                         worker_backend=backend, **kw)  # fmt: skip
    config.grpo.lr = 1e-2
    config.grpo.micro_batch_size = 4
    return config


def _trained(trainer: Trainer) -> list[tuple[str, int, str]]:
    events = trainer.trace.events
    return [(e["id"], e["response_tokens"], e["status"]) for e in events if e["kind"] == "sequence"]


def test_one_worker_is_todays_engine(tiny_model_dir, toy_task, tmp_path, one_thread):
    flag = Trainer(_config(tiny_model_dir, toy_task, "sorted-partial", 2, workers=1), tmp_path / "flag")
    plain = Trainer(_config(tiny_model_dir, toy_task, "sorted-partial", 2), tmp_path / "plain")
    assert type(flag.engine) is Engine and type(plain.engine) is Engine
    flag.run()
    plain.run()
    assert _trained(flag) == _trained(plain) and _trained(flag)


@pytest.mark.parametrize("mode", ["sorted", "sorted-partial"])
def test_a_run_on_two_engines_resumes_on_three(tiny_model_dir, toy_task, tmp_path, mode, one_thread):
    first = Trainer(_config(tiny_model_dir, toy_task, mode, 2, workers=2), tmp_path / "run")
    assert isinstance(first.engine, MultiEngine)
    first.run()
    workers = {e["worker"] for e in first.trace.events if e["kind"] == "decode"}
    assert workers == {0, 1}
    resumed = Trainer(_config(tiny_model_dir, toy_task, mode, 4, workers=3), tmp_path / "run", resume=True)
    assert resumed.step == 2 and resumed.engine.pool.size == 3
    assert resumed.engine.history.state_dict() == first.engine.history.state_dict()  # what it dispatches by
    resumed.run()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert resumed.step == 4 and [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["samples"] == 6 for r in rows)  # two complete groups of three each step


def test_train_resume_takes_another_worker_count(tiny_model_dir, tmp_path, one_thread):
    """`rlbench train --resume RUN --workers W'` resumes a run made on W engines on W' (the saved count
    without the flag)."""
    import json

    from conftest import cli

    # on-policy sorted: every step generates (sorted-partial may train groups finished in an earlier step)
    small = ("--model", str(tiny_model_dir), "--mode", "sorted", "--prompts-per-step", "2",
             "--group-size", "2", "--max-tokens", "8", "--eval-every", "0")  # fmt: skip
    small += ("--checkpoint-every", "1")
    assert cli("train", *small, "--steps", "1", "--out", "run", tmp=tmp_path).returncode == 0
    saved = tmp_path / "run" / "train_config.json"
    config = json.loads(saved.read_text())
    saved.write_text(json.dumps({**config, "workers": 2, "worker_backend": "local"}))  # as if made on two
    res = cli("train", "--resume", "run", "--steps", "2", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    res = cli("train", "--resume", "run", "--steps", "3", "--workers", "1", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    events = read_jsonl(tmp_path / "run" / "trace.jsonl")
    engines = {
        s: {e.get("worker", 0) for e in events if e["kind"] == "decode" and e["step"] == s} for s in (1, 2)
    }
    assert engines == {1: {0, 1}, 2: {0}}
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]


def test_an_engine_lost_mid_step_finishes_on_the_others(tiny_model_dir, toy_task, tmp_path, one_thread):
    trainer = Trainer(_config(tiny_model_dir, toy_task, "sorted-partial", 2, workers=2), tmp_path / "run")
    worker = trainer.engine.pool.workers[1]
    calls = itertools.count(1)
    real = worker.advance

    def dies_on_its_second_slice(*args, **kw):
        if next(calls) == 2:
            raise WorkerLost(1, "injected")
        return real(*args, **kw)

    worker.advance = dies_on_its_second_slice
    trainer.run()
    lost = [e for e in trainer.trace.events if e["kind"] == ENGINE_LOST]
    assert [(e["worker"], e["step"]) for e in lost] == [(1, 0)] and lost[0]["requests"] > 0
    trained = [e for e in trainer.trace.events if e["kind"] == "sequence" and e["status"] == "finished"]
    ids = [e["id"] for e in trained]
    assert len(ids) == len(set(ids)) == 2 * 2 * 3  # two steps of two groups of three, each sample once
    after = [e for e in trainer.trace.events if e["kind"] == "decode" and e["t_start"] > lost[0]["t_start"]]
    assert after and {e["worker"] for e in after} == {0}


@pytest.mark.parametrize("migrate", [False, True])
def test_the_baseline_on_two_workers_finishes_a_step_when_one_is_lost(
    tiny_model_dir, toy_task, tmp_path, one_thread, migrate
):
    """The synchronous baseline (placed.py) on two in-process workers, worker 1 lost at its second slice:
    the step finishes on worker 0 with the lost worker's unfinished requests dispatched again, the trace
    marks the loss, and every sample trains once; the next step runs on worker 0 alone."""
    options = {"dispatch": "round-robin", "migrate": migrate}
    trainer = Trainer(_config(tiny_model_dir, toy_task, "baseline", 2, options=options, workers=2),
                      tmp_path / "run")  # fmt: skip
    worker = trainer.engine.workers[1]
    calls, real = itertools.count(1), worker.advance

    def dies_on_its_second_slice(*args, **kw):
        if next(calls) == 2:
            raise WorkerLost(1, "injected")
        return real(*args, **kw)

    worker.advance = dies_on_its_second_slice
    rows = trainer.run()
    lost = [e for e in trainer.trace.events if e["kind"] == ENGINE_LOST]
    assert [(e["worker"], e["step"]) for e in lost] == [(1, 0)] and lost[0]["requests"] > 0
    assert [r["samples"] for r in rows] == [6, 6]
    ids = [e["id"] for e in trainer.trace.events if e["kind"] == "sequence" and e["status"] == "finished"]
    assert len(ids) == len(set(ids)) == 2 * 2 * 3  # two steps of two groups of three, each sample once
    after = [e for e in trainer.trace.events if e["kind"] == "decode" and e["t_start"] > lost[0]["t_start"]]
    assert after and {e["worker"] for e in after} == {0}
    later = [e for e in trainer.trace.events if e["kind"] == "dispatch" and e["t_start"] > lost[0]["t_start"]]
    assert later and all(set(e["engines"]) == {0} for e in later)


def test_sorted_on_real_engines_migrates_to_an_idle_one(tiny_model_dir, toy_task, tmp_path, one_thread):
    """`sorted` on two in-process engines with migrate=true, every request dispatched to engine 0: engine 1
    takes not-yet-started requests (migrate events), decodes them, and each sample trains once."""
    options = {**SORTED_OPTIONS, "migrate": True}
    trainer = Trainer(_config(tiny_model_dir, toy_task, "sorted", 1, options=options, workers=2),
                      tmp_path / "run")  # fmt: skip
    assert trainer.engine.migrate
    trainer.engine.policy = Fixed(0)
    rows = trainer.run()
    events = trainer.trace.events
    moves = [e for e in events if e["kind"] == "migrate"]
    assert moves and all((e["from"], e["to"]) == (0, 1) for e in moves)
    assert {e["worker"] for e in events if e["kind"] == "decode"} == {0, 1}
    ids = [e["id"] for e in events if e["kind"] == "sequence" and e["status"] == "finished"]
    assert len(ids) == len(set(ids)) == rows[0]["samples"] == 6


def _samples(trainer: Trainer) -> list[tuple]:
    keys = ("step", "id", "status", "response_tokens", "finish_reason", "policy_versions")
    return [tuple(e[k] for k in keys) for e in trainer.trace.events if e["kind"] == "sequence"]


def test_async_on_two_engines_gives_the_samples_of_one(tiny_model_dir, toy_task, tmp_path, one_thread):
    """The rollout run ahead drives two engines: every engine gets each step's stamped weights, so step t's
    samples are those of one engine on version t - k (seeded draws), whichever engine ran them."""
    options = {"max_staleness": 1, "backend": "thread"}
    runs = []
    for workers in (1, 2):
        trainer = Trainer(_config(tiny_model_dir, toy_task, "async", 3, options=options, workers=workers),
                          tmp_path / f"w{workers}")  # fmt: skip
        try:
            trainer.run()
        finally:
            trainer.close()
        runs.append(trainer)
    one, two = runs
    assert _samples(two) == _samples(one) and _samples(one)
    assert {e["worker"] for e in two.trace.events if e["kind"] == "decode"} == {0, 1}
    updates = {e["step"]: e["policy_version"] for e in two.trace.events if e["kind"] == "update"}
    for step, _, _, _, _, versions in _samples(two):  # k = 1: step t on version t - 1 (step 0 on 0)
        assert set(versions) == {max(0, updates[step] - 1)}


@pytest.mark.e2e
def test_two_ray_engines_finish_a_step_when_one_actor_is_killed(
    tiny_model_dir, toy_task, tmp_path, monkeypatch
):
    """sorted-partial on two Ray actors; actor 1 is killed (ray.kill) in the middle of the first step's
    rollout: the step finishes on actor 0, the trace names the lost engine, every sample trains once."""
    ray = pytest.importorskip("ray")
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLBENCH_RAY_TMPDIR", tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    trainer = Trainer(
        _config(tiny_model_dir, toy_task, "sorted-partial", 2, "ray", workers=2), tmp_path / "ray"
    )
    pool, reports = trainer.engine.pool, itertools.count(1)
    real = pool.next_report

    def kill_actor_1_at_the_third_report():
        if next(reports) == 3:
            ray.kill(pool.actors[1])
        return real()

    pool.next_report = kill_actor_1_at_the_third_report
    try:
        rows = trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
    lost = [e for e in trainer.trace.events if e["kind"] == ENGINE_LOST]
    assert [(e["worker"], e["step"]) for e in lost] == [(1, 0)]
    assert [r["samples"] for r in rows] == [6, 6]
    ids = [e["id"] for e in trainer.trace.events if e["kind"] == "sequence" and e["status"] == "finished"]
    assert len(ids) == len(set(ids)) == 12
    later = [e for e in trainer.trace.events if e["kind"] == "decode" and e["t_start"] > lost[0]["t_start"]]
    assert later and {e["worker"] for e in later} == {0}


def test_a_run_made_on_two_engines_with_a_dispatch_policy_resumes_on_one(
    tiny_model_dir, tmp_path, one_thread
):
    """The options only W engines take (dispatch, migrate) cannot be left out on a resume (its options are
    the saved ones), and mean nothing on one engine: `--workers 1` resumes such a run without them."""
    import json

    from conftest import cli

    small = f"--model {tiny_model_dir} --mode sorted --prompts-per-step 2 --group-size 2 --max-tokens 8"
    small += " --eval-every 0 --checkpoint-every 1 --steps 1 --out run"
    assert cli("train", *small.split(), tmp=tmp_path).returncode == 0
    saved = tmp_path / "run" / "train_config.json"
    config = json.loads(saved.read_text())
    options = {**config["mode_options"], "dispatch": "least-tokens", "migrate": True}
    saved.write_text(json.dumps({**config, "workers": 2, "worker_backend": "local", "mode_options": options}))
    res = cli("train", "--resume", "run", "--steps", "2", "--workers", "1", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1]


class _Stopped(Exception):
    pass


def _histopipe_ahead(model_dir, task, out, steps: int, resume: bool = False, stop_after: int | None = None):
    """An async run (k = 1) on two local engines with history-based dispatch over two prompts (each step
    the same groups, so what the controller learnt decides where they go): (its trace's dispatch decisions
    by step, the token ids it trained by step), stopped after step `stop_after` as a kill would."""
    options = {"max_staleness": 1, "backend": "thread", "dispatch": "histopipe"}
    config = _config(model_dir, task, "async", steps, options=options, workers=2, prompt_pool=2)
    trainer = Trainer(config, out, resume=resume)
    trained: dict[int, list] = {}
    collect = trainer.rollout.collect

    def recording():
        groups = collect()
        trained[trainer.step] = [(s.seq_id, tuple(s.response_ids)) for g in groups for s in g.samples]
        return groups

    def stop(row):
        if row["step"] == stop_after:
            raise _Stopped

    trainer.rollout.collect = recording
    try:
        trainer.run(stop)
    except _Stopped:
        pass
    finally:
        trainer.close()
    decisions = [
        (e["step"], e["engines"], e["tokens_outstanding"])
        for e in trainer.trace.events
        if e["kind"] == "dispatch"
    ]
    return decisions, trained


def test_async_on_two_engines_resumes_dispatching_as_the_uninterrupted_run(
    tiny_model_dir, toy_task, tmp_path, one_thread
):
    """The controller lives on the rollout side: its learnt lengths come back with each step and the
    trainer's checkpoint holds them, so a resumed run dispatches, and trains, as the uninterrupted one."""
    straight, straight_trained = _histopipe_ahead(tiny_model_dir, toy_task, tmp_path / "a", 4)
    first, first_trained = _histopipe_ahead(tiny_model_dir, toy_task, tmp_path / "b", 4, stop_after=1)
    resumed, resumed_trained = _histopipe_ahead(tiny_model_dir, toy_task, tmp_path / "b", 4, resume=True)
    assert {s for s, _, _ in straight} == {0, 1, 2, 3} and len({tuple(t) for _, _, t in straight}) > 1
    assert [d for d in first if d[0] <= 1] + [d for d in resumed if d[0] >= 2] == straight
    assert {**{s: t for s, t in first_trained.items() if s <= 1}, **resumed_trained} == straight_trained
    from reference_trainer.train.rows import TIMING_FIELDS

    logged = {r: read_jsonl(tmp_path / r / "metrics.jsonl") for r in "ab"}
    rows = {r: [{k: v for k, v in x.items() if k not in TIMING_FIELDS} for x in logged[r]] for r in "ab"}
    assert rows["b"] == rows["a"] and len(rows["a"]) == 4
