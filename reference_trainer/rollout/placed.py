"""Synchronous rollout over W workers with a dispatch policy (dispatch.py): the baseline's semantics
(every sample of every group finishes before the update) spread over a `WorkerPool`.

Every request carries its predicted work (the prompt's mean response length last epoch: placement.py
LengthHistory); the policy assigns the step's requests to engines at once, and the trace records that
decision (a `dispatch` event). Each worker's queue is then ordered (placement.py reorder: HistoPipe's
alternates long->short / short->long by step), and with migration a worker whose queue runs dry (free slots,
nothing waiting) takes requests that have not started yet from the worker with the most predicted work left.
A worker lost mid-step (a dead Ray actor) is retired and its unfinished requests are dispatched again to the
others (rebalance.py: the same mark and the same rule as the controller of the other modes, multi.py); each
request finishes once, on one worker, so nothing is trained twice and nothing is lost.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.rollout.base import Group, RolloutContext
from reference_trainer.rollout.dispatch import DispatchOptions, EngineLoad, Unit, engine_queues
from reference_trainer.rollout.placement import LengthHistory, reorder
from reference_trainer.rollout.rebalance import retire_engine, steal_plan
from reference_trainer.rollout.workers import WorkerLost, WorkerPool, WorkerReport
from reference_trainer.trace.schema import dispatch_event, migrate_event


class PlacedRollout:
    name = "placed"

    def __init__(self, options: DispatchOptions | None = None) -> None:
        self.options = options = options or DispatchOptions()
        self.policy = options.policy()
        self.migrate, self.order = options.migrates, options.queue_order
        self.history = LengthHistory()
        self.lost: set[int] = set()  # workers lost in this run: no request goes to them again

    def collect(self, ctx: RolloutContext) -> list[Group]:
        pool: WorkerPool = ctx.engine  # type: ignore[assignment]
        step = pool.trace.step
        for w in getattr(pool, "dead", ()):  # a Ray actor found dead at a weight update: lost before the step
            if retire_engine(pool, self.lost, w, 0):
                self.fresh_policy(step)
        groups, requests, units, predicted = [], [], [], {}
        for _ in range(ctx.update_batch):
            index, problem = ctx.stream.take()
            groups.append(Group(index, problem, []))
            work = predicted[index] = self.history.predict(
                problem.prompt_id, len(ctx.prompt_ids(index, problem))
            )
            for k in range(ctx.group_size):
                requests.append(ctx.request(index, problem, k))
                units.append(Unit(index, work))  # the group's stream position: one per group in the run
        self.policy.begin_step(step)
        engines = self.assign(pool, step, units, EngineLoad.empty(pool.size))
        queues = reorder(engine_queues(engines, pool.size), units, step, self.order)
        run = _Run(pool, step, {str(r.seq_id): u for r, u in zip(requests, units, strict=True)}, self)
        for w, queue in enumerate(queues):
            run.submit(w, [replace(requests[i], priority=pos) for pos, i in enumerate(queue)])
        finished = run.drive()

        by_index = {g.index: g for g in groups}
        for seq in sorted(finished.values(), key=lambda s: s.meta["sample"]):
            by_index[seq.meta["index"]].samples.append(seq)
        for group in groups:
            for seq in group.samples:
                # the work it was dispatched by: a length trace of the run replays the trainer's predictions
                ctx.record(seq, worker=seq.meta["worker"], predicted_tokens=predicted[group.index])
            prompt = ctx.prompt_ids(group.index, group.problem)
            self.history.record(
                group.problem.prompt_id, len(prompt), [len(s.response_ids) for s in group.samples]
            )
        if pool.drafts:  # HistoSpec: every worker sees every prompt's new responses
            samples = [s for g in groups for s in g.samples]
            for w in (w for w in range(pool.size) if w not in self.lost):
                others = [(s.prompt_ids, s.response_ids) for s in samples if s.meta["worker"] != w]
                pool.add_history(w, others)
        return groups

    def assign(self, pool: WorkerPool, step: int, units: list[Unit], load: EngineLoad) -> list[int]:
        """The policy's engine for each unit, among the workers not lost (`load`: every worker's, updated),
        traced as a `dispatch` event."""
        live = [w for w in range(pool.size) if w not in self.lost]
        sub = EngineLoad([load.in_flight[w] for w in live], [load.tokens[w] for w in live])
        engines = [live[k] for k in self.policy.assign(units, sub)]
        for k, w in enumerate(live):
            load.in_flight[w], load.tokens[w] = sub.in_flight[k], sub.tokens[k]
        pool.trace.add(dispatch_event(pool.trace.now(), step, self.policy.name, engines, load.tokens))
        return engines

    def fresh_policy(self, step: int) -> None:
        # A policy's memory names engines by their place among the live ones, which just moved: a fresh one.
        self.policy = self.options.policy()
        self.policy.begin_step(step)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["history"])


class _Run:
    """One step's rollout across the pool: who holds which request, and the loop that drives them."""

    def __init__(self, pool: WorkerPool, step: int, units: dict[str, Unit], owner: PlacedRollout) -> None:
        self.pool, self.step, self.units, self.owner = pool, step, units, owner
        self.work = {i: u.work for i, u in units.items()}
        self.requests: dict[str, Request] = {}  # as submitted: what a lost worker's requests restart from
        self.outstanding: list[set[str]] = [set() for _ in range(pool.size)]
        self.waiting: list[list[str]] = [[] for _ in range(pool.size)]
        self.busy: set[int] = set()  # workers with a slice in flight
        self.finished: dict[str, Sequence] = {}

    def submit(self, worker: int, requests: list[Request]) -> None:
        if not requests:
            return
        for r in requests:
            self.requests[str(r.seq_id)] = r
        self.outstanding[worker].update(str(r.seq_id) for r in requests)
        self.waiting[worker].extend(str(r.seq_id) for r in requests)
        try:
            self.pool.submit(worker, requests)
        except WorkerLost as err:  # a dead Ray actor: its requests go to the others
            self._lose(err.worker)

    def left(self, worker: int) -> float:
        return sum(self.work[i] for i in self.outstanding[worker])

    def drive(self) -> dict[str, Sequence]:
        for w in range(self.pool.size):
            if self.outstanding[w] and w not in self.busy:
                self._start(w)
        while self.busy:
            report = self.pool.next_report()
            self.busy.discard(report.worker)
            if report.lost:
                self._lose(report.worker)
                continue
            self._absorb(report)
            w = report.worker
            # Out of queued work with free slots: top up from the busiest queue before the next slice.
            if self.owner.migrate and not report.waiting and report.running < self.pool.capacity:
                self._steal_for(w)
            if self.outstanding[w]:
                self._start(w)
            if self.owner.migrate:  # workers with nothing left (parked) top up too
                for p in range(self.pool.size):
                    if p not in self.busy and p not in self.owner.lost and self._steal_for(p):
                        self._start(p)
        if any(self.outstanding):
            raise RuntimeError(f"rollout ended with requests unaccounted for: {self.outstanding}")
        return self.finished

    def _start(self, worker: int) -> None:
        self.pool.advance(worker, self.step)
        self.busy.add(worker)

    def _absorb(self, report: WorkerReport) -> None:
        for event in report.events:
            self.pool.trace.add(event)
        for seq in report.finished:
            seq.meta["worker"] = report.worker
            self.finished[seq.seq_id] = seq
            self.outstanding[report.worker].discard(seq.seq_id)
        self.waiting[report.worker] = list(report.waiting)

    def _lose(self, worker: int) -> None:
        """Retire a dead worker and dispatch its unfinished requests again, as submitted, to the others (what
        it generated of them this step is gone with it; the same seeds redraw it)."""
        self.busy.discard(worker)
        orphans = sorted(self.outstanding[worker])
        if not retire_engine(self.pool, self.owner.lost, worker, len(orphans)):
            return
        self.outstanding[worker], self.waiting[worker] = set(), []
        self.owner.fresh_policy(self.step)
        if not orphans:
            return
        load = EngineLoad([len(o) for o in self.outstanding], [self.left(w) for w in range(self.pool.size)])
        engines = self.owner.assign(self.pool, self.step, [self.units[i] for i in orphans], load)
        for w in sorted(set(engines)):
            self.submit(w, [self.requests[i] for i, e in zip(orphans, engines, strict=True) if e == w])
            if w not in self.busy and w not in self.owner.lost:
                self._start(w)

    def _steal_for(self, thief: int) -> bool:
        """Move not-yet-started requests from the busiest queue to an idle worker (rebalance.py's rule)."""
        plan = steal_plan(thief, self.waiting, self.left, self.work)
        if plan is None:
            return False
        donor, chosen = plan
        try:
            taken = self.pool.take_unstarted(donor, chosen)
        except WorkerLost as err:
            self._lose(err.worker)
            return False
        taken_ids = {r.seq_id for r in taken}
        self.waiting[donor] = [i for i in self.waiting[donor] if i not in chosen]  # taken, or started
        if not taken:
            return False
        self.outstanding[donor] -= taken_ids
        self.submit(thief, taken)
        self.pool.trace.add(migrate_event(self.pool.trace.now(), donor, thief, len(taken)))
        return True
