"""A rollout run ahead of the update (modes `async`, `sorted+async`): the mode's strategy rolls out step t+k
beside step t's update, on the weights of step t, in a process of its own.

Two sides, one schedule:

- the rollout side (`serve`, in a spawned process, or a thread for tests) owns an engine (a `RolloutWorker`'s,
  or W replicas under one controller, rollout/multi.py) and the strategy. It rolls out step j once the
  weights of version j - k are published, loads them into every engine between forwards (a `sync` phase of
  its own), runs the strategy's `collect` and sends the groups with the step's trace events and the
  strategy's and stream's state after it. So step j's samples come from exactly version j - k: a run is as
  reproducible as a synchronous one, and k = 0 is the synchronous schedule.
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
import signal
import threading
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.errors import UserError
from reference_trainer.model.loader import resolve_device, resolve_dtype
from reference_trainer.rollout.base import AheadOptions, Group, PromptStream, RolloutContext, RolloutStrategy
from reference_trainer.rollout.gate import POLL_S, Gate, Inbox, Outbox, RolloutDied, Stopped, death_line
from reference_trainer.rollout.multi import Engines, build_side
from reference_trainer.rollout.placement import LengthHistory
from reference_trainer.rollout.ring import WeightRing, check_history
from reference_trainer.rollout.slots import RAY_DIR, end_local_ray, own_ray_dir
from reference_trainer.rollout.workers import WorkerSpec
from reference_trainer.trace.schema import ROLLOUT, ROLLOUT_SIDE, ROLLOUT_WAIT, SYNC, TRAINER_WAIT
from reference_trainer.trace.writer import Trace


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
        self.trace.add_phase(ROLLOUT, t_start, t_end, side=ROLLOUT_SIDE, policy_version=self.version, **extra)


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
    engines: Engines = Engines()  # W > 1: replicas under one controller (rollout/multi.py)
    dispatch: dict[str, Any] | None = None  # that controller's state to start from (a resume's)
    ray_dir: str | None = None  # the folder its local Ray starts in, made by the trainer (slots.own_ray_dir)

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
    dispatch: dict[str, Any] | None = None  # W > 1: the controller's state after it (rollout/multi.py)


def serve(spec: AheadSpec, ring: WeightRing, gate: Gate, out: Any) -> None:
    """The rollout side's loop: every step from `spec.start_step` on, until the trainer closes it. Any
    error goes to the trainer as one message. `out`: a queue (thread backend) or a pipe's end."""
    if not isinstance(out, queue.Queue):
        out = Outbox(out)
    try:
        _serve(spec, ring, gate, out)
    except Stopped:
        pass
    except UserError as err:  # one line on the trainer's side too (a cut ring): raised there as it is
        out.put(("refused", err))
        if isinstance(out, Outbox):
            out.flush()
    except BaseException:  # noqa: BLE001 - everything, to the trainer, which raises it
        out.put(("error", traceback.format_exc()))
        if isinstance(out, Outbox):
            out.flush()


def _serve(spec: AheadSpec, ring: WeightRing, gate: Gate, out: Any) -> None:
    version = spec.version_for(spec.start_step)
    with gate.cond:
        while not ring.holds(version):
            gate.wait()
    if spec.ray_dir:  # inherited by the processes of the Ray it starts: the trainer finds them by it
        os.environ[RAY_DIR] = spec.ray_dir
    own, speculator, trace = build_side(spec.worker, ring.read(version), version, spec.t0, spec.engines)
    if spec.dispatch and spec.engines.workers > 1:  # what the controller learnt up to the step before
        own.load_dispatch_state(spec.dispatch)
    try:
        trace.step = spec.start_step
        own.prepare(spec.params)  # before the first timed step, as the trainer's own engine would
        out.put(("ready", None))
        _loop(spec, ring, gate, out, own, GatedEngine(own, gate), speculator, trace)
    finally:
        if spec.engines.workers > 1:  # the replicas (Ray actors) end with the rollout side
            own.close()


