"""A rollout run ahead of the update (modes `async`, `sorted+async`): the mode's strategy rolls out step t+k
beside step t's update, on the weights of step t, in a process of its own.

Two sides, one schedule:

- the rollout side (`serve`, in a spawned process, or a thread for tests) owns an engine (a `RolloutWorker`)
  and the strategy. It rolls out step j once the weights of version j - k are published, loads them into
  its engine between forwards (a `sync` phase of its own), runs the strategy's `collect` and sends the groups
  with the step's trace events and the strategy's and stream's state after it. So step j's samples come from
  exactly version j - k: a run is as reproducible as a synchronous one, and k = 0 is the synchronous schedule.
- the trainer side (`AheadRollout`) waits for step t's samples (`trainer_wait`), updates, and publishes the
  new weights into the ring (`ring.py`) as the step's `sync`. It mirrors the rollout side's state as of the
  last step it consumed, so a checkpoint holds what a resume restarts the rollout from.

The rollout side runs only inside the trainer's steps (`Gate`): the trainer lets it run when a step starts
(after the held-out evaluation) and holds it between forwards when the step ends, so a held-out
evaluation, a checkpoint or another mode's turn in an interleaved comparison never has it running beside
them. Its waits for weights (or, the same thing here, buffer room: k steps are produced and not yet consumed)
are `rollout_wait` phases, counted only while the gate is open; its rollout phase is one `rollout` event per
stretch the gate was open. Its phases carry `side: "rollout"`, so a step's time is the trainer's span.

Threads: on a CPU the two sides split the run's threads (`AheadRollout.threads`), so the comparison with a
synchronous mode is at the same budget; at k = 0 they never run at once and each takes them all.
"""

from __future__ import annotations

import copy
import functools
import multiprocessing
import os
import queue
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.errors import UserError
from reference_trainer.model.loader import resolve_device, resolve_dtype
from reference_trainer.rollout.base import Group, PromptStream, RolloutContext, RolloutStrategy
from reference_trainer.rollout.ring import WeightRing
from reference_trainer.rollout.workers import RolloutWorker, WorkerSpec
from reference_trainer.trace.schema import ROLLOUT, ROLLOUT_SIDE, ROLLOUT_WAIT, SYNC, TRAINER_WAIT
from reference_trainer.trace.writer import Trace

BACKENDS = ("process", "thread")
POLL_S = 1.0  # how often a waiting side checks that the other is still there


class Stopped(Exception):
    """The trainer closed the rollout side (or went away)."""


class _Flag:
    """A multiprocessing Value's `.value`, for the thread backend."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


class Gate:
    """Lets the rollout side run only inside the trainer's steps. `cond` also guards the weight ring's stamps,
    so one notification wakes a side waiting for either. `busy` is held by the rollout side around each
    forward (and weight load): `hold` returns once none is running, and none starts until `let_run`."""

    def __init__(self, backend: str) -> None:
        if backend == "process":
            mp = multiprocessing.get_context("spawn")
            self.cond: Any = mp.Condition()
            self.busy: Any = mp.Lock()
            self.open: Any = mp.Value("b", 0, lock=False)
            self.stop: Any = mp.Value("b", 0, lock=False)
            self.parent = os.getpid()
        else:
            self.cond, self.busy = threading.Condition(), threading.Lock()
            self.open, self.stop, self.parent = _Flag(), _Flag(), None

    # ---- the trainer's side --------------------------------------------------------------------------------
    def let_run(self) -> None:
        with self.cond:
            self.open.value = 1
            self.cond.notify_all()

    def hold(self, alive: Callable[[], bool]) -> None:
        """Close the gate and wait out a forward in progress: afterwards the rollout side is idle. A side
        that died inside a forward (holding `busy`) is not waited for."""
        with self.cond:
            self.open.value = 0
            self.cond.notify_all()
        while not self.busy.acquire(timeout=POLL_S):
            if not alive():
                return
        self.busy.release()

    def close(self) -> None:
        with self.cond:
            self.stop.value, self.open.value = 1, 1
            self.cond.notify_all()

    # ---- the rollout side --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise Stopped when the trainer closed the gate for good or its process is gone."""
        if self.stop.value or (self.parent is not None and os.getppid() != self.parent):
            raise Stopped

    def wait(self) -> None:
        """Block (with `cond` held) until something changes, checking the trainer is still there."""
        self.check()
        self.cond.wait(POLL_S)
        self.check()

    @contextmanager
    def forward(self, trace: Trace, spans: Spans | None = None) -> Iterator[None]:
        """Around one forward of the rollout side: wait while the gate is closed (closing the rollout
        phase's open stretch, if any, and opening a new one when it reopens), then hold `busy`."""
        paused = False
        while True:
            self.check()
            self.busy.acquire()
            if self.open.value:
                break
            self.busy.release()
            if spans is not None and not paused:
                spans.pause(trace.now())
            paused = True
            with self.cond:
                while not self.open.value:
                    self.wait()
        try:
            if paused and spans is not None:
                spans.resume(trace.now())
            yield
        finally:
            self.busy.release()


