"""The one place that decides which rollout engine runs: the reference engine (optionally with a Speculator
attached: HistoSpec, SuffixDecoding or lookahead drafts), vLLM's (engine/vllm_engine.py, optionally with its
n-gram/suffix drafting), or a pool of replicas of either on Ray or in-process (workers.py). A run
names its engine with one record, `RolloutEngineSpec`.

The trainer, eval's backends and `rlbench generate` all build their engine here. Checking a spec imports
neither vLLM nor torch (the CLI checks before loading any model).
"""

from __future__ import annotations

import copy
import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.protocol import RolloutEngine
from reference_trainer.engine.vllm_engine import INSTALL_HINT, VLLMEngine, vllm_available
from reference_trainer.errors import UserError
from reference_trainer.speculation.drafters import SpeculationOptions, VLLMSpecOptions, attach
from reference_trainer.trace.writer import Trace

if TYPE_CHECKING:
    from reference_trainer.rollout.slots import WorkerSlots
    from reference_trainer.speculation.speculator import Speculator

ROLLOUT_ENGINES = ("reference", "vllm")


def check_worker_backend(backend: str, workers: int) -> None:
    """A one-line UserError for an unknown worker backend, or Ray's install line when it is missing."""
    if backend not in ("ray", "local"):
        raise UserError(f"unknown worker backend {backend!r}; use ray or local")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise UserError(
            f"--workers {workers} runs rollout workers on Ray, which is not installed: "
            "pip install 'rlbench[ray]'"
        )


def check_engine_kind(kind: str, installed: bool = True) -> None:
    """A one-line UserError for an unknown engine kind, or (`installed`) vllm where vLLM is not installed."""
    if kind not in ROLLOUT_ENGINES:
        raise UserError(f"unknown engine {kind!r}; use {' or '.join(ROLLOUT_ENGINES)}")
    if installed and kind == "vllm" and not vllm_available():
        raise UserError(INSTALL_HINT)


@dataclass(frozen=True)
class RolloutEngineSpec:
    """Which rollout engine a run gets, and how it is set up: everything but the model, its tokenizer and
    the trace it records into."""

    kind: str = "reference"  # ROLLOUT_ENGINES
    config: EngineConfig = field(default_factory=EngineConfig)
    # The mode's speculation (ModeSpec.speculation_options: a SpeculationOptions on the reference engine, a
    # VLLMSpecOptions on vLLM); None: no drafts.
    speculation: SpeculationOptions | VLLMSpecOptions | None = None
    workers: int = 1  # > 1: a pool of engines of this kind (workers.py)
    worker_backend: str = "ray"  # ray | local
    ray_address: str | None = None
    seed: int = 0  # vLLM's engine seed
    # Run on a frozen copy of the model in the device's inference dtype (bf16 on CUDA), so a policy that
    # keeps training in fp32 is not the engine's.
    rollout_copy: bool = False

    def check(self) -> RolloutEngineSpec:
        """Self, or a one-line UserError: an unknown kind, a missing vLLM or Ray."""
        check_engine_kind(self.kind)
        if self.workers > 1:
            check_worker_backend(self.worker_backend, self.workers)
        return self


def build_rollout_engine(
    spec: RolloutEngineSpec,
    tokenizer: Any,
    *,
    model: Any = None,
    model_dir: str | Path | None = None,
    trace: Trace | None = None,
    slots: WorkerSlots | None = None,
) -> RolloutEngine:
    """The rollout engine `spec` names, recording into `trace` (a new one when None):

    - workers > 1: a worker pool (backend "ray", or "local" in-process) of engines of the spec's kind:
      reference engines over `model`'s architecture and weights, each with the speculation options'
      Speculator attached, or vLLM engines over `model_dir`. On Ray its actors run in `slots`
      (workers.WorkerSlots: places other runs' pools may share), their own when None.
    - vllm: a `VLLMEngine` over `model_dir`; the speculation options map onto vLLM's own speculative
      decoding (speculative_config).
    - reference: an `Engine` over `model`, with a Speculator attached (speculation/drafters.py `attach`)
      when the spec has speculation options.

    A pool or a vLLM engine needs `close()`.
    """
    spec.check()
    eos = tokenizer.eos_token_ids
    if spec.kind == "vllm" and model_dir is None:
        raise ValueError("the vllm engine loads a model directory: pass model_dir")
    if spec.kind == "reference" and model is None:
        raise ValueError("the reference engine runs a loaded model: pass model")
    trace = trace if trace is not None else Trace()
    if spec.workers > 1:
        return _worker_pool(spec, tokenizer, model, model_dir, trace, slots)
    if spec.kind == "vllm":
        return VLLMEngine(model_dir, spec.config, eos, tokenizer=tokenizer, trace=trace, seed=spec.seed,
                          speculative=asdict(spec.speculation) if spec.speculation else None)  # fmt: skip
    from reference_trainer.engine.engine import Engine
    from reference_trainer.model.loader import resolve_dtype

    if spec.rollout_copy:
        device = next(model.parameters()).device
        model = copy.deepcopy(model).requires_grad_(False).to(resolve_dtype("auto", device))
    engine = Engine(model, spec.config, eos, tokenizer=tokenizer, trace=trace)
    if spec.speculation is not None:
        attach(engine, spec.speculation)
    return engine


def _worker_pool(
    spec: RolloutEngineSpec,
    tokenizer: Any,
    model: Any,
    model_dir: str | Path | None,
    trace: Trace,
    slots: WorkerSlots | None,
) -> RolloutEngine:
    """`spec.workers` replicas of the spec's engine kind (workers.py), the cores split between them. vLLM
    replicas load `model_dir` themselves: no weights are shipped to them."""
    from reference_trainer.rollout.workers import WorkerSpec, make_worker_pool

    worker = WorkerSpec(
        model.config if model is not None else None,
        spec.config,
        sorted(tokenizer.eos_token_ids),
        tokenizer,
        spec.speculation,
        threads=max(1, (os.cpu_count() or 1) // spec.workers),
        engine=spec.kind,
        model_dir=str(model_dir) if model_dir is not None else None,
        seed=spec.seed,
    )
    weights = model.state_dict() if spec.kind == "reference" else {}
    return make_worker_pool(
        worker, weights, spec.workers, trace, spec.worker_backend, spec.ray_address, slots
    )


def speculator_of(engine: RolloutEngine) -> Speculator | None:
    """The Speculator hooked into a reference engine, if any (a lookahead strategy's cost gate)."""
    from reference_trainer.engine.engine import Engine
    from reference_trainer.speculation.speculator import Speculator

    if isinstance(engine, Engine) and isinstance(engine.speculation, Speculator):
        return engine.speculation
    return None
