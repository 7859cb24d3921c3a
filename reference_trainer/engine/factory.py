"""The one place that decides which rollout engine runs: the reference engine (optionally with HistoSpec
attached), vLLM's (vllm_engine.py, optionally with its n-gram/suffix drafting), or a pool of reference
engine replicas on Ray or in-process (rollout/workers.py).

The trainer, eval's backends and `rlbench generate` all build their engine here. Checking an engine kind
imports neither vLLM nor the rollout package (the CLI checks before loading any model).
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.histospec import attach_histospec
from reference_trainer.engine.protocol import RolloutEngine
from reference_trainer.engine.vllm_engine import INSTALL_HINT, VLLMEngine, vllm_available
from reference_trainer.errors import UserError
from reference_trainer.trace.writer import Trace

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


def check_engine_kind(kind: str) -> None:
    """A one-line UserError for an unknown engine kind, or vllm where vLLM is not installed."""
    if kind not in ROLLOUT_ENGINES:
        raise UserError(f"unknown engine {kind!r}; use {' or '.join(ROLLOUT_ENGINES)}")
    if kind == "vllm" and not vllm_available():
        raise UserError(INSTALL_HINT)


def build_rollout_engine(
    kind: str,
    config: EngineConfig,
    tokenizer: Any,
    *,
    model: Any = None,
    model_dir: str | Path | None = None,
    trace: Trace | None = None,
    seed: int = 0,
    histospec: Mapping[str, Any] | None = None,
    workers: int = 1,
    worker_backend: str = "ray",
    ray_address: str | None = None,
    rollout_copy: bool = False,
) -> RolloutEngine:
    """The rollout engine for `kind` ("reference" or "vllm"):

    - vllm: a `VLLMEngine` over `model_dir`; `histospec` options map onto vLLM's own speculative decoding
      (speculative_config). One engine only: vLLM batches on its own.
    - reference, workers > 1: a worker pool (backend "ray", or "local" in-process) of `workers` engines over
      `model`'s architecture and weights, each with HistoSpec when `histospec` is not None.
    - reference: an `Engine` over `model`, with HistoSpec attached when `histospec` is not None.
      `rollout_copy` runs it on a frozen copy of `model` in the device's inference dtype (bf16 on CUDA), so
      a policy that keeps training in fp32 is not the engine's.

    The engine (or pool) records into `trace` (a new one when None). Unknown kinds, a missing vLLM and
    --workers with vllm are a UserError before anything is built. A pool or a vLLM engine needs `close()`.
    """
    check_engine_kind(kind)
    eos = tokenizer.eos_token_ids
    if kind == "vllm":
        if workers > 1:
            raise UserError(f"--workers needs --engine reference (got --engine {kind})")
        if model_dir is None:
            raise ValueError("the vllm engine loads a model directory: pass model_dir")
        return VLLMEngine(
            model_dir, config, eos, tokenizer=tokenizer, trace=trace, seed=seed, speculative=histospec
        )
    if model is None:
        raise ValueError("the reference engine runs a loaded model: pass model")
    trace = trace if trace is not None else Trace()
    if workers > 1:
        from reference_trainer.engine.workers import WorkerSpec, make_worker_pool

        spec = WorkerSpec(
            model.config,
            config,
            sorted(eos),
            tokenizer,
            dict(histospec) if histospec is not None else None,
            threads=max(1, (os.cpu_count() or 1) // workers),  # the machine's cores split between replicas
        )
        return make_worker_pool(spec, model.state_dict(), workers, trace, worker_backend, ray_address)
    from reference_trainer.engine.engine import Engine
    from reference_trainer.model.loader import resolve_dtype

    if rollout_copy:
        device = next(model.parameters()).device
        model = copy.deepcopy(model).requires_grad_(False).to(resolve_dtype("auto", device))
    engine = Engine(model, config, eos, tokenizer=tokenizer, trace=trace)
    if histospec is not None:
        attach_histospec(engine, **histospec)
    return engine