class Spans:
    """A step's rollout phase on the rollout side: one `rollout` event per stretch the gate was open."""

    def __init__(self, trace: Trace, version: int) -> None:
        self.trace, self.version = trace, version
        self.start: float | None = trace.now()

    def pause(self, now: float) -> None:
        if self.start is not None:
            self._add(self.start, now, {})
            self.start = None

    def resume(self, now: float) -> None:
        self.start = now

    def end(self, groups: int) -> None:
        now = self.trace.now()
        self._add(now if self.start is None else self.start, now, {"groups": groups})

    def _add(self, t_start: float, t_end: float, extra: dict[str, Any]) -> None:
        self.trace.add({"kind": ROLLOUT, "t_start": t_start, "t_end": t_end, "side": ROLLOUT_SIDE,
                        "policy_version": self.version, **extra})  # fmt: skip


class GatedEngine:
    """The rollout side's engine as its strategy sees it: every `step()` (one forward) passes the gate."""

    def __init__(self, engine: Any, gate: Gate) -> None:
        self._engine, self._gate = engine, gate
        self.spans: Spans | None = None

    def step(self) -> list[Any]:
        with self._gate.forward(self._engine.trace, self.spans):
            return self._engine.step()

    def __getattr__(self, name: str) -> Any:  # everything else is the engine's
        return getattr(self._engine, name)


@dataclass
class AheadSpec:
    """What the rollout side is built from (pickled into its process): the engine's worker spec, the strategy
    and prompt stream as of `start_step` (the trainer's mirrors), the rollout context's settings, k."""

    worker: WorkerSpec
    stream: PromptStream
    strategy: RolloutStrategy
    group_size: int
    update_batch: int
    params: SamplingParams
    seed: int
    max_staleness: int
    start_step: int
    t0: float

    def version_for(self, step: int) -> int:
        """The weights step `step` rolls out on: those of `step - k`."""
        return max(0, step - self.max_staleness)


@dataclass
class AheadBatch:
    """One step's rollout, sent to the trainer: its groups, its trace events (engine steps, sequences, the
    rollout side's phases), the recorded sequence events with their sequences (for grading), and the
    stream's and the strategy's state after it."""

    step: int
    groups: list[Group]
    events: list[dict[str, Any]]
    recorded: list[tuple[dict[str, Any], Any]]
    stream: dict[str, Any]
    strategy: dict[str, Any]


def serve(spec: AheadSpec, ring: WeightRing, gate: Gate, out: Any) -> None:
    """The rollout side's loop: every step from `spec.start_step` on, until the trainer closes it. Any
    error goes to the trainer as one message."""
    if hasattr(out, "cancel_join_thread"):
        out.cancel_join_thread()  # a trainer gone away must not keep this process flushing its queue
    try:
        _serve(spec, ring, gate, out)
    except Stopped:
        pass
    except BaseException:  # noqa: BLE001 - everything, to the trainer, which raises it
        out.put(("error", traceback.format_exc()))


def _serve(spec: AheadSpec, ring: WeightRing, gate: Gate, out: Any) -> None:
    version = spec.version_for(spec.start_step)
    with gate.cond:
        while not ring.holds(version):
            gate.wait()
    worker = RolloutWorker(spec.worker, ring.read(version), 0, spec.t0, version)
    worker.trace.step = spec.start_step
    worker.prepare(spec.params)  # before the first timed step, as the trainer's own engine would
    out.put(("ready", None))
    trace, engine = worker.trace, GatedEngine(worker.engine, gate)
    ctx = RolloutContext(engine, spec.worker.tokenizer, spec.stream, spec.group_size, spec.update_batch,  # type: ignore[arg-type]
                         spec.params, spec.seed, speculator=worker.speculator)  # fmt: skip
    step = spec.start_step
    while True:
        trace.step, version = step, spec.version_for(step)
        _wait_for(ring, gate, trace, version)
        if worker.engine.policy_version != version:
            with gate.forward(trace), trace.phase(SYNC, side=ROLLOUT_SIDE):
                ring.read_into(version, functools.partial(worker.engine.update_weights, version=version))
        with gate.forward(trace):  # the rollout starts inside a step of the trainer's
            engine.spans = Spans(trace, version)
        groups = spec.strategy.collect(ctx)
        engine.spans.end(len(groups))
        events, trace.events = trace.events, []
        batch = AheadBatch(step, groups, events, ctx.recorded, spec.stream.state_dict(),
                           spec.strategy.state_dict())  # fmt: skip
        ctx.recorded = []
        out.put(("batch", batch))
        step += 1


