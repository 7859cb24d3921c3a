"""Rollout workers: engine replicas that a driver feeds requests and steps in short time slices.

A `RolloutWorker` wraps one engine and knows nothing of RL: the reference `Engine` over the trainer's
weights, or a `VLLMEngine` over the model directory (`WorkerSpec.engine`); both offer the same request
surface, so one worker loop serves both. A pool runs W of them: `RayWorkerPool` as Ray actors in the places
of a `WorkerSlots` (slots.py: a local Ray or an existing cluster; places other runs' pools may share),
`LocalWorkerPool` in-process one after another (for tests and debugging; its timings are not parallel).
The driver (placed.py) places requests, advances every worker a slice at a time, gathers finished sequences
and trace events (each tagged with its worker id), and may move not-yet-started requests from a busy worker
to an idle one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.protocol import RequestEngine, RolloutEngine
from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.engine.vllm_engine import VLLMEngine  # imports vLLM only when one is built
from reference_trainer.model.config import ModelConfig
from reference_trainer.rollout.base import EngineFill, Lookahead
from reference_trainer.rollout.slots import WorkerPoolError, WorkerSlots
from reference_trainer.speculation.drafters import SpeculationOptions, VLLMSpecOptions, attach
from reference_trainer.trace.writer import Trace


@dataclass
class WorkerReport:
    """What one slice of work produced: finished sequences, new trace events, and what is left."""

    worker: int
    finished: list[Sequence]
    events: list[dict[str, Any]]
    waiting: list[str]  # ids of requests not yet admitted, in admission order
    running: int
    lost: bool = False  # the worker died (its actor is gone): nothing it held comes back
    # Lookahead on W engines (base.EngineFill): runs ended since the last report; dry: it ran out of all work.
    ahead: list[Sequence] = field(default_factory=list)
    dry: bool = False


class WorkerLost(WorkerPoolError):
    """A rollout worker died mid-call (a Ray actor killed, a node gone): the pool reports it as a `lost`
    report and the controller (multi.py) finishes the step on the other workers."""

    def __init__(self, worker: int, why: str = "") -> None:
        super().__init__(f"rollout worker {worker} was lost{': ' + why if why else ''}")
        self.worker = worker


@dataclass
class WorkerSpec:
    """How to build each worker's engine: the model's architecture and weights, engine settings, and the
    mode's speculation options when it drafts (None otherwise). `engine` "vllm": each worker runs vLLM over
    `model_dir` (with vLLM's own drafting for a VLLMSpecOptions), as the one-engine vLLM run does."""

    model_config: ModelConfig | None  # None: vLLM reads it from model_dir
    engine_config: EngineConfig
    eos_token_ids: list[int]
    tokenizer: Any = None
    speculation: SpeculationOptions | VLLMSpecOptions | None = None  # attach's record, or vLLM's
    threads: int = 1
    engine: str = "reference"  # or "vllm" (rollout/engines.py ROLLOUT_ENGINES)
    model_dir: str | None = None  # what vLLM loads
    seed: int = 0  # vLLM's engine seed

    @property
    def drafts(self) -> bool:
        """Whether each worker has a Speculator (vLLM's drafting reads only its own requests)."""
        return self.speculation is not None and self.engine == "reference"

    @property
    def keeps_history(self) -> bool:
        """Whether workers share responses as history: not for the lookahead drafter alone (as on one)."""
        return self.drafts and getattr(self.speculation, "drafter", None) != "lookahead"


def _build_engine(spec: WorkerSpec, state_dict: Mapping[str, torch.Tensor], trace: Trace) -> RequestEngine:
    """A worker's engine. vLLM starts from the model directory's weights, as the one-engine vLLM run does
    (the trainer's weights reach it through update_weights); the reference engine from `state_dict`."""
    if spec.engine == "vllm":
        if spec.model_dir is None:
            raise ValueError("a vLLM rollout worker loads a model directory: set WorkerSpec.model_dir")
        speculative = asdict(spec.speculation) if spec.speculation is not None else None
        return VLLMEngine(spec.model_dir, spec.engine_config, spec.eos_token_ids, spec.tokenizer, trace,
                          seed=spec.seed, speculative=speculative)  # fmt: skip
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import resolve_device, resolve_dtype

    device = resolve_device(spec.engine_config.device)
    if spec.model_config is None:
        raise ValueError("a reference rollout worker builds its model: set WorkerSpec.model_config")
    model = DecoderLM(spec.model_config)
    model.load_state_dict(dict(state_dict), strict=False)
    model = model.to(device=device, dtype=resolve_dtype("auto", device))
    return Engine(model, spec.engine_config, spec.eos_token_ids, spec.tokenizer, trace)


class RolloutWorker:
    def __init__(
        self, spec: WorkerSpec, state_dict: Mapping[str, torch.Tensor], worker: int, t0: float, version: int
    ) -> None:
        torch.set_num_threads(spec.threads)
        self.worker = worker
        self.trace = Trace(worker=worker, t0=t0)
        self.engine = _build_engine(spec, state_dict, self.trace)
        self.engine.policy_version = version
        # spec.drafts: a reference Engine and a SpeculationOptions (vLLM drafts inside its own engine)
        self.speculator = attach(self.engine, spec.speculation) if spec.drafts else None  # type: ignore[arg-type]
        self._queued: dict[str, Sequence] = {}
        self.ahead = EngineFill()  # lookahead on W engines, when the controller hands it a plan

    def submit(self, requests: list[Request]) -> None:
        for r in requests:
            seq = self.engine.add_request(r)
            self._queued[seq.seq_id] = seq

    def advance(
        self, step: int, budget_s: float, max_steps: int | None = None, plan: Lookahead | None = None
    ) -> WorkerReport:
        """Engine steps (each after a lookahead `plan`'s fill) until `budget_s`, `max_steps` or no work."""
        self.trace.step = step
        if plan is not None:
            self.ahead.take(plan, self.speculator)
        deadline = time.perf_counter() + budget_s
        finished: list[Sequence] = []
        taken, dry = 0, False
        while time.perf_counter() < deadline and (max_steps is None or taken < max_steps):
            self.ahead.fill(self.engine, self.speculator)
            if dry := not self.engine.has_unfinished():
                break
            finished.extend(s for s in self.engine.step() if not s.lookahead)  # runs ahead: `ended`
            taken += 1
        for seq in finished:
            self._queued.pop(seq.seq_id, None)
        events, self.trace.events = self.trace.events, []
        # Real requests only: a lookahead run gives its slot up to any of them.
        waiting = [s.seq_id for s in self.engine.waiting if not s.lookahead]
        running = sum(not s.lookahead for s in self.engine.running)
        ahead = self.ahead.ended()
        return WorkerReport(self.worker, finished, events, waiting, running, ahead=ahead, dry=dry)

    def abort_all(self) -> WorkerReport:
        """Stop every request this worker holds: a report whose `finished` lists them aborted, with their
        tokens, log-probs and policy versions so far, and whose `waiting` names those that had no slot;
        its lookahead runs are stopped too (`ahead`)."""
        waiting = [s.seq_id for s in self.engine.waiting if not s.lookahead]
        held, self._queued = list(self._queued.values()), {}
        for seq in held:
            self.engine.abort(seq)
        ahead = self.ahead.ended() + self.ahead.stop(self.engine)
        events, self.trace.events = self.trace.events, []
        return WorkerReport(self.worker, held, events, waiting, 0, ahead=ahead)

    def take_unstarted(self, seq_ids: list[str]) -> list[Request]:
        """Withdraw requests that have not been admitted yet (the rest are left alone)."""
        waiting = {s.seq_id for s in self.engine.waiting}
        taken = []
        for seq_id in seq_ids:
            seq = self._queued.get(seq_id)
            if seq is None or seq_id not in waiting:
                continue
            self.engine.abort(seq)
            del self._queued[seq_id]
            taken.append(seq.request())
        return taken

    def add_history(self, responses: list[tuple[list[int], list[int]]], epoch: int) -> None:
        """Responses other workers generated, as drafts for prompts that move between workers."""
        if self.speculator is not None:
            for prompt_ids, response_ids in responses:
                self.speculator.add_history(prompt_ids, response_ids, epoch)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(state_dict, version=version)

    def prepare(self, params: SamplingParams) -> None:
        self.engine.prepare(params)

    def ready(self) -> int:
        return self.worker

    def close(self) -> None:
        self.engine.close()


class WorkerPool(RolloutEngine, Protocol):
    """W engine replicas behind the `RolloutEngine` the trainer sees (trace, policy_version,
    update_weights, close), driven by PlacedRollout (placed.py) through the methods below."""

    size: int
    capacity: int  # slots per worker
    drafts: bool  # workers draft (a Speculator each): finished responses are shared as history
    trace: Trace  # the driver's trace: phases, sequences, and every worker's engine events

    def submit(self, worker: int, requests: list[Request]) -> None: ...

    # Start a slice (with a lookahead plan: base.EngineFill); its report comes from next_report.
    def advance(self, worker: int, step: int, plan: Lookahead | None = None) -> None: ...

    def next_report(self) -> WorkerReport: ...

    def take_unstarted(self, worker: int, seq_ids: list[str]) -> list[Request]: ...

    def add_history(self, worker: int, responses: list[tuple[list[int], list[int]]]) -> None: ...

    def halt(self, workers: list[int]) -> list[WorkerReport]: ...  # every slice in flight, then abort_all

    def retire(self, worker: int) -> None: ...  # a lost worker: no call goes to it again


def _inference_state(state_dict: Mapping[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    from reference_trainer.model.loader import resolve_device, resolve_dtype

    dtype = resolve_dtype("auto", resolve_device(device))
    return {k: v.detach().to("cpu", dtype=dtype) for k, v in state_dict.items()}


class LocalWorkerPool:
    """W workers in this process, advanced one after another: same logic as Ray, no parallelism. Slices are
    a fixed number of engine steps (not a time budget), so what happens is deterministic."""

    def __init__(
        self,
        spec: WorkerSpec,
        state_dict: Mapping[str, torch.Tensor],
        workers: int,
        trace: Trace,
        slice_steps: int = 4,
    ) -> None:
        self.size, self.capacity, self.trace = workers, spec.engine_config.max_num_seqs, trace
        self.drafts, self.slice_steps = spec.keeps_history, slice_steps
        self.policy_version = 0
        self.workers = [RolloutWorker(spec, state_dict, w, trace.t0, 0) for w in range(workers)]
        self.retired: set[int] = set()
        self.dead: list[int] = []  # (Ray's: workers found dead outside a slice; in-process ones never are)
        self._pending: list[tuple[int, int, Lookahead | None]] = []

    def submit(self, worker: int, requests: list[Request]) -> None:
        self.workers[worker].submit(requests)

    def advance(self, worker: int, step: int, plan: Lookahead | None = None) -> None:
        self._pending.append((worker, step, plan))

    def next_report(self) -> WorkerReport:
        worker, step, plan = self._pending.pop(0)
        try:
            return self.workers[worker].advance(step, float("inf"), self.slice_steps, plan)
        except WorkerLost:  # a test's injected failure: what a dead Ray actor reports
            return WorkerReport(worker, [], [], [], 0, lost=True)

    def halt(self, workers: list[int]) -> list[WorkerReport]:
        reports = [self.next_report() for _ in range(len(self._pending))]
        return reports + [self.workers[w].abort_all() for w in workers]

    def retire(self, worker: int) -> None:
        self.retired.add(worker)

    def take_unstarted(self, worker: int, seq_ids: list[str]) -> list[Request]:
        return self.workers[worker].take_unstarted(seq_ids)

    def add_history(self, worker: int, responses: list[tuple[list[int], list[int]]]) -> None:
        self.workers[worker].add_history(responses, self.policy_version)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.policy_version = self.policy_version + 1 if version is None else version
        for w in self._live():
            w.update_weights(state_dict, self.policy_version)

    def prepare(self, params: SamplingParams) -> None:
        for w in self._live():
            w.prepare(params)

    def _live(self) -> list[RolloutWorker]:
        return [w for i, w in enumerate(self.workers) if i not in self.retired]

    def close(self) -> None:
        for w in self.workers:
            w.close()  # a vLLM engine frees its KV cache and engine core
        self.workers = []


class RayWorkerPool:
    """W `RolloutWorker` actors, worker w in place w of `slots` (its own slots when None: one CPU, or one
    GPU with device cuda, each); weights go out through Ray's object store once per update and every actor
    copies them in place. Every wait on the actors has a deadline (`slots.deadlines`) that ends in one
    line."""

    def __init__(
        self,
        spec: WorkerSpec,
        state_dict: Mapping[str, torch.Tensor],
        workers: int,
        trace: Trace,
        address: str | None = None,
        budget_s: float = 0.05,
        slots: WorkerSlots | None = None,
    ) -> None:
        import ray

        self.device = spec.engine_config.device
        gpu = self.device.startswith("cuda")
        self._own = slots is None
        self.slots = slots if slots is not None else WorkerSlots(workers, gpu, 1, address)
        if self.slots.workers < workers or self.slots.gpu != gpu:
            raise ValueError(f"{workers} {'GPU' if gpu else 'CPU'} workers do not fit slots of "
                             f"{self.slots.workers} {self.slots.unit}s")  # fmt: skip
        self._ray, self.deadlines = ray, self.slots.deadlines
        self.size, self.trace, self.budget_s = workers, trace, budget_s
        self.capacity = spec.engine_config.max_num_seqs
        self.policy_version = 0
        self.drafts = spec.keeps_history
        actor = ray.remote(RolloutWorker)
        weights = ray.put(_inference_state(state_dict, spec.engine_config.device))
        # Actors are on the same clock as the driver (perf_counter is system-wide on Linux): traces align.
        self.actors = [
            actor.options(**self.slots.actor_options(w)).remote(spec, weights, w, trace.t0, 0)
            for w in range(workers)
        ]
        self.retired: set[int] = set()
        self.dead: list[int] = []  # workers found dead outside a slice (a weight update): retired, to report
        self._inflight: dict[Any, int] = {}
        # Wait for every actor to be built, so start-up is not billed to the first rollout.
        try:
            self._get([a.ready.remote() for a in self.actors], "start", self.deadlines.start_s)
        except BaseException:
            self.close()
            raise

    def _get(self, refs: Any, what: str, timeout: float | None = None, raw_errors: bool = False) -> Any:
        """`ray.get(refs)` within a deadline; a timeout or a dead actor is one line (`raw_errors`: a dead
        actor's RayActorError as it is, for a caller that carries on without it)."""
        from ray.exceptions import GetTimeoutError, RayActorError

        timeout = self.deadlines.call_s if timeout is None else timeout
        try:
            return self._ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise WorkerPoolError(self._late(what, timeout)) from None
        except RayActorError as err:
            if raw_errors:
                raise
            cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WorkerPoolError(f"a rollout worker died ({what}): {cause}") from None

    def _late(self, what: str, timeout: float) -> str:
        return (
            f"the {self.size} Ray rollout workers did not {what} within {timeout:g} s: a loaded machine may "
            "need longer (RLBENCH_RAY_TIMEOUT_S, seconds); a hung or dead worker shows in Ray's logs"
        )

    def _one(self, worker: int, ref: Any, what: str) -> Any:
        """One worker's call; a dead actor is a WorkerLost naming it."""
        from ray.exceptions import RayActorError

        try:
            return self._get(ref, what, raw_errors=True)
        except RayActorError as err:
            raise WorkerLost(worker, str(err).strip().splitlines()[0] if str(err).strip() else "") from None

    def _each(self, call: Any, what: str) -> None:
        """`call(actor)` on every live worker, gathered; a dead one is retired and listed in `dead` (for
        the controller to dispatch its work elsewhere), unless none is left."""
        refs = {w: call(a) for w, a in enumerate(self.actors) if w not in self.retired}
        for w, ref in refs.items():
            try:
                self._one(w, ref, what)
            except WorkerLost:
                self.dead.append(w)
                self.retired.add(w)
        if len(self.retired) == self.size:
            raise WorkerPoolError(f"every one of the {self.size} Ray rollout workers died ({what})")

    def submit(self, worker: int, requests: list[Request]) -> None:
        self._one(worker, self.actors[worker].submit.remote(requests), "take requests")

    def advance(self, worker: int, step: int, plan: Lookahead | None = None) -> None:
        self._inflight[self.actors[worker].advance.remote(step, self.budget_s, None, plan)] = worker

    def next_report(self) -> WorkerReport:
        timeout = self.deadlines.call_s
        ready, _ = self._ray.wait(list(self._inflight), num_returns=1, timeout=timeout)
        if not ready:
            raise WorkerPoolError(self._late("report a slice of engine steps", timeout))
        return self._report(ready[0], self._inflight.pop(ready[0]))

    def _report(self, ref: Any, worker: int) -> WorkerReport:
        """A slice's (or an abort's) report; a dead actor's is a `lost` one, for the controller to act on."""
        from ray.exceptions import RayActorError

        try:
            return self._get(ref, "report a slice of engine steps", raw_errors=True)
        except RayActorError:
            return WorkerReport(worker, [], [], [], 0, lost=True)

    def halt(self, workers: list[int]) -> list[WorkerReport]:
        """Every slice in flight and an abort of every request on `workers`, gathered in one round trip
        (an actor runs its calls in order: its abort comes after its slice)."""
        refs = list(self._inflight.items()) + [(self.actors[w].abort_all.remote(), w) for w in workers]
        self._inflight = {}
        self._ray.wait([r for r, _ in refs], num_returns=len(refs), timeout=self.deadlines.call_s)
        return [self._report(ref, w) for ref, w in refs]

    def retire(self, worker: int) -> None:
        self.retired.add(worker)

    def take_unstarted(self, worker: int, seq_ids: list[str]) -> list[Request]:
        return self._one(worker, self.actors[worker].take_unstarted.remote(seq_ids), "give back requests")

    def add_history(self, worker: int, responses: list[tuple[list[int], list[int]]]) -> None:
        self._one(
            worker, self.actors[worker].add_history.remote(responses, self.policy_version), "take drafts"
        )

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.policy_version = self.policy_version + 1 if version is None else version
        weights = self._ray.put(_inference_state(state_dict, self.device))
        self._each(lambda a: a.update_weights.remote(weights, self.policy_version), "load weights")

    def prepare(self, params: SamplingParams) -> None:
        self._each(lambda a: a.prepare.remote(params), "prepare")

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
        if self._own:
            self.slots.close()


def make_worker_pool(
    spec: WorkerSpec,
    state_dict: Mapping[str, torch.Tensor],
    workers: int,
    trace: Trace,
    backend: str = "ray",
    address: str | None = None,
    slots: WorkerSlots | None = None,
) -> WorkerPool:
    """W workers on `backend`: in-process ("local"), or Ray actors in `slots` (their own when None)."""
    if backend == "local":
        return LocalWorkerPool(spec, _inference_state(state_dict, spec.engine_config.device), workers, trace)
    return RayWorkerPool(spec, state_dict, workers, trace, address=address, slots=slots)
