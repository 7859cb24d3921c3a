"""One controller over W rollout engines: the request-engine surface SortedRL's strategies drive (sorted.py:
`add_request`, `step`, `abort`, `running`, `waiting`, `has_unfinished`, `config.max_num_seqs`,
`policy_version`), presented over a `WorkerPool` (workers.py), so the strategy's own code runs unchanged on
W engines and stays the one SortedRL there is.

- `add_request` returns a local proxy `Sequence` and buffers the request; the next `step` dispatches the
  buffer through the dispatch policy (dispatch.py: `make_policy`, `EngineLoad`, a `Unit` per request with
  its predicted tokens left, from `placement.LengthHistory`), submits it per engine, starts a slice on every
  engine with work and none in flight, and returns the sequences finished in the next report (any engine).
  A proxy's status and tokens follow the reports of its engine.
- `config.max_num_seqs` is W x slots: SortedRL's oversubscription and refill count every engine's slots; its
  early-termination quota stays the strategy's, so it is global.
- `halt` (the strategy calls it when its quota is reached) gathers every slice in flight and aborts every
  request on every engine in ONE round trip (`WorkerPool.halt`); the aborted proxies carry their tokens,
  log-probs and policy versions, and sequences that finished in that last gather come back finished.
  A kept partial goes back through `add_request` and resumes on whatever engine the policy picks: the
  sampler's draws are keyed by (request seed, token position) (engine/sampler.py), so it draws the same
  tokens on any engine.
- an engine lost mid-step (a dead Ray actor: a `lost` report) is retired, a trace event names it, and its
  requests are dispatched again to the others from what the controller holds: the request as submitted
  (with a kept partial's earlier tokens), so only the tokens that engine generated this step are lost, and
  the same seeds redraw them. Nothing is trained twice: a request is finished once, by one engine.
- the predicted lengths the dispatch works from (`placement.LengthHistory`) are recorded per group, as
  placed.py does: once per prompt per step, the mean of its samples that finished in the step (a group cut
  short by early termination records the samples it finished). They are the controller's one state that
  outlives a step: the trainer checkpoints them beside the strategy's state (`dispatch_state`; a run ahead's
  side sends them), so a resumed run dispatches as the uninterrupted one. A policy's memory of groups
  (group-sticky) forgets a group at the first dispatch of a step that no longer holds it (trained or dropped).
- lookahead (the strategy's base.BubbleFill): each engine fills its own idle slots between its own steps
  (base.EngineFill, in its worker) from its share of the next prompts' requests (`look_ahead`); the runs'
  tokens come back with the reports and go, as drafts, to the engine each request is dispatched to.

Nothing here is per-engine state that outlives a step (the engines are empty between steps, and the lengths
are per prompt), so a run made with W engines resumes with any W'. The lookahead drafts held between steps
are not checkpointed: a resumed run loses one step's drafts, never a sample, as on one engine.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus
from reference_trainer.rollout.base import Lookahead
from reference_trainer.rollout.dispatch import DEFAULT_DISPATCH, EngineLoad, Unit, make_policy
from reference_trainer.rollout.placement import LengthHistory
from reference_trainer.rollout.rebalance import retire_engine, steal_plan
from reference_trainer.rollout.workers import (
    RolloutWorker,
    WorkerLost,
    WorkerPool,
    WorkerReport,
    WorkerSpec,
    make_worker_pool,
)
from reference_trainer.speculation.lookahead import DraftKey, draft_key
from reference_trainer.trace.schema import dispatch_event, migrate_event
from reference_trainer.trace.writer import Trace

__all__ = ["Engines", "MultiEngine", "build_side"]

KEPT_DRAFTS = 4096  # lookahead drafts not yet handed to their request's engine, as a LookaheadDrafter keeps


def _follow(proxy: Sequence, remote: Sequence) -> None:
    """The proxy takes what the engine reported of its sequence."""
    for name in ("response_ids", "logprobs", "policy_versions"):
        setattr(proxy, name, list(getattr(remote, name)))
    for name in ("status", "finish_reason", "t_admit", "t_finish", "drafted", "accepted"):
        setattr(proxy, name, getattr(remote, name))


class MultiEngine:
    """W engines behind one request engine, driven by one controller (the strategy)."""

    def __init__(
        self, pool: WorkerPool, config: EngineConfig, dispatch: str = DEFAULT_DISPATCH, migrate: bool = False
    ) -> None:
        self.pool, self.trace, self.dispatch, self.migrate = pool, pool.trace, dispatch, migrate
        self.config = replace(config, max_num_seqs=config.max_num_seqs * pool.size)
        self.max_model_len = config.max_model_len
        self.policy = make_policy(dispatch)
        self.history = LengthHistory()  # predicted response lengths: the dispatch's work
        self.load = EngineLoad.empty(pool.size)
        self.lost: set[int] = set()
        self._buffer: list[tuple[Request, Sequence]] = []  # added, not dispatched yet
        self._seqs: dict[str, Sequence] = {}  # the proxies of every request not finished, by id
        self._requests: dict[str, Request] = {}  # as submitted: what a lost engine's requests restart from
        self._where: dict[str, tuple[int, float]] = {}  # id -> (engine, predicted work)
        self._on: list[set[str]] = [set() for _ in range(pool.size)]
        self._waiting: list[list[str]] = [[] for _ in range(pool.size)]  # not started, as last reported
        self._busy: set[int] = set()  # engines with a slice in flight
        self._finished: list[tuple[int, Sequence]] = []  # this step's, by engine: history for the drafters
        self._lengths: dict[str, tuple[int, list[int]]] = {}  # this step's, by prompt: the history's records
        self._step: int | None = None
        self._names = itertools.count()  # ids for requests that come without one
        # Lookahead (base.BubbleFill on W engines, base.EngineFill in each): (first position, group size, the
        # next prompts' requests), the engines out of work for them, the engines that may hold runs, every
        # run's tokens by its request (a draft for the engine it is dispatched to), the step's runs.
        self._plan: tuple[int, int, list[tuple[int, Request]]] | None = None
        self._dry: set[int] = set()
        self._ahead_on: set[int] = set()
        self._drafts: OrderedDict[DraftKey, tuple[int, Sequence]] = OrderedDict()
        self._ahead_runs: list[Sequence] = []
        self._owners: dict[int, int] = {}  # the step's stream positions -> the engine that runs them ahead
        self._shared: dict[int, tuple[int, int]] = {}  # engine -> (first, live engines) of the share it holds

    # ---- what the trainer sees (RolloutEngine) ------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self.pool.policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.pool.policy_version = version

    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        self.pool.update_weights(state_dict, version)
        self._notice()

    def prepare(self, params: SamplingParams) -> None:
        self.pool.prepare(params)

    def close(self) -> None:
        self.pool.close()

    # ---- what the strategy sees (RequestEngine) -----------------------------------------------------------
    def add_request(self, request: Request) -> Sequence:
        seq_id = request.seq_id or f"multi-{next(self._names)}"
        request = replace(request, seq_id=seq_id)
        seq = Sequence.for_request(request, seq_id, max_model_len=self.max_model_len,
                                   policy_version=self.policy_version)  # fmt: skip
        self._buffer.append((request, seq))
        self._seqs[seq_id], self._requests[seq_id] = seq, request
        return seq

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    @property
    def running(self) -> list[Sequence]:
        return [s for s in self._seqs.values() if s.status == SequenceStatus.RUNNING]

    @property
    def waiting(self) -> list[Sequence]:
        return [s for s in self._seqs.values() if s.status == SequenceStatus.WAITING]

    def step(self) -> list[Sequence]:
        """Dispatch what was added, start a slice on every engine with work and none in flight, and return
        what finished in the next report."""
        self._notice()
        self._dispatch()
        if self.migrate:  # an engine with nothing on it and no slice in flight takes from the busiest
            for w in range(self.pool.size):
                if not self._on[w] and w not in self._busy:
                    self._steal_for(w)
        for w in range(self.pool.size):
            ahead = self._plan is not None and w not in self._dry and w not in self.lost
            if (self._on[w] or ahead) and w not in self._busy:
                self.pool.advance(w, self.trace.step, *self._plan_for(w))
                self._busy.add(w)
        if not self._busy:
            return []
        report = self.pool.next_report()
        self._busy.discard(report.worker)
        finished = self._absorb(report)
        if self.migrate and not report.lost and not report.waiting and report.running < self.pool.capacity:
            self._steal_for(report.worker)  # out of queued work with free slots: before its next slice
        if not self._seqs:  # all done without a halt (the baseline's strategy): the step's end all the same
            self._share_history()
        return finished

    def abort(self, seq: Sequence) -> Sequence:
        """Stop `seq`: the first abort of a step halts every engine (one round trip), later ones are local."""
        if self._on_engines():
            self.halt()
        if not seq.is_finished:
            seq.status, seq.finish_reason, seq.t_finish = SequenceStatus.ABORTED, "abort", self.trace.now()
        self._seqs.pop(seq.seq_id, None)
        self._requests.pop(seq.seq_id, None)
        return seq

    def halt(self) -> None:
        """The step's end: every slice in flight gathered and every engine's requests aborted, in one round
        trip. An aborted proxy keeps its tokens and reads RUNNING (or WAITING, if it never had a slot), as
        the strategy judges it before its own `abort`; one that finished in the gather reads FINISHED."""
        held = [w for w in range(self.pool.size) if self._on[w] or w in self._ahead_on]
        busy = sorted(w for w in held if w not in self.lost)
        reports = self.pool.halt(busy) if busy or self._busy else []
        self._busy, self._ahead_on, self._shared = set(), set(), {}  # the halt stops every engine's fill
        for report in reports:
            self._absorb(report, halting=True)
        self._buffer = []
        self._share_history()

    # ---- lookahead: each engine fills its own idle slots (base.EngineFill) --------------------------------
    def look_ahead(self, first: int, group_size: int, requests: list[tuple[int, Request]]) -> None:
        """The next prompts' requests (from stream position `first`) for the engines' bubble fill: each
        engine's share goes with its next slice."""
        if self._plan is None or self._plan[0] != first:
            self._dry = set()  # other requests: an engine out of work may find some again
        self._plan = (first, group_size, requests)

    def stop_lookahead(self) -> list[Sequence]:
        """The step's end: every engine's lookahead runs stopped (by the step's halt, or one now); the
        step's runs, each once."""
        if self._ahead_on or self._busy:
            self.halt()
        self._plan, self._owners = None, {}
        runs, self._ahead_runs = self._ahead_runs, []
        return runs

    def _plan_for(self, w: int) -> tuple[Lookahead, ...]:
        """What engine w's next slice takes: its share of the plan (the prompts at positions equal to its
        place among the live engines, modulo their count: a share that stays as the stream moves, so no run
        is made twice; a lost engine's positions go to the live ones, the others' stay) and the drafts other
        engines made for requests now on it; () for neither."""
        drafts = []
        for seq_id in self._on[w]:
            request = self._requests[seq_id]
            made = self._drafts.pop(draft_key(request.prompt_ids, request.params.seed), None)
            if made is not None and made[0] != w:  # its own runs' drafts are in its drafter already
                drafts.append(made[1])
        if self._plan is None:
            return (Lookahead(0, 1, [], drafts),) if drafts else ()
        first, group_size, requests = self._plan
        live = [v for v in range(self.pool.size) if v not in self.lost]
        self._ahead_on.add(w)
        if self._shared.get(w) == (first, len(live)):  # its share holds still: not sent again every slice
            return (Lookahead(first, group_size, None, drafts),)
        self._shared[w] = (first, len(live))
        for i, _ in requests:
            if self._owners.get(i, -1) not in live:
                self._owners[i] = live[i % len(live)]
        share = [(i, r) for i, r in requests if self._owners[i] == w]
        return (Lookahead(first, group_size, share, drafts),)

    def _keep_runs(self, report: WorkerReport) -> None:
        """A report's ended lookahead runs: the step's, to record, and drafts for their requests."""
        if report.dry:
            self._dry.add(report.worker)
        for seq in report.ahead:
            seq.meta = {**seq.meta, "worker": report.worker}
            self._ahead_runs.append(seq)
            if seq.response_ids:
                draft = replace(seq, logprobs=[], policy_versions=[])  # held between steps: its tokens alone
                self._drafts[draft_key(seq.prompt_ids, seq.params.seed)] = (report.worker, draft)
        while len(self._drafts) > KEPT_DRAFTS:
            self._drafts.popitem(last=False)

    # ---- the controller's bookkeeping ---------------------------------------------------------------------
    def _on_engines(self) -> bool:
        return any(self._on) or bool(self._busy)

    def _work(self, request: Request) -> float:
        prompt_id = str(request.meta.get("prompt_id", request.seq_id))
        predicted = self.history.predict(prompt_id, len(request.prompt_ids))
        return max(1.0, predicted - len(request.response_ids))

    def _dispatch(self) -> None:
        if self.trace.step != self._step:
            self._step = self.trace.step
            self.policy.begin_step(self.trace.step)
            self._forget_groups()
        if not self._buffer:
            return
        live = [w for w in range(self.pool.size) if w not in self.lost]
        units = [Unit(int(r.meta.get("index", 0)), self._work(r)) for r, _ in self._buffer]
        sub = EngineLoad([self.load.in_flight[w] for w in live], [self.load.tokens[w] for w in live])
        picks = self.policy.assign(units, sub)
        batches: dict[int, list[Request]] = {}
        for (request, seq), unit, k in zip(self._buffer, units, picks, strict=True):
            w = live[k]
            self.load.add(w, unit.work)
            self._where[str(request.seq_id)] = (w, unit.work)
            self._on[w].add(str(request.seq_id))
            seq.meta["worker"] = w
            batches.setdefault(w, []).append(request)
            self._waiting[w].append(str(request.seq_id))
        self._buffer = []
        engines = [live[k] for k in picks]
        self.trace.add(
            dispatch_event(self.trace.now(), self.trace.step, self.policy.name, engines, self.load.tokens)
        )
        for w, requests in sorted(batches.items()):
            try:
                self.pool.submit(w, requests)
            except WorkerLost as err:  # its requests go back to the buffer, for the engines left
                self._lose(err.worker, halting=False)
        if self._buffer:
            self._dispatch()

    def _absorb(self, report: WorkerReport, halting: bool = False) -> list[Sequence]:
        if report.lost:
            self._lose(report.worker, halting)
            return []
        if report.worker in self.lost:  # a slice it had in flight: its requests already went elsewhere
            return []
        for event in report.events:
            self.trace.add(event)
        self._keep_runs(report)
        waiting, finished = set(report.waiting), []
        self._waiting[report.worker] = list(report.waiting)
        for remote in report.finished:
            seq = self._seqs.get(remote.seq_id)
            if seq is None:
                continue
            _follow(seq, remote)
            self._settle(seq.seq_id)
            if seq.status == SequenceStatus.FINISHED:
                del self._seqs[seq.seq_id], self._requests[seq.seq_id]
                finished.append(seq)
                self._finished.append((report.worker, seq))
                key = str(seq.meta.get("prompt_id", seq.seq_id))
                self._lengths.setdefault(key, (len(seq.prompt_ids), []))[1].append(len(seq.response_ids))
            else:  # aborted by a halt: as the strategy judges it before its own abort
                seq.status = SequenceStatus.WAITING if seq.seq_id in waiting else SequenceStatus.RUNNING
        for seq_id in self._on[report.worker]:
            proxy = self._seqs[seq_id]
            proxy.status = SequenceStatus.WAITING if seq_id in waiting else SequenceStatus.RUNNING
        return finished

    def _notice(self) -> None:
        """Engines the pool found dead outside a slice (a weight update) are lost too."""
        for w in getattr(self.pool, "dead", ()):
            if w not in self.lost:
                self._lose(w, halting=False)

    def _settle(self, seq_id: str) -> None:
        w, work = self._where.pop(seq_id)
        self.load.remove(w, work)
        self._on[w].discard(seq_id)

    def _lose(self, worker: int, halting: bool) -> None:
        """Retire a dead engine; its requests restart from what the controller holds (at a halt they are
        handed back unrun instead, as if they never had a slot)."""
        self._busy.discard(worker)
        orphans = sorted(self._on[worker])
        if not retire_engine(self.pool, self.lost, worker, len(orphans)):
            return
        self._waiting[worker] = []
        # A policy's memory names engines by their place among the live ones, which just moved: a fresh one.
        self.policy = make_policy(self.dispatch)
        self.policy.begin_step(self.trace.step)
        for seq_id in orphans:
            self._settle(seq_id)
            request, proxy = self._requests[seq_id], self._seqs[seq_id]
            # A resumed partial's tokens from earlier steps came with the request: those the controller keeps.
            kept = len(request.response_ids)
            proxy.response_ids, proxy.logprobs = proxy.response_ids[:kept], proxy.logprobs[:kept]
            proxy.policy_versions = proxy.policy_versions[:kept]
            proxy.status, proxy.t_admit = SequenceStatus.WAITING, None
            if not halting:
                self._buffer.append((request, proxy))

    def _steal_for(self, thief: int) -> None:
        """Move not-yet-started requests from the busiest engine to `thief` (rebalance.py's rule, as placed.py
        migrates): they are settled off the donor and placed on the thief as if dispatched there."""
        if thief in self.lost:
            return
        work = {i: self._where[i][1] for on in self._on for i in on}
        waiting = [[i for i in self._waiting[w] if i in self._on[w]] for w in range(self.pool.size)]
        plan = steal_plan(thief, waiting, lambda w: self.load.tokens[w], work)
        if plan is None:
            return
        donor, chosen = plan
        try:
            taken = self.pool.take_unstarted(donor, chosen)
        except WorkerLost as err:  # its requests go back to the buffer, for the next dispatch
            self._lose(err.worker, halting=False)
            return
        self._waiting[donor] = [i for i in waiting[donor] if i not in chosen]  # taken, or started
        for request in taken:
            seq_id = str(request.seq_id)
            self._settle(seq_id)
            self.load.add(thief, work[seq_id])
            self._where[seq_id] = (thief, work[seq_id])
            self._on[thief].add(seq_id)
            self._waiting[thief].append(seq_id)
            self._seqs[seq_id].meta["worker"] = thief
        if not taken:
            return
        self.trace.add(migrate_event(self.trace.now(), donor, thief, len(taken)))
        try:
            self.pool.submit(thief, taken)
        except WorkerLost as err:
            self._lose(err.worker, halting=False)

    def _forget_groups(self) -> None:
        """At a step's start: groups no longer held (trained, dropped) leave the policy's memory."""
        forget = getattr(self.policy, "forget", None)
        if forget is None:
            return
        held = {int(r.meta.get("index", 0)) for r, _ in self._buffer}
        held |= {int(s.meta.get("index", 0)) for s in self._seqs.values()}
        for group in set(getattr(self.policy, "engine_of", {})) - held:
            forget(group)

    def dispatch_state(self) -> dict[str, Any]:
        """What the dispatch learnt (the predicted lengths): checkpointed with the strategy's state."""
        return {"history": self.history.state_dict()}

    def load_dispatch_state(self, state: Mapping[str, Any]) -> None:
        self.history.load_state_dict(dict(state["history"]))

    def _share_history(self) -> None:
        """The step's end: each prompt's lengths of the step become one record of the history (per group, as
        placed.py records), and drafting engines see every other engine's finished responses of the step."""
        lengths, self._lengths = self._lengths, {}
        for key, (prompt_tokens, done) in lengths.items():
            self.history.record(key, prompt_tokens, done)
        finished, self._finished = self._finished, []
        if not self.pool.drafts or not finished:
            return
        for w in range(self.pool.size):
            if w not in self.lost:
                self.pool.add_history(w, [(s.prompt_ids, s.response_ids) for v, s in finished if v != w])


@dataclass(frozen=True)
class Engines:
    """The engines a rollout side drives: one in-process engine, or W replicas under one controller (a
    rollout run ahead builds them in its own process: rollout/ahead.py)."""

    workers: int = 1
    backend: str = "ray"  # ray | local (workers.make_worker_pool)
    address: str | None = None
    dispatch: str = DEFAULT_DISPATCH
    migrate: bool = False  # straggler migration across the engines (rebalance.py)


def build_side(
    spec: WorkerSpec, weights: Mapping[str, Any], version: int, t0: float, engines: Engines
) -> tuple[Any, Any, Trace]:
    """(engine, its Speculator or None, the trace it records into) at policy `version`: one worker's engine
    (W = 1, as a rollout run ahead always had), or a MultiEngine over W workers, each at `version`."""
    if engines.workers <= 1:
        worker = RolloutWorker(spec, weights, 0, t0, version)
        return worker.engine, worker.speculator, worker.trace
    trace = Trace(t0=t0)
    pool = make_worker_pool(spec, weights, engines.workers, trace, engines.backend, engines.address)
    if version:
        pool.update_weights(weights, version)
    return MultiEngine(pool, spec.engine_config, engines.dispatch, engines.migrate), None, trace