def _wait_for(ring: WeightRing, gate: Gate, trace: Trace, version: int) -> None:
    """Wait until `version` is published, tracing the waits while the gate is open as `rollout_wait`."""
    start: float | None = None
    with gate.cond:
        while not ring.holds(version):
            if gate.open.value and start is None:
                start = trace.now()
            elif not gate.open.value and start is not None:
                trace.add(
                    {"kind": ROLLOUT_WAIT, "t_start": start, "t_end": trace.now(), "side": ROLLOUT_SIDE}
                )
                start = None
            gate.wait()
    if start is not None:
        trace.add({"kind": ROLLOUT_WAIT, "t_start": start, "t_end": trace.now(), "side": ROLLOUT_SIDE})


def split_threads(budget: int, max_staleness: int, rollout: int | None = None) -> tuple[int, int]:
    """(rollout side's, trainer's) CPU threads within `budget`: at k = 0 the sides never run at once and
    each takes all; otherwise the rollout `rollout` (default half, at least 1) and the trainer the rest. A
    budget of 1 with the split left to auto gives each side the one thread: the two processes share the
    core, slower than two cores but a working run (`rlbench.training` says so before it starts). The one
    refusal is an asked rollout share that leaves the update nothing, with the two ways out."""
    if max_staleness == 0:
        return budget, budget
    if rollout is None:
        mine = max(1, budget // 2)
        return mine, max(1, budget - mine)
    if rollout >= budget:
        raise UserError(
            f"rollout_threads {rollout} leaves the update none of --threads {budget}: pass --threads "
            f"{rollout + 1}, or leave rollout_threads out to split {budget} automatically"
        )
    return rollout, budget - rollout


class AheadRollout:
    """The trainer's side of a rollout run ahead (see the module docstring), and the `RolloutEngine` the
    trainer sees: `update_weights` publishes a version, `policy_version` is the newest published."""

    def __init__(
        self,
        worker: WorkerSpec,
        weights: Mapping[str, torch.Tensor],
        strategy: RolloutStrategy,
        ctx: RolloutContext,
        trace: Trace,
        max_staleness: int,
        backend: str = "process",
    ) -> None:
        """`weights`: the policy's; `strategy` and `ctx.stream` are the trainer's mirrors of the rollout
        side's (their state as of the last consumed step: what a checkpoint saves)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.worker, self.strategy, self.ctx, self.trace = worker, strategy, ctx, trace
        self.max_staleness, self.backend = max_staleness, backend
        self.gate = Gate(backend)
        template = _inference_template(weights, worker.engine_config.device)
        self.ring = WeightRing(template, max_staleness + 1, self.gate.cond)
        self.policy_version = 0
        self.ring.publish(weights, 0)
        self._side: Any = None
        self._out: Any = None
        self._step: int | None = None
        self._finalizer = weakref.finalize(self, _shut, self.gate, self.ring, None)

    # ---- RolloutEngine -----------------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """Publish the next version (or `version`): the rollout of step version + k starts from it."""
        self.policy_version = self.policy_version + 1 if version is None else version
        self.ring.publish(state_dict, self.policy_version)

    def prepare(self, params: SamplingParams) -> None:
        """Nothing here: the rollout side prepares its engine when it starts (`launch`)."""

    def close(self) -> None:
        self._finalizer()

    # ---- the trainer's loop -------------------------------------------------------------------------------
    def launch(self, step: int) -> None:
        """Start the rollout side at `step` from the mirrors' state, and wait until its engine is prepared
        (outside any step's time)."""
        if self._side is not None:
            raise RuntimeError("the rollout side is running already")
        spec = AheadSpec(self.worker, self.ctx.stream, self.strategy, self.ctx.group_size,
                         self.ctx.update_batch, self.ctx.params, self.ctx.seed, self.max_staleness, step,
                         self.trace.t0)  # fmt: skip
        if self.backend == "process":
            mp = multiprocessing.get_context("spawn")
            self._out = mp.Queue()
            self._side = mp.Process(target=serve, args=(spec, self.ring, self.gate, self._out), daemon=True,
                                    name="rlbench-rollout")  # fmt: skip
        else:  # its own copies: the mirrors change only when a step is consumed
            spec.stream, spec.strategy = copy.deepcopy(spec.stream), copy.deepcopy(spec.strategy)
            self._out = queue.Queue()
            self._side = threading.Thread(target=serve, args=(spec, self.ring, self.gate, self._out),
                                          daemon=True, name="rlbench-rollout")  # fmt: skip
        self._side.start()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shut, self.gate, self.ring, self._side)
        kind, _ = self._receive()
        if kind != "ready":
            raise RuntimeError(f"the rollout side sent {kind!r} before it was ready")
        self._step = step

    def begin(self, step: int) -> None:
        """A step starts: let the rollout side run."""
        if self._step != step:
            raise RuntimeError(f"the rollout side is at step {self._step}, the trainer at {step}")
        self.gate.let_run()

    def collect(self) -> list[Group]:
        """The step's groups, as the rollout side sent them (waited for as `trainer_wait`); its events join
        the trace and the mirrors take its state."""
        with self.trace.phase(TRAINER_WAIT):
            kind, batch = self._receive()
        if kind != "batch" or batch.step != self._step:
            raise RuntimeError(
                f"expected step {self._step}'s rollout, got {kind} {getattr(batch, 'step', '')}"
            )
        self._check_staleness(batch)
        self.trace.events.extend(batch.events)
        self.ctx.stream.load_state_dict(batch.stream)
        self.strategy.load_state_dict(batch.strategy)
        self.ctx.recorded.extend(batch.recorded)
        self._step += 1
        return batch.groups

    def _check_staleness(self, batch: AheadBatch) -> None:
        """Refuse a sample older than the bound (a scheduling bug, never trained on)."""
        oldest = min((v for g in batch.groups for s in g.samples for v in s.policy_versions), default=None)
        if oldest is not None and self.policy_version - oldest > self.max_staleness:
            raise RuntimeError(
                f"step {batch.step}'s samples hold tokens of version {oldest}, more than "
                f"{self.max_staleness} behind the update's {self.policy_version}"
            )

    def end(self) -> None:
        """The step ended: hold the rollout side between forwards until the next one."""
        self.gate.hold(lambda: self._side is not None and self._side.is_alive())

    def take_recorded(self) -> list[tuple[dict[str, Any], Any]]:
        recorded, self.ctx.recorded = self.ctx.recorded, []
        return recorded

    # ---- checkpoints --------------------------------------------------------------------------------------
    def history(self) -> dict[int, dict[str, torch.Tensor]]:
        """The published versions the next k steps roll out on (all but the newest): a checkpoint keeps them
        so a resumed run rolls out those steps on the same weights."""
        low = self.policy_version - self.max_staleness
        return {v: self.ring.read(v) for v in self.ring.versions() if low <= v < self.policy_version}

    def restore(self, history: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        for version, weights in history.items():
            self.ring.publish(weights, version)

    # ---- the channel -------------------------------------------------------------------------------------
    def _receive(self) -> tuple[str, Any]:
        while True:
            try:
                kind, payload = self._out.get(timeout=POLL_S)
            except queue.Empty:
                if not self._side.is_alive():
                    code = getattr(self._side, "exitcode", None)
                    raise UserError(f"the rollout process died (exit code {code}) without a word") from None
                continue
            if kind == "error":
                raise RuntimeError(f"the rollout side failed:\n{payload}")
            return kind, payload


def _inference_template(weights: Mapping[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """Empty CPU tensors shaped like `weights`, in the inference dtype of `device` (bf16 on CUDA)."""
    dtype = resolve_dtype("auto", resolve_device(device))
    return {
        k: torch.empty(v.shape, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in weights.items()
    }


def _shut(gate: Gate, ring: WeightRing, side: Any) -> None:
    """Stop the rollout side (ending a process that does not stop within its poll) and remove the ring."""
    gate.close()
    if side is not None:
        side.join(timeout=5 * POLL_S)
        if side.is_alive() and hasattr(side, "terminate"):
            side.terminate()
            side.join(timeout=POLL_S)
    ring.close()
