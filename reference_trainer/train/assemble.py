"""Assemble a training run from its config, in one place: task, tokenizer, policy (and reference) model,
updater, mode, rollout engine or worker pool (with a Speculator when the mode drafts), prompt
stream, strategy and rollout context. The Trainer receives these parts and never reads the config to
build anything."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.protocol import RolloutEngine
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.embedded import default_model_dir
from reference_trainer.model.loader import load_model, resolve_device, resolve_threads
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.modes import ModeOptions, ModeSpec, get_mode, make_mode_strategy
from reference_trainer.rollout.ahead import AheadRollout, split_threads
from reference_trainer.rollout.base import InlineRollout, PromptStream, RolloutContext, RolloutStrategy
from reference_trainer.rollout.engines import RolloutEngineSpec, build_rollout_engine, speculator_of
from reference_trainer.rollout.multi import Engines, MultiEngine
from reference_trainer.rollout.slots import WorkerSlots
from reference_trainer.rollout.workers import WorkerSpec
from reference_trainer.tasks import Task, get_task
from reference_trainer.trace.writer import Trace
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.grpo import GRPOUpdater


@dataclass
class RunParts:
    model_dir: Path
    task: Task
    tokenizer: Any
    policy: DecoderLM  # trains in fp32
    updater: GRPOUpdater
    mode: ModeSpec
    trace: Trace
    # an engine, a pool of engine replicas, or the trainer's side of a rollout run ahead
    engine: RolloutEngine
    stream: PromptStream
    strategy: RolloutStrategy
    ctx: RolloutContext
    rollout: InlineRollout | AheadRollout  # how the loop gets a step's groups


def styled_task_options(config: TrainConfig, tokenizer: Any) -> dict[str, Any]:
    """The task's options; a model with a chat template gets the task's chat style (natural-language prompt,
    `rlbench eval`'s grading) unless the options name a style."""
    style = "chat" if getattr(tokenizer, "has_chat_template", False) else "compact"
    return {"style": style, **config.task_options}


def _threads(config: TrainConfig, options: ModeOptions, device: str) -> tuple[int, int]:
    """(the update's, the rollout's) CPU threads: one budget, split between two processes when the rollout
    runs ahead in a process of its own on the CPU."""
    threads = resolve_threads(config.threads)
    ahead = options.ahead
    if ahead is None or ahead.backend != "process" or device != "cpu":
        return threads, threads
    rollout, update = split_threads(threads, ahead.max_staleness, ahead.rollout_threads)
    return update, rollout


def _engine_spec(config: TrainConfig, options: ModeOptions, device: str) -> RolloutEngineSpec:
    sizes = {"max_num_seqs": config.max_num_seqs, "max_model_len": config.max_model_len}
    return RolloutEngineSpec(
        kind=config.engine,
        config=EngineConfig(**sizes, max_prefill_tokens=config.max_prefill_tokens, device=device),
        speculation=options.speculation,
        workers=config.workers,
        worker_backend=config.worker_backend,
        ray_address=config.ray_address,
        seed=config.seed,
        rollout_copy=True,  # the policy trains in fp32; the engine runs a copy in the inference dtype
    )


def _engines(config: TrainConfig, options: ModeOptions) -> Engines:
    """The engines a rollout run ahead drives in its process: one, or W under one controller."""
    if options.dispatch is None:
        return Engines()
    d = options.dispatch
    return Engines(config.workers, config.worker_backend, config.ray_address, d.dispatch, d.migrates)


def assemble(config: TrainConfig, trace: Trace | None = None, slots: WorkerSlots | None = None) -> RunParts:
    """Every part of a run, built from `config` (checked first: a bad config fails before any model
    loads); a Ray worker pool runs in `slots` (shared with other runs' pools), its own when None."""
    mode = get_mode(config.mode)
    grpo = config.update_config(mode.correction(config.mode_options))
    options = mode.resolve(config.mode_options, config.workers, config.engine)
    device = str(resolve_device(config.device))  # "auto" becomes what it means here, for every part
    threads, rollout_threads = _threads(config, options, device)
    torch.set_num_threads(threads)
    model_dir = Path(config.model) if config.model else default_model_dir()
    # The weights first: a config.json that lies is named by the weights it disagrees with, before the
    # tokenizer is compared with it.
    policy = load_model(model_dir, device=device, dtype="float32")
    tokenizer = load_tokenizer(model_dir)
    task = get_task(config.task, **styled_task_options(config, tokenizer))
    ref_model = copy.deepcopy(policy).eval().requires_grad_(False) if grpo.kl_coef else None
    trace = trace if trace is not None else Trace()
    spec = _engine_spec(config, options, device)
    stream = PromptStream(task, config.seed, config.prompt_pool)
    strategy = make_mode_strategy(mode, config.workers, options)
    params = SamplingParams(
        temperature=config.temperature, top_p=config.top_p, max_tokens=config.response_tokens
    )
    ctx = RolloutContext(engine=None, tokenizer=tokenizer, stream=stream, group_size=config.group_size,  # type: ignore[arg-type]
                         update_batch=config.prompts_per_step, params=params, seed=config.seed)  # fmt: skip
    rollout: InlineRollout | AheadRollout
    if options.ahead is not None:  # the engine runs on the rollout side; the trainer sees its handle
        on = replace(spec.config, device=options.ahead.rollout_device or device)
        engines = _engines(config, options)
        shared = engines.workers if engines.backend == "ray" else 1  # Ray's replicas split the threads
        worker = WorkerSpec(policy.config, on, sorted(tokenizer.eos_token_ids), tokenizer,
                            threads=max(1, rollout_threads // shared))  # fmt: skip
        rollout = AheadRollout(worker, policy.state_dict(), strategy, ctx, trace, options.ahead, engines)
        engine: RolloutEngine = rollout
    else:
        engine = build_rollout_engine(
            spec, tokenizer, model=policy, model_dir=model_dir, trace=trace, slots=slots
        )
        if options.dispatch is not None:  # SortedRL on W engines: one controller drives the pool
            d = options.dispatch
            engine = MultiEngine(engine, spec.config, d.dispatch, d.migrates)  # type: ignore[arg-type]
        ctx.speculator = speculator_of(engine)
        rollout = InlineRollout(strategy, ctx)
    ctx.engine = engine  # type: ignore[assignment]
    updater = GRPOUpdater(policy, grpo, ref_model)
    return RunParts(
        model_dir, task, tokenizer, policy, updater, mode, trace, engine, stream, strategy, ctx, rollout
    )