def _loop(spec: AheadSpec, ring: WeightRing, gate: Gate, out: Any, own: Any, engine: GatedEngine,
          speculator: Any, trace: Trace) -> None:  # fmt: skip
    """Every step's rollout: `own` is the engine (or W engines' controller), `engine` it behind the gate.
    Every engine loads each version's weights once, stamped with that version."""
    ctx = RolloutContext(engine, spec.worker.tokenizer, spec.stream, spec.group_size, spec.update_batch,  # type: ignore[arg-type]
                         spec.params, spec.seed, speculator=speculator)  # fmt: skip
    step = spec.start_step
    while True:
        trace.step, version = step, spec.version_for(step)
        _wait_for(ring, gate, trace, version)
        if own.policy_version != version:
            with gate.forward(trace), trace.phase(SYNC, side=ROLLOUT_SIDE):
                ring.read_into(version, functools.partial(own.update_weights, version=version))
        with gate.forward(trace):  # the rollout starts inside a step of the trainer's
            engine.spans = Spans(trace, version)
        groups = spec.strategy.collect(ctx)
        engine.spans.end(len(groups))
        events, trace.events = trace.events, []
        dispatch = own.dispatch_state() if spec.engines.workers > 1 else None  # the controller's (multi.py)
        batch = AheadBatch(step, groups, events, ctx.recorded, spec.stream.state_dict(),
                           spec.strategy.state_dict(), dispatch)  # fmt: skip
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
                trace.add_phase(ROLLOUT_WAIT, start, trace.now(), side=ROLLOUT_SIDE)
                start = None
            gate.wait()
    if start is not None:
        trace.add_phase(ROLLOUT_WAIT, start, trace.now(), side=ROLLOUT_SIDE)


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
        options: AheadOptions,
        engines: Engines | None = None,
    ) -> None:
        """`weights`: the policy's; `strategy` and `ctx.stream` are the trainer's mirrors of the rollout
        side's (their state as of the last consumed step: what a checkpoint saves); `engines`: the rollout
        side's (one, by default)."""
        self.worker, self.strategy, self.ctx, self.trace = worker, strategy, ctx, trace
        self.engines = engines or Engines()
        self.max_staleness, self.backend = options.max_staleness, options.backend
        self.gate = Gate(self.backend)
        template = _inference_template(weights, worker.engine_config.device)
        self.ring = WeightRing(template, self.max_staleness + 1, self.gate.cond)
        self.policy_version = 0
        self.ring.publish(weights, 0)
        self.dispatch: dict[str, Any] | None = None  # W engines' controller's, as of the last step consumed
        self._side: Any = None
        self._out: Any = None
        self._step: int | None = None
        self._sigterm = _on_sigterm()
        self._finalizer = weakref.finalize(self, _shut, self.gate, self.ring, None, self._sigterm)

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
        e = self.engines  # a local Ray its process starts is this process's to remove, however that one ends
        ray_dir = own_ray_dir(e.workers, e.backend, e.address) if self.backend == "process" else None
        spec = AheadSpec(self.worker, self.ctx.stream, self.strategy, self.ctx.group_size,
                         self.ctx.update_batch, self.ctx.params, self.ctx.seed, self.max_staleness, step,
                         self.trace.t0, e, self.dispatch, ray_dir)  # fmt: skip
        self._watch = Watch()
        if self.backend == "process":
            mp = multiprocessing.get_context("spawn")
            source, sink = mp.Pipe(duplex=False)
            self._side = mp.Process(target=serve, args=(spec, self.ring, self.gate, sink), daemon=True,
                                    name="rlbench-rollout")  # fmt: skip
        else:  # its own copies: the mirrors change only when a step is consumed
            spec.stream, spec.strategy = copy.deepcopy(spec.stream), copy.deepcopy(spec.strategy)
            source = sink = queue.Queue()
            self._side = threading.Thread(target=serve, args=(spec, self.ring, self.gate, sink),
                                          daemon=True, name="rlbench-rollout")  # fmt: skip
        self._side.start()
        if sink is not source:
            sink.close()  # the child's copy is the only writer left: its death is an end of file here
        self._watch.side = self._side
        self.gate.cond.check = self._watch  # a side gone while the trainer waits for the stamps' lock
        self._out = Inbox(source, self._watch)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _shut, self.gate, self.ring, self._side, self._sigterm, ray_dir
        )
        kind, _ = self._receive()
        if kind != "ready":
            raise RuntimeError(f"the rollout side sent {kind!r} before it was ready")
        self._step = self._watch.step = step

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
        self.dispatch = batch.dispatch
        self.ctx.recorded.extend(batch.recorded)
        self._step += 1
        self._watch.step = self._step
        return batch.groups

    def _check_staleness(self, batch: AheadBatch) -> None:
        """Refuse a sample older than the bound (a scheduling bug, never trained on), per engine: each
        sample's tokens carry the versions of the engine that wrote them."""
        for s in (s for g in batch.groups for s in g.samples if s.policy_versions):
            oldest = min(s.policy_versions)
            if self.policy_version - oldest > self.max_staleness:
                engine = f" (engine {s.meta['worker']})" if "worker" in s.meta else ""
                raise RuntimeError(
                    f"step {batch.step}'s samples hold tokens of version {oldest}{engine}, more than "
                    f"{self.max_staleness} behind the update's {self.policy_version}"
                )

    def end(self) -> None:
        """The step ended: hold the rollout side between forwards until the next one."""
        self.gate.hold(lambda: self._side is not None and self._side.is_alive())

    def take_recorded(self) -> list[tuple[dict[str, Any], Any]]:
        recorded, self.ctx.recorded = self.ctx.recorded, []
        return recorded

    # ---- checkpoints --------------------------------------------------------------------------------------
    def dispatch_state(self) -> dict[str, Any] | None:
        """The rollout side's controller's state (W > 1, else None): checkpointed as the inline one's."""
        return self.dispatch

    def load_dispatch_state(self, state: Mapping[str, Any]) -> None:
        # Read as the controller will read it: a damaged one fails here, in the checkpoint's one line.
        LengthHistory().load_state_dict(dict(state["history"]))
        self.dispatch = dict(state)  # the rollout side starts from it (`launch`)

    def history(self) -> dict[int, dict[str, torch.Tensor]]:
        """The published versions the next k steps roll out on (all but the newest): a checkpoint keeps them
        so a resumed run rolls out those steps on the same weights."""
        low = self.policy_version - self.max_staleness
        return {v: self.ring.read(v) for v in self.ring.versions() if low <= v < self.policy_version}

    def restore(self, history: Mapping[int, Mapping[str, torch.Tensor]], step: int, where: str = "") -> None:
        """Publish the older versions steps `step`.. roll out on, from a checkpoint of step `step` (call after
        `update_weights` published its own version). A checkpoint that cannot give them (another run's
        history, one kept for a smaller max_staleness, an edited policy_version) is one line, never a
        rollout side waiting for a version that will not come; versions a smaller max_staleness no longer
        needs are left out."""
        need = check_history(history, self.ring.layout, self.policy_version, step, self.max_staleness, where)
        for version in need:
            self.ring.publish(history[version], version)

    # ---- the channel -------------------------------------------------------------------------------------
    def _receive(self) -> tuple[str, Any]:
        kind, payload = self._out.get()
        if kind == "refused":
            raise payload
        if kind == "error":
            raise RuntimeError(f"the rollout side failed:\n{payload}")
        return kind, payload


