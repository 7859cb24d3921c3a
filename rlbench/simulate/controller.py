"""A SortedRL run on W engines replayed under the trainer's own controller: the mode's strategy
(rollout/sorted.py) drives `MultiEngine` (rollout/multi.py), which dispatches each admission through the
run's dispatch policy object with the load outstanding at that moment, over simulated engines.

Nothing of the strategy, the controller or the engine's scheduler is copied: the engines here are the
reference engine's `Scheduler` (admission order, priorities, the prefill limit) over plain slots, with a
forward's time from the run's fitted cost model and each request's length from the run's trace (`recorded`,
`_Run.target`). The pool mirrors the run's: `ray` engines run concurrently, a slice being forwards until
0.05 s of simulated time has passed (the Ray pool's budget) and reports reaching the controller in the order
the slices end; `local` engines run 4-forward slices one after another, as LocalWorkerPool does. Where the
run's schedule has no clock in it (the in-process pool) the replay is exact; on Ray its clock is the cost
model's, not the run's (docs/simulate.md says what that leaves).
"""

from __future__ import annotations

import heapq
import inspect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.scheduler import Scheduler
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus
from reference_trainer.modes import get_mode, make_mode_strategy
from reference_trainer.rollout.base import PromptStream, RolloutContext
from reference_trainer.rollout.multi import MultiEngine
from reference_trainer.rollout.workers import LocalWorkerPool, RayWorkerPool, WorkerReport
from reference_trainer.tasks.base import Problem
from reference_trainer.trace.schema import DISPATCH, FORWARD_KINDS, PREFILL, SEQUENCE, forward_event
from reference_trainer.trace.writer import Trace
from rlbench.simulate.cost import CostModel

# keys of `recorded`'s lengths: (index, id + CUT) what the run saw of a request it cut, (-1 - step, MEAN) the
# step's mean finished length
CUT, MEAN = "#cut", "#mean"
# The pools' slices, as they define them: Ray's a wall-clock budget, the in-process pool's a step count.
RAY_BUDGET_S = inspect.signature(RayWorkerPool).parameters["budget_s"].default
LOCAL_SLICE = inspect.signature(LocalWorkerPool).parameters["slice_steps"].default


def drives(mode: str, options: Mapping[str, Any], workers: int) -> bool:
    """Whether the trainer runs `mode` on `workers` engines under the controller (a SortedRL mode inline,
    with no speculation or lookahead, whose strategy this replay can drive)."""
    spec = get_mode(mode)
    if workers <= 1 or spec.speculative or spec.lookahead:  # drafting engines are not simulated here
        return False
    resolved = spec.resolve(options, workers)
    return resolved.dispatch is not None and resolved.ahead is None


