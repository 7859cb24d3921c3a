"""Rollout strategies: which prompts enter the engine, when, and which finished groups an update consumes.

The trainer loop calls `strategy.collect(ctx)` once per step and trains on the groups it returns; a mode
(baseline, SortedRL, ...) is one strategy class, never a branch inside the loop.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.hostclock import HostClock, host_fields
from reference_trainer.engine.protocol import RequestEngine
from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.option import Options, option
from reference_trainer.tasks.base import Problem, Task
from reference_trainer.trace.schema import ROLLOUT

if TYPE_CHECKING:  # the speculator imports torch; the strategies' options are read without it
    from reference_trainer.speculation.speculator import Speculator


def max_staleness() -> Any:
    """The bound on a trained token's age in policy versions, whoever keeps tokens that long: a field of
    SortedOptions (a kept partial rollout older than it is regenerated) and of AheadOptions (a rollout runs
    this many steps ahead)."""
    return option(
        1,
        "a trained token is at most this many policy versions old: a kept sample whose oldest token would be "
        "older is regenerated (no effect on-policy: nothing outlives an update); an async mode's rollout "
        "runs this many steps ahead, step t on the weights of step t - k (0: the synchronous schedule)",
        minimum=0,
        simulated=True,
    )


@dataclass
class Group:
    """All `group_size` samples of one prompt."""

    index: int  # the prompt's position in the stream
    problem: Problem
    samples: list[Sequence]


class PromptStream:
    """The task's problems in a fixed order; the position is part of the run's resumable state."""

    CACHED = 4096  # problems kept (the oldest dropped first): a strategy re-reads its active ones each step

    def __init__(self, task: Task, seed: int, pool: int | None = None) -> None:
        self.task, self.seed, self.next_index = task, seed, 0
        self.pool = pool  # cycle a fixed pool of this many problems: epochs repeat prompts
        # Generating a problem is a task's whole sampler (arith draws its operations): SortedRL's controller
        # asks for its active prompts' problems at every submission, so each is made once.
        self._problems: dict[int, Problem] = {}

    def take(self) -> tuple[int, Problem]:
        index = self.next_index
        self.next_index += 1
        return index, self.problem(index)

    def problem(self, index: int) -> Problem:
        start = index % self.pool if self.pool else index
        found = self._problems.get(start)
        if found is None:
            if len(self._problems) >= self.CACHED:  # the oldest entry first (dicts keep insertion order)
                del self._problems[next(iter(self._problems))]
            found = self._problems[start] = self.task.problems(1, seed=self.seed, start=start)[0]
        return found

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_index = int(state["next_index"])


def request_seed(run_seed: int, index: int, sample: int, attempt: int = 0) -> int:
    """A per-request sampling seed fixed by (run, prompt, sample, attempt): the same in every mode, so modes
    are compared on the same samples, and the same after a resume."""
    return zlib.crc32(f"{run_seed}/{index}/{sample}/{attempt}".encode())


@dataclass
class RolloutContext:
    """What a strategy needs from the run: the engine, the prompt stream and the sampling settings."""

    engine: RequestEngine  # a WorkerPool (workers.py) for PlacedRollout (placed.py)
    tokenizer: Any
    stream: PromptStream
    group_size: int
    update_batch: int  # groups per update
    params: SamplingParams
    seed: int
    speculator: Speculator | None = None  # the engine's, if it drafts: lookahead's cost gate (BubbleFill)
    # The sequence events recorded since the trainer last took them, with their sequences: the trainer
    # grades every generation, trained or not, outside the step's time (the ledger's rewards).
    recorded: list[tuple[dict[str, Any], Sequence]] = field(default_factory=list)
    _prompt_ids: dict[int, list[int]] = field(default_factory=dict)

    def prompt_ids(self, index: int, problem: Problem) -> list[int]:
        if index not in self._prompt_ids:
            self._prompt_ids[index] = encode_prompt(self.tokenizer, problem.prompt)
        return self._prompt_ids[index]

    def request(
        self,
        index: int,
        problem: Problem,
        sample: int,
        attempt: int = 0,
        priority: int = 0,
        admitted: int | None = None,
    ) -> Request:
        """One sample's request: its seed depends only on (run seed, prompt position, sample, attempt).
        `admitted`: the policy version at which its prompt was first admitted (default: the engine's now)."""
        suffix = f"#{attempt}" if attempt else ""
        version = self.engine.policy_version if admitted is None else admitted
        return Request(
            self.prompt_ids(index, problem),
            replace(self.params, seed=request_seed(self.seed, index, sample, attempt)),
            seq_id=f"{problem.prompt_id}/{sample}{suffix}",
            priority=priority,
            meta={"prompt_id": problem.prompt_id, "sample": sample, "index": index, "admitted": version},
        )

    def submit(self, index: int, problem: Problem, sample: int) -> Sequence:
        """Queue one sample (its first attempt)."""
        return self.engine.add_request(self.request(index, problem, sample))

    def record(self, seq: Sequence, status: str | None = None, **extra: Any) -> None:
        """Append the sequence's trace event (status overrides: e.g. 'cached' for a kept partial), with its
        prompt's stream position and first admission's policy version (the ledger's waiting ages)."""
        record = seq.trace_record()
        if status is not None:
            record["status"] = status
        if "index" in seq.meta:
            record["prompt_index"] = int(seq.meta["index"])
        if seq.meta.get("admitted") is not None:
            record["admit_version"] = int(seq.meta["admitted"])
        if "worker" in seq.meta:  # the engine that ran it last, when several do (multi.py, placed.py)
            record["worker"] = int(seq.meta["worker"])
        record.update(extra)
        self.engine.trace.add(record)
        if record["status"] != LOOKAHEAD:
            self.recorded.append((record, seq))


class RolloutStrategy(Protocol):
    name: str

    def collect(self, ctx: RolloutContext) -> list[Group]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class AheadOptions(Options):
    """The options of a strategy run ahead of the update in a rollout process of its own (modes async,
    sorted+async: ahead.AheadRollout, which imports torch; so they are declared here, with InlineRollout,
    the other way a loop gets its groups)."""

    max_staleness: int = max_staleness()
    rollout_threads: int | None = option(
        None,
        "CPU threads of the rollout side; the update keeps the rest of --threads (auto: half, at least 1; "
        "with max_staleness 0 both sides take all, as they never run at once)",
        minimum=1,
        null_word="auto",
    )
    rollout_device: str | None = option(
        None,
        "the rollout side's device, e.g. cuda:1 (auto: the run's --device, shared with the update)",
        null_word="auto",
    )
    backend: str = option(
        "process",
        "where the rollout side runs: a process of its own, or a thread of the trainer's (tests and "
        "debugging: one GIL and one torch thread pool, so its timings are not a process's)",
        choices=("process", "thread"),
    )


class InlineRollout:
    """A run's rollout between its updates, in the trainer's own process (every synchronous mode): each step's
    rollout phase runs the strategy to its groups, then the update trains, then the new weights go into the
    engine in place. The trainer's loop sees this and `ahead.AheadRollout` (a rollout run beside the updates)
    through the same methods."""

    def __init__(self, strategy: RolloutStrategy, ctx: RolloutContext) -> None:
        self.strategy, self.ctx = strategy, ctx

    @property
    def engine(self) -> RequestEngine:
        return self.ctx.engine

    def launch(self, step: int) -> None:
        """Before the first timed step: captures and compiles (`prepare`) out of every step's clock."""
        self.engine.prepare(self.ctx.params)

    def begin(self, step: int) -> None:
        """Nothing runs between steps here."""

    def collect(self) -> list[Group]:
        """The step's rollout phase; with an engine that keeps a host clock (engine/hostclock.py), its CPU
        seconds by part: the strategy's own work outside engine steps is the controller's."""
        clock: HostClock | None = getattr(self.engine, "host_clock", None)
        with self.engine.trace.phase(ROLLOUT, policy_version=self.engine.policy_version) as rollout:
            if clock is None:
                groups = self.strategy.collect(self.ctx)
            else:
                before = clock.snapshot()
                with clock.controller:
                    groups = self.strategy.collect(self.ctx)
                rollout.update(host_fields(clock.since(before)))
            rollout["groups"] = len(groups)
        return groups

    def end(self) -> None:
        """Nothing runs between steps here."""

    def take_recorded(self) -> list[tuple[dict[str, Any], Sequence]]:
        """The sequence events recorded since the last call, with their sequences (to grade)."""
        recorded, self.ctx.recorded = self.ctx.recorded, []
        return recorded

    def history(self) -> dict[int, dict[str, Any]]:
        """Older weights a resumed run needs: none, every step rolls out on the newest."""
        return {}

    def restore(self, history: dict[int, dict[str, Any]], step: int, where: str = "") -> None:
        """Nothing to restore (see `history`)."""


def run_to_completion(engine: RequestEngine) -> None:
    while engine.has_unfinished():
        engine.step()


LOOKAHEAD_PRIORITY = 2  # behind every real request (the strategies' priorities are 0 and 1)
LOOKAHEAD = "lookahead"  # the status of a lookahead run's sequence event


def ahead_of(request: Request) -> Request:
    """The lookahead run of `request`: the same prompt, sampling parameters and seed, queued behind every real
    request. Its id reads as the run ahead of the request's in the trace; what makes it a lookahead run is
    `Request.lookahead`, not its name."""
    return replace(request, seq_id=f"lookahead:{request.seq_id}", priority=LOOKAHEAD_PRIORITY, lookahead=True)


class BubbleFill:
    """The lookahead runs of one rollout step: started in its bubble, stopped when it ends.

    Lookahead in the bubble (BubbleSpec, arXiv 2605.08862; SRT, arXiv 2601.09083): the slots a step leaves
    idle while its last samples finish run the next step's requests under the current weights.

    The prompt stream fixes the next step's prompts in advance (the next `update_batch` positions of the
    stream), and a request's seed depends only on (run, prompt position, sample, attempt), so the request a
    lookahead run precedes is known exactly: same prompt, same sampling parameters, same seed. When the step
    ends the lookahead runs are stopped; their tokens become those requests' drafts
    (speculation/lookahead.py), verified exactly under the new weights. Nothing a lookahead run generates is
    a sample: it is never in a group, its sequence event says status "lookahead", and the engine counts its
    slots and tokens apart.

    When to fill, and how much, is a cost question: a lookahead row makes every decode step of the step's own
    samples wider, and its prefill is a forward they wait for. So lookahead starts only where nothing real is
    waiting, a group's worth of samples at a time at least (at most one prefill per group), and only as many
    rows as the Speculator's cost gate (`RolloutContext.speculator`, `Speculator.free_rows`) says cost at most
    its `margin` more per decode step. A real request that finds no free slot (SortedRL admits lazily) stops
    lookahead runs to get one.
    """

    def __init__(self) -> None:
        self.seqs: dict[str, tuple[int, Sequence]] = {}  # request id -> (prompt position, its lookahead run)
        self._upcoming: tuple[int, list[tuple[int, Request]]] = (-1, [])  # (first position, its requests)

    def fill(self, ctx: RolloutContext, waiting: int = 0) -> None:
        """Between engine steps: stop the runs whose prompt the step has since taken for real (their tokens
        are its drafts now) and the latest ones until `waiting` real requests find free slots; then, when
        nothing waits, start the next prompts' samples in idle slots, within the cost gate. Called before
        every engine step, so the common case (no slot free, or the gate closed) returns before any request
        is built. On W engines (multi.py `look_ahead`) each engine fills its own slots (`EngineFill`)."""
        first = ctx.stream.next_index
        look_ahead = getattr(ctx.engine, "look_ahead", None)
        if look_ahead is not None:
            look_ahead(first, ctx.group_size, self._next(ctx, first))
            return
        self.fill_engine(
            ctx.engine, ctx.speculator, first, ctx.group_size, waiting, lambda: self._next(ctx, first)
        )

    def fill_engine(
        self,
        engine: Any,
        gate: Speculator | None,
        first: int,
        group_size: int,
        waiting: int,
        upcoming: Callable[[], list[tuple[int, Request]]],
    ) -> None:
        """`fill` on one engine: `first` is the stream's next position, `upcoming` the requests of the next
        prompts as (position, request), built only when a group's worth of rows is free."""
        capacity = int(engine.config.max_num_seqs)
        if self.seqs:
            for index, seq in list(self.seqs.values()):
                if index < first and not seq.is_finished:
                    engine.abort(seq)
            short = waiting - (capacity - len(engine.running))
            for _, seq in reversed(list(self.seqs.values())):
                if short <= 0:
                    break
                if not seq.is_finished:
                    engine.abort(seq)
                    short -= 1
        running = engine.running
        free = capacity - len(running)
        if free <= 0 or engine.waiting:
            return
        ahead = sum(s.lookahead for s in running)
        real = len(running) - ahead
        n = free if gate is None else min(free, gate.free_rows(real, ahead + free) - ahead)
        if n < group_size:  # at most one prefill per group: a prefill is a forward the samples wait for
            return
        todo = [(i, r) for i, r in upcoming() if r.seq_id not in self.seqs]
        for index, r in todo[:n]:
            self.seqs[str(r.seq_id)] = (index, engine.add_request(ahead_of(r)))

    def _next(self, ctx: RolloutContext, first: int) -> list[tuple[int, Request]]:
        """The next prompts' requests, built once per position of the stream."""
        if self._upcoming[0] != first:
            upcoming = []
            for index in range(first, first + ctx.update_batch):
                problem = ctx.stream.problem(index)
                upcoming += [(index, ctx.request(index, problem, k)) for k in range(ctx.group_size)]
            self._upcoming = (first, upcoming)
        return self._upcoming[1]

    def stop(self, ctx: RolloutContext) -> None:
        """The step is over: stop every lookahead run (its tokens become its request's draft) and record
        them as lookahead work, never as samples (on W engines the controller stops every engine's)."""
        stop_lookahead = getattr(ctx.engine, "stop_lookahead", None)
        for seq in stop_lookahead() if stop_lookahead is not None else self.stop_engine(ctx.engine):
            if seq.response_ids:  # one that never got a slot did no work
                ctx.record(seq, LOOKAHEAD)

    def stop_engine(self, engine: Any) -> list[Sequence]:
        """Stop every lookahead run on `engine` (finished ones stay as they are); returns them all."""
        runs = [seq for _, seq in self.seqs.values()]
        for seq in runs:
            engine.abort(seq)
        self.seqs.clear()
        return runs


@dataclass
class Lookahead:
    """What the controller (rollout/multi.py) hands one of W engines with a slice: the next prompts'
    requests that engine may run ahead, as (stream position, request), from stream position `first` (None:
    the last plan's, sent once), and `drafts`: lookahead runs another engine made for requests now on it."""

    first: int
    group_size: int
    requests: list[tuple[int, Request]] | None
    drafts: list[Sequence] = field(default_factory=list)


class EngineFill:
    """The bubble fill of one of W engines, run by its worker (workers.py) between its own engine steps:
    `BubbleFill.fill_engine` over the requests the controller handed it, with its own Speculator's cost gate
    and its own queue. Its runs that ended (finished, or stopped for a real request) go back to the
    controller with the worker's next report: their tokens are drafts wherever their requests run."""

    def __init__(self) -> None:
        self.bubble = BubbleFill()
        self.plan: Lookahead | None = None
        self._sent: set[str] = set()  # ended runs already reported

    def take(self, plan: Lookahead, speculator: Speculator | None) -> None:
        """A slice's plan; its drafts go into this engine's drafter now, before any of its steps."""
        for seq in plan.drafts if speculator is not None else ():
            speculator.released(seq)  # a lookahead run's tokens: its request's draft (on_done)
        kept = plan.requests is None and self.plan is not None
        self.plan = replace(plan, requests=self.plan.requests) if kept else plan  # type: ignore[union-attr]

    def fill(self, engine: Any, speculator: Speculator | None) -> None:
        plan = self.plan
        if plan is not None and (plan.requests or self.bubble.seqs):  # an empty share still stops runs
            waiting = sum(not s.lookahead for s in engine.waiting)  # real requests without a slot
            requests = plan.requests or []
            self.bubble.fill_engine(
                engine, speculator, plan.first, plan.group_size, waiting, lambda: requests
            )

    def ended(self) -> list[Sequence]:
        """The runs that ended since the last call."""
        out = [s for _, s in self.bubble.seqs.values() if s.is_finished and s.seq_id not in self._sent]
        self._sent.update(s.seq_id for s in out)
        return out

    def stop(self, engine: Any) -> list[Sequence]:
        """The step's end: every run stopped; those not reported yet."""
        runs = [s for s in self.bubble.stop_engine(engine) if s.seq_id not in self._sent]
        self._sent, self.plan = set(), None
        return runs


class SynchronousRollout:
    """The baseline: admit `update_batch` prompts x `group_size` samples and wait for every one to finish.
    The slowest sample sets the step's length, which is where the bubbles come from."""

    name = "baseline"

    def __init__(self, lookahead: bool = False) -> None:
        """`lookahead`: the slots the step's last samples leave idle run the next step's requests
        (`BubbleFill`), whose tokens become their drafts."""
        self.bubble: BubbleFill | None = BubbleFill() if lookahead else None

    def collect(self, ctx: RolloutContext) -> list[Group]:
        groups = []
        for _ in range(ctx.update_batch):
            index, problem = ctx.stream.take()
            groups.append(
                Group(index, problem, [ctx.submit(index, problem, k) for k in range(ctx.group_size)])
            )
        if self.bubble is None:
            run_to_completion(ctx.engine)
        else:
            samples = [seq for group in groups for seq in group.samples]
            while not all(seq.is_finished for seq in samples):
                self.bubble.fill(ctx)
                ctx.engine.step()
            self.bubble.stop(ctx)
        for group in groups:
            for seq in group.samples:
                ctx.record(seq)
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
