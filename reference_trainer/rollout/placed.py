"""Synchronous rollout over W workers with a dispatch policy (dispatch.py): the baseline's semantics
(every sample of every group finishes before the update) spread over a `WorkerPool`.

Every request carries its predicted work (the prompt's mean response length last epoch: placement.py
LengthHistory); the policy assigns the step's requests to engines at once, and the trace records that
decision (a `dispatch` event). Each worker's queue is then ordered (placement.py reorder: HistoPipe's
alternates long->short / short->long by step), and with migration a worker whose queue runs dry (free slots,
nothing waiting) takes requests that have not started yet from the worker with the most predicted work left.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.rollout.base import Group, RolloutContext
from reference_trainer.rollout.dispatch import DispatchOptions, EngineLoad, Unit, engine_queues
from reference_trainer.rollout.placement import LengthHistory, reorder
from reference_trainer.rollout.rebalance import migrate_event, steal_plan
from reference_trainer.rollout.workers import WorkerLost, WorkerPool, WorkerReport
from reference_trainer.trace.schema import dispatch_event


class PlacedRollout:
    name = "placed"

    def __init__(self, options: DispatchOptions | None = None) -> None:
        self.options = options = options or DispatchOptions()
        self.policy = options.policy()
        self.migrate, self.order = options.migrates, options.queue_order
        self.history = LengthHistory()

    def collect(self, ctx: RolloutContext) -> list[Group]:
        pool: WorkerPool = ctx.engine  # type: ignore[assignment]
        step = pool.trace.step
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
        load = EngineLoad.empty(pool.size)
        engines = self.policy.assign(units, load)
        pool.trace.add(dispatch_event(pool.trace.now(), step, self.policy.name, engines, load.tokens))
        queues = reorder(engine_queues(engines, pool.size), units, step, self.order)
        run = _Run(pool, step, {r.seq_id: u.work for r, u in zip(requests, units, strict=True)}, self.migrate)
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
            for w in range(pool.size):
                pool.add_history(
                    w,
                    [
                        (s.prompt_ids, s.response_ids)
                        for g in groups
                        for s in g.samples
                        if s.meta["worker"] != w
                    ],
                )
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["history"])


class _Run:
    """One step's rollout across the pool: who holds which request, and the loop that drives them."""

    def __init__(self, pool: WorkerPool, step: int, work: dict[str, float], migrate: bool) -> None:
        self.pool, self.step, self.work, self.migrate = pool, step, work, migrate
        self.outstanding: list[set[str]] = [set() for _ in range(pool.size)]
        self.waiting: list[list[str]] = [[] for _ in range(pool.size)]
        self.finished: dict[str, Sequence] = {}

    def submit(self, worker: int, requests: list[Request]) -> None:
        if requests:
            self.pool.submit(worker, requests)
            self.outstanding[worker].update(r.seq_id for r in requests)
            self.waiting[worker].extend(r.seq_id for r in requests)

    def left(self, worker: int) -> float:
        return sum(self.work[i] for i in self.outstanding[worker])

    def drive(self) -> dict[str, Sequence]:
        inflight = 0
        for w in range(self.pool.size):
            if self.outstanding[w]:
                self.pool.advance(w, self.step)
                inflight += 1
        parked = {w for w in range(self.pool.size) if not self.outstanding[w]}
        while inflight:
            report = self.pool.next_report()
            if report.lost:  # the placed baseline does not redistribute (rollout/multi.py's controller does)
                raise WorkerLost(report.worker, "the placed baseline's step cannot finish without it")
            inflight -= 1
            self._absorb(report)
            w = report.worker
            # Out of queued work with free slots: top up from the busiest queue before the next slice.
            if self.migrate and not report.waiting and report.running < self.pool.capacity:
                self._steal_for(w)
            if self.outstanding[w]:
                self.pool.advance(w, self.step)
                inflight += 1
            else:
                parked.add(w)
            if self.migrate:
                for p in sorted(parked):
                    if self._steal_for(p):
                        parked.discard(p)
                        self.pool.advance(p, self.step)
                        inflight += 1
        if any(self.outstanding):
            raise RuntimeError(f"rollout ended with requests unaccounted for: {self.outstanding}")
        return self.finished

    def _absorb(self, report: WorkerReport) -> None:
        for event in report.events:
            self.pool.trace.add(event)
        for seq in report.finished:
            seq.meta["worker"] = report.worker
            self.finished[seq.seq_id] = seq
            self.outstanding[report.worker].discard(seq.seq_id)
        self.waiting[report.worker] = list(report.waiting)

    def _steal_for(self, thief: int) -> bool:
        """Move not-yet-started requests from the busiest queue to an idle worker (rebalance.py's rule)."""
        plan = steal_plan(thief, self.waiting, self.left, self.work)
        if plan is None:
            return False
        donor, chosen = plan
        taken = self.pool.take_unstarted(donor, chosen)
        taken_ids = {r.seq_id for r in taken}
        self.waiting[donor] = [i for i in self.waiting[donor] if i not in chosen]  # taken, or started
        if not taken:
            return False
        self.outstanding[donor] -= taken_ids
        self.submit(thief, taken)
        self.pool.trace.add(migrate_event(self.pool.trace.now(), donor, thief, len(taken)))
        return True