class _Slots:
    """The scheduler's view of an engine's slots (no KV cache behind them)."""

    def __init__(self, capacity: int) -> None:
        self.free = list(range(capacity - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)


@dataclass
class _Run:
    """What every simulated engine shares: the cost model, the lengths, the limits, the clock."""

    cost: CostModel
    lengths: dict[tuple[int, str], int]  # (prompt index, request id) -> its response length (`recorded`)
    capacity: int
    max_prefill_tokens: int
    max_model_len: int
    now: float = 0.0
    version: int = 0
    step: int = 0

    def target(self, seq: Sequence) -> int:
        """Its length where the run saw it end; else (cut at the quota, or never run) the mean length of the
        step's finished requests (the policy's lengths move from step to step), or the step before's, and
        more than the run saw of it: a replay that keeps to the run's schedule cuts it where the run did, so
        only one that has left it reaches this length."""
        cut = min(seq.params.max_tokens, self.max_model_len - len(seq.prompt_ids))
        index = int(seq.meta.get("index", -1))
        known = self.lengths.get((index, seq.seq_id))
        if known is None:
            seen = self.lengths.get((index, seq.seq_id + CUT), -1) + 1
            mean = self.lengths.get((-1 - self.step, MEAN), self.lengths.get((-self.step, MEAN), 1))
            known = max(seen, seq.resumed_tokens + 1, mean)
        return min(known, cut)


class SimEngine:
    """One engine: the reference scheduler's admissions, one token per running sequence per forward."""

    def __init__(self, worker: int, run: _Run) -> None:
        self.worker, self.run, self.t = worker, run, 0.0
        self.scheduler = Scheduler(_Slots(run.capacity), run.max_prefill_tokens)  # type: ignore[arg-type]
        self.queued: dict[str, Sequence] = {}
        self.events: list[dict[str, Any]] = []

    def submit(self, requests: list[Request]) -> None:
        for r in requests:
            seq = Sequence.for_request(
                r, str(r.seq_id), max_model_len=self.run.max_model_len, policy_version=self.run.version
            )
            self.scheduler.add(seq)
            self.queued[seq.seq_id] = seq

    def forward(self, step: int) -> list[Sequence]:
        kind, running, admitted = self.scheduler.schedule()
        if not running and not admitted:
            return []
        cost, one = self.run.cost, np.ones(1)
        tok = np.array([float(s.length) for s in admitted])
        n, sq = one * len(admitted), one * float((tok * tok).sum())
        if kind == PREFILL:
            busy = cost.prefill(n, one * tok.sum(), sq)[0]
        else:
            ctx = one * float(sum(s.length for s in running))
            busy = cost.decode(one * (len(running) + len(admitted)), ctx)[0]
            busy += cost.riding(n, one * tok.sum(), sq)[0] if admitted else 0.0
        t0, seqs = self.t, [*running, *admitted]
        for s in admitted:
            s.t_admit = t0
        self.t = t0 + float(busy) + cost.gap
        n_seqs = len(seqs)
        event = forward_event(kind, t0, t0 + float(busy), n_seqs, self.run.capacity, n_seqs, step=step)
        self.events.append({**event, "worker": self.worker})
        finished = []
        for s in seqs:
            s.response_ids.append(0)
            s.logprobs.append(0.0)
            s.policy_versions.append(self.run.version)
            if len(s.response_ids) >= self.run.target(s):
                self._end(s, SequenceStatus.FINISHED, "eos", t0 + float(busy))
                finished.append(s)
        return finished

    def _end(self, seq: Sequence, status: SequenceStatus, reason: str, t: float) -> None:
        seq.status, seq.finish_reason, seq.t_finish = status, reason, t
        self.scheduler.release(seq)
        self.queued.pop(seq.seq_id, None)

    def slice(self, step: int, budget_s: float, max_steps: int | None) -> WorkerReport:
        """Forwards until `budget_s` of its time has passed, `max_steps` were taken, or nothing is left
        (RolloutWorker.advance)."""
        self.t = max(self.t, self.run.now)
        start, finished, taken = self.t, [], 0
        while self.scheduler.has_work() and self.t - start < budget_s:
            if max_steps is not None and taken >= max_steps:
                break
            finished.extend(self.forward(step))
            taken += 1
        return self._report(finished, len(self.scheduler.running))

    def abort_all(self) -> WorkerReport:
        waiting = [s.seq_id for s in self.scheduler.waiting]
        held = list(self.queued.values())
        for seq in held:
            if not seq.is_finished:
                self._end(seq, SequenceStatus.ABORTED, "abort", self.run.now)
        self.queued = {}
        return WorkerReport(self.worker, held, self._take_events(), waiting, 0)

    def _report(self, finished: list[Sequence], running: int) -> WorkerReport:
        waiting = [s.seq_id for s in self.scheduler.waiting]
        return WorkerReport(self.worker, finished, self._take_events(), waiting, running)

    def _take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def take_unstarted(self, seq_ids: list[str]) -> list[Request]:
        waiting = {s.seq_id for s in self.scheduler.waiting}
        taken = []
        for seq_id in seq_ids:
            seq = self.queued.get(seq_id)
            if seq is not None and seq_id in waiting:
                self._end(seq, SequenceStatus.ABORTED, "abort", self.run.now)
                taken.append(seq.request())
        return taken


class SimClock(Trace):
    """The controller's trace, on the simulated clock."""

    def __init__(self, run: _Run) -> None:
        super().__init__(t0=0.0)
        self.run = run

    def now(self) -> float:
        return self.run.now


@dataclass
class SimPool:
    """The WorkerPool surface the controller drives (workers.py), over simulated engines."""

    run: _Run
    size: int
    backend: str
    trace: SimClock = field(init=False)
    drafts: bool = False
    dead: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.trace, self.capacity = SimClock(self.run), self.run.capacity
        self.engines = [SimEngine(w, self.run) for w in range(self.size)]
        self._flight: list[tuple[float, int, int, WorkerReport | int]] = []  # (end, order, worker, report)
        self._order = 0

    @property
    def policy_version(self) -> int:
        return self.run.version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.run.version = version

    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        self.run.version = self.run.version + 1 if version is None else version

    def submit(self, worker: int, requests: list[Request]) -> None:
        self.engines[worker].submit(requests)

    def advance(self, worker: int, step: int) -> None:
        """A Ray slice runs now, concurrently with the others (what is submitted to it later waits for
        its end); a local one runs when the controller asks for its report, seeing what came before."""
        self._order += 1
        if self.backend == "local":
            self._flight.append((float(self._order), self._order, worker, step))
            return
        report = self.engines[worker].slice(step, RAY_BUDGET_S, None)
        heapq.heappush(self._flight, (self.engines[worker].t, self._order, worker, report))

    def next_report(self) -> WorkerReport:
        _, _, worker, report = heapq.heappop(self._flight)
        if isinstance(report, int):  # a local slice: run it now
            report = self.engines[worker].slice(report, float("inf"), LOCAL_SLICE)
        self.run.now = max(self.run.now, self.engines[worker].t)
        return report

    def halt(self, workers: list[int]) -> list[WorkerReport]:
        reports = [self.next_report() for _ in range(len(self._flight))]
        return reports + [self.engines[w].abort_all() for w in workers]

    def take_unstarted(self, worker: int, seq_ids: list[str]) -> list[Request]:
        return self.engines[worker].take_unstarted(seq_ids)

    def prepare(self, params: SamplingParams) -> None:
        pass

    def add_history(self, worker: int, responses: list[tuple[list[int], list[int]]]) -> None:
        pass

    def retire(self, worker: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _Prompts:
    """The run's prompts as a task: each recorded prompt index's id (the rest are named by their index;
    a prompt the run never recorded never ran, if the replay holds)."""

    ids: dict[int, str]
    name: str = "recorded"
    max_response_tokens: int = 0

    def problems(self, n: int, seed: int, start: int = 0) -> list[Problem]:
        return [Problem(self.ids.get(i, f"unrecorded-{i}"), "", "") for i in range(start, start + n)]


def recorded(events: list[dict[str, Any]]) -> tuple[dict[tuple[int, str], int], dict[int, tuple[str, int]]]:
    """From the run's trace: each request's response length, by (prompt index, request id), where the run
    saw it end; and each prompt index's id and prompt tokens. A sequence event gives the length of a request
    that finished (or finished and was then dropped with its group). A kept partial that finished in the
    run's last step waits for its group with no event of its own: its forwards (each names the requests in
    its slots, and gives each one token) that come after its last event count its length (those of its own
    epoch: a request that ended leaves the count, as a prompt seen again reuses its requests' ids)."""
    lengths, prompts, last, by_step = {}, {}, {}, {}
    tokens: Counter[str] = Counter()
    for i, e in enumerate(events):
        if e.get("kind") in FORWARD_KINDS:
            for seq_id in (e.get("slots") or {}).values():
                tokens[seq_id] += 1
                last.setdefault(seq_id, [None, None])[1] = i
        if e.get("kind") != SEQUENCE or "prompt_index" not in e:
            continue
        index = int(e["prompt_index"])
        prompts[index] = (str(e["prompt_id"]), int(e["prompt_tokens"]))
        last.setdefault(str(e["id"]), [None, None])[0] = i
        done = e.get("finish_reason") not in (None, "abort")
        lengths[index, str(e["id"]) + ("" if done else CUT)] = int(e["response_tokens"])
        if done:
            by_step.setdefault(int(e.get("step", 0)), []).append(int(e["response_tokens"]))
            # its end: the prompt's next epoch (the stream cycles its pool) gives its requests the same ids
            del last[str(e["id"])], tokens[str(e["id"])]
    index_of = {prompt_id: i for i, (prompt_id, _) in prompts.items()}
    for seq_id, (event, forward) in last.items():
        index = index_of.get(seq_id.rsplit("/", 1)[0])
        if index is not None and forward is not None and (event is None or forward > event):
            lengths.setdefault((index, seq_id), tokens[seq_id])
    for step, ns in by_step.items():
        lengths[-1 - step, MEAN] = round(sum(ns) / len(ns))
    return lengths, prompts


@dataclass(frozen=True)
class Shape:
    """What the validation read of the run: its mode options, engines, slots per engine, fitted cost model
    and step count."""

    options: Mapping[str, Any]
    workers: int
    capacity: int
    cost: CostModel
    steps: int


@dataclass
class _Replay:
    """A run's controller over simulated engines: the strategy, the controller, the context it runs in."""

    run: _Run
    pool: SimPool
    multi: MultiEngine
    ctx: RolloutContext
    strategy: Any

    @classmethod
    def build(cls, events: list[dict[str, Any]], config: Mapping[str, Any], shape: Shape) -> _Replay:
        lengths, prompts = recorded(events)
        mode = get_mode(str(config.get("mode", "baseline")))
        workers, capacity = shape.workers, shape.capacity
        resolved = mode.resolve(dict(shape.options), workers)
        default = EngineConfig()  # a run's config names both; the engine's defaults otherwise
        prefill = int(config.get("max_prefill_tokens") or default.max_prefill_tokens)
        model_len = int(config.get("max_model_len") or default.max_model_len)
        run = _Run(shape.cost, lengths, capacity, prefill, model_len)
        pool = SimPool(run, workers, str(config.get("worker_backend", "ray")))
        d = resolved.dispatch
        assert d is not None  # drives() said so
        engine_config = EngineConfig(
            max_num_seqs=capacity, max_model_len=model_len, max_prefill_tokens=prefill
        )
        multi = MultiEngine(pool, engine_config, d.dispatch, d.migrates)  # type: ignore[arg-type]
        pool_size = config.get("prompt_pool")
        stream = PromptStream(_Prompts({i: p for i, (p, _) in prompts.items()}), 0, pool_size)
        params = SamplingParams(
            temperature=float(config.get("temperature", 1.0)), max_tokens=int(config.get("max_tokens") or 256)
        )
        ctx = RolloutContext(
            engine=multi,  # type: ignore[arg-type]
            tokenizer=None,
            stream=stream,
            group_size=int(config["group_size"]),
            update_batch=int(config["prompts_per_step"]),
            params=params,
            seed=int(config.get("seed", 0)),
        )
        # the prompts' tokens by index (the stream's pool cycles them), for every index the replay may admit
        mean = round(float(np.mean([n for _, n in prompts.values()]))) if prompts else 1
        for i in range(max(prompts, default=0) + 1 + 4 * ctx.update_batch * (shape.steps + 1)):
            known = prompts.get(i % pool_size if pool_size else i) or prompts.get(i)
            ctx._prompt_ids[i] = [1] * (known[1] if known else mean)
        return cls(run, pool, multi, ctx, make_mode_strategy(mode, workers, resolved))

    def step(self, step: int) -> dict[str, Any]:
        """One RL step: the update's weights (version `step`), then the strategy's collect."""
        self.pool.trace.step = self.run.step = step
        if step:
            self.multi.update_weights({}, step)
        start = self.run.now
        self.strategy.collect(self.ctx)
        taken, self.pool.trace.events = self.pool.trace.events, []
        return {
            "step": step,
            "t_start": start,
            "t_end": self.run.now,
            "forwards": [e for e in taken if e.get("kind") in FORWARD_KINDS],
            "dispatch": [e["engines"] for e in taken if e.get("kind") == DISPATCH],
        }


def replay(events: list[dict[str, Any]], config: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
    """Each step of the run replayed under the controller, as the rows and totals the validation reads of
    `simulate_mode`'s (the bubble as scheduler._account defines it), with each step's dispatch decisions."""
    rows, sim = [], _Replay.build(events, config, shape)
    cost, workers, capacity = shape.cost, shape.workers, shape.capacity
    for s in (sim.step(step) for step in range(shape.steps)):
        fw = s["forwards"]
        wall = s["t_end"] - s["t_start"] + cost.rollout_fixed
        slot_time = sum((e["t_end"] - e["t_start"]) * e["active_slots"] for e in fw)
        cap = float(capacity * workers * wall)
        rows.append(
            {
                "rollout_s": wall,
                "slot_time": slot_time,
                "slot_capacity": cap,
                "bubble_ratio": 1.0 - slot_time / cap if cap > 0 else None,
                "forwards": len(fw),
                "worker_forwards": [sum(e["worker"] == w for e in fw) for w in range(workers)],
                "slot_steps": sum(e["active_slots"] for e in fw),
                "forward_events": [{k: e[k] for k in ("worker", "t_start", "t_end")} for e in fw],
                "dispatch": s["dispatch"],
            }
        )
    capacity_sum = sum(r["slot_capacity"] for r in rows)
    return {
        "steps": rows,
        "bubble_ratio": 1.0 - sum(r["slot_time"] for r in rows) / capacity_sum if capacity_sum else None,
        "rollout_s": sum(r["rollout_s"] for r in rows) / len(rows) if rows else 0.0,
    }