class Watch:
    """The trainer's check that the rollout side is still there (called at every wait's deadline): one line
    naming what ended it and at which step. Holds the side, not the AheadRollout, so no cycle keeps that
    alive past its last use."""

    def __init__(self) -> None:
        self.side: Any = None
        self.step: int | None = None

    def __call__(self) -> None:
        if self.side is not None and not self.side.is_alive():
            raise RolloutDied(death_line(getattr(self.side, "exitcode", None), self.step))


def _inference_template(weights: Mapping[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """Empty CPU tensors shaped like `weights`, in the inference dtype of `device` (bf16 on CUDA)."""
    dtype = resolve_dtype("auto", resolve_device(device))
    return {
        k: torch.empty(v.shape, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in weights.items()
    }


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the run keeps what finished and the ring is removed


def _on_sigterm() -> Any:
    """Turn SIGTERM into the unwinding of Ctrl-C while a ring exists (a killed process would leave k + 1
    copies of the weights in /dev/shm); returns the handler to put back, or None where none was set."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # someone else's handler: theirs to run
    signal.signal(signal.SIGTERM, _terminated)
    return signal.SIG_DFL


def _shut(gate: Gate, ring: WeightRing, side: Any, previous: Any = None, ray_dir: str | None = None) -> None:
    """Stop the rollout side (ending a process that does not stop within its poll) and remove the ring."""
    gate.close()
    if side is not None:
        side.join(timeout=5 * POLL_S)
        if side.is_alive() and hasattr(side, "terminate"):
            side.terminate()
            side.join(timeout=POLL_S)
    ring.close()
    end_local_ray(ray_dir)  # the side's local Ray, if it started one: its processes and folder
    main = threading.current_thread() is threading.main_thread()
    if previous is not None and main and signal.getsignal(signal.SIGTERM) is _terminated:
        signal.signal(signal.SIGTERM, previous)
