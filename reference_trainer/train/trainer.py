"""The GRPO loop: rollout (engine) -> reward -> update -> in-place weight sync -> log, one step at a time.

How rollout admits prompts and picks the groups to train on is a `RolloutStrategy` (rollout.py); the loop
itself is the same for every mode. Outputs in `out_dir`: train_config.json, metrics.jsonl (one row per
step), trace.jsonl (engine steps, phases, sequences) and checkpoints/.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from reference_trainer.engine import Engine, Trace
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.model.loader import load_model, resolve_dtype
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.modes import get_mode, make_mode_strategy
from reference_trainer.rollout.base import Group, PromptStream, RolloutContext
from reference_trainer.rollout.histospec import attach_histospec
from reference_trainer.rollout.workers import WorkerPool, WorkerSpec, make_worker_pool
from reference_trainer.tasks import get_task
from reference_trainer.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from reference_trainer.train.grpo import GRPOConfig, GRPOUpdater, RolloutBatch
from rlbench.records import append_jsonl, read_jsonl, write_json, write_text


@dataclass
class TrainConfig:
    task: str = "arith"
    task_options: dict[str, Any] = field(default_factory=dict)
    mode: str = "baseline"
    mode_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 20
    seed: int = 0
    model: str | None = None  # a model directory; None = the embedded default model
    device: str = "cpu"
    engine: str = (
        "reference"  # rollout engine: "reference" or "vllm" (reference_trainer/engine/vllm_engine.py)
    )
    prompts_per_step: int = 16  # complete groups per update
    group_size: int = 8
    max_tokens: int = 400
    temperature: float = 1.0
    top_p: float = 1.0
    max_num_seqs: int = 128  # engine slot capacity
    max_model_len: int = 1024
    max_prefill_tokens: int = (
        32768  # engine tokens per batched prefill forward (padded): a step's admissions in one go
    )
    checkpoint_every: int = 5
    prompt_pool: int | None = None  # a fixed pool of this many prompts cycled per epoch; None = endless
    workers: int = 1  # rollout engine replicas; > 1 runs them as Ray actors (multiworker.py)
    worker_backend: str = "ray"  # "ray", or "local": in-process, one after another (tests, debugging)
    ray_address: str | None = None  # an existing Ray cluster; None = start a local one
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(lr=1e-4, micro_batch_size=32))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TrainConfig:
        raw = dict(raw)
        grpo = raw.pop("grpo", {})
        if "betas" in grpo:
            grpo["betas"] = tuple(grpo["betas"])
        known = {f.name for f in fields(cls)}
        return cls(grpo=GRPOConfig(**grpo), **{k: v for k, v in raw.items() if k in known})


# Updater stats copied into each metrics row (the tis_* ones only in modes with off-policy correction).
ROW_STATS = ("loss", "grad_norm", "clip_frac", "kl", "entropy", "tis_weight_mean", "tis_clip_frac")


class Trainer:
    def __init__(
        self, config: TrainConfig, out_dir: Path, trace: Trace | None = None, resume: bool = False
    ) -> None:
        from reference_trainer.model.embedded import default_model_dir

        self.config, self.out_dir = config, Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = Path(config.model) if config.model else default_model_dir()
        self.task = get_task(config.task, **config.task_options)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.policy = load_model(self.model_dir, device=config.device, dtype="float32")
        self.ref_model = None
        if config.grpo.kl_coef:
            self.ref_model = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.mode = get_mode(config.mode)
        grpo = config.grpo
        if grpo.tis_cap is None and self.mode.tis_cap is not None:  # the mode's off-policy correction
            grpo = replace(grpo, tis_cap=self.mode.tis_cap)
        self.updater = GRPOUpdater(self.policy, grpo, self.ref_model)
        self.trace = trace if trace is not None else Trace()
        self.engine = self._rollout_engine()
        self.stream = PromptStream(self.task, config.seed, config.prompt_pool)
        strategy_options = {k: v for k, v in config.mode_options.items() if k != "histospec"}
        self.strategy = make_mode_strategy(self.mode, config.workers, strategy_options)
        self.ctx = RolloutContext(
            engine=self.engine,
            tokenizer=self.tokenizer,
            stream=self.stream,
            group_size=config.group_size,
            update_batch=config.prompts_per_step,
            params=SamplingParams(
                temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
            ),
            seed=config.seed,
        )
        self.step = 0
        if resume:
            self._resume()
        else:
            self._start_fresh()

    def _rollout_engine(self) -> Engine | WorkerPool | Any:
        """The rollout side: one in-process engine (reference, or a VLLMEngine with the same interface), or
        a pool of `workers` reference-engine replicas on Ray."""
        config = self.config
        engine_config = EngineConfig(
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            max_prefill_tokens=config.max_prefill_tokens,
            device=config.device,
        )
        histospec = config.mode_options.get("histospec", {}) if self.mode.speculative else None
        if config.engine != "reference":  # vLLM: its own n-gram/suffix drafting stands in for HistoSpec
            if config.workers > 1:
                raise ValueError(f"--workers needs --engine reference (got --engine {config.engine})")
            from reference_trainer.engine.factory import build_engine

            return build_engine(
                config.engine,
                None,
                self.model_dir,
                engine_config,
                self.tokenizer,
                self.trace,
                seed=config.seed,
                speculative=histospec,
            )
        if config.workers > 1:
            self.mode.strategy_for(config.workers)  # fail before starting workers for a one-engine mode
            spec = WorkerSpec(
                self.policy.config,
                engine_config,
                sorted(self.tokenizer.eos_token_ids),
                self.tokenizer,
                histospec,
                threads=max(1, (os.cpu_count() or 1) // config.workers),
            )
            return make_worker_pool(
                spec,
                self.policy.state_dict(),
                config.workers,
                self.trace,
                config.worker_backend,
                config.ray_address,
            )
        # The policy trains in fp32; the rollout copy runs in the device's inference dtype (bf16 on CUDA).
        device = self.policy.lm_head.weight.device
        engine_model = copy.deepcopy(self.policy).requires_grad_(False).to(resolve_dtype("auto", device))
        engine = Engine(
            engine_model,
            engine_config,
            self.tokenizer.eos_token_ids,
            tokenizer=self.tokenizer,
            trace=self.trace,
        )
        if histospec is not None:
            attach_histospec(engine, **histospec)
        return engine

    def close(self) -> None:
        """Stop rollout workers (a no-op for the in-process engine)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    # ---- state -------------------------------------------------------------------------------------------
    def _start_fresh(self) -> None:
        shutil.rmtree(self.out_dir / "checkpoints", ignore_errors=True)
        for name in ("metrics.jsonl", "trace.jsonl"):
            (self.out_dir / name).unlink(missing_ok=True)
        write_json(self.out_dir / "train_config.json", self.config.to_json())

    def _resume(self) -> None:
        """Continue from the latest checkpoint in out_dir; drop logged rows of steps it does not cover."""
        ckpt = latest_checkpoint(self.out_dir / "checkpoints")
        if ckpt is None:  # killed before its first checkpoint: nothing finished to keep
            self._start_fresh()
            return
        optimizer, state = load_checkpoint(ckpt)
        self.policy.load_state_dict(load_model(ckpt, device=self.config.device, dtype="float32").state_dict())
        self.updater.load_state_dict(optimizer)
        self.engine.update_weights(self.policy.state_dict(), version=state["policy_version"])
        self.stream.load_state_dict(state["stream"])
        self.strategy.load_state_dict(state["strategy"])
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        self.step = state["step"]
        for name in ("metrics.jsonl", "trace.jsonl"):
            path = self.out_dir / name
            if path.exists():
                kept = [row for row in read_jsonl(path) if row.get("step", -1) < self.step]
                write_text(path, "".join(json.dumps(row) + "\n" for row in kept))

    def _checkpoint(self) -> None:
        save_checkpoint(
            self.out_dir / "checkpoints",
            self.step,
            self.policy,
            self.tokenizer,
            self.updater.state_dict(),
            {
                "policy_version": self.engine.policy_version,
                "stream": self.stream.state_dict(),
                "strategy": self.strategy.state_dict(),
                "torch_rng": torch.get_rng_state().tolist(),
            },
        )

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        rows = []
        while self.step < self.config.steps:
            row = self.train_step()
            rows.append(row)
            if on_step is not None:
                on_step(row)
            if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                self._checkpoint()
        return rows

    def train_step(self) -> dict[str, Any]:
        trace, step = self.trace, self.step
        trace.step = step
        first_event = len(trace.events)
        with trace.phase("rollout", policy_version=self.engine.policy_version) as rollout:
            groups = self.strategy.collect(self.ctx)
            rollout["groups"] = len(groups)
        with trace.phase("reward") as reward:
            batch, correct = self._score(groups)
            reward["reward_mean"] = sum(batch.rewards) / len(batch.rewards)
            reward["accuracy"] = sum(correct) / len(correct)
        with trace.phase("update", policy_version=self.engine.policy_version) as update:
            stats = self.updater.update(batch)
            update.update({k: stats[k] for k in ("loss", "grad_norm", "clip_frac", "kl") if k in stats})
        with trace.phase("sync"):
            self.engine.update_weights(self.policy.state_dict())
        self.step += 1
        row = self._row(step, trace.events[first_event:], batch, stats)
        append_jsonl(self.out_dir / "metrics.jsonl", row)
        trace.flush_to(self.out_dir / "trace.jsonl")
        return row

    def _score(self, groups: list[Group]) -> tuple[RolloutBatch, list[bool]]:
        prompts, responses, rewards, logprobs, correct = [], [], [], [], []
        for group in groups:
            for seq in group.samples:
                text = self.tokenizer.decode(seq.response_ids)
                prompts.append(seq.prompt_ids)
                responses.append(seq.response_ids)
                logprobs.append(seq.logprobs)
                rewards.append(self.task.reward(group.problem, text))
                correct.append(self.task.is_correct(group.problem, text))
        batch = RolloutBatch(prompts, responses, rewards, self.config.group_size, old_logprobs=logprobs)
        return batch, correct

    def _row(
        self, step: int, events: list[dict[str, Any]], batch: RolloutBatch, stats: dict[str, float]
    ) -> dict:
        phases = {
            e["kind"]: e["t_end"] - e["t_start"]
            for e in events
            if e["kind"] in ("rollout", "reward", "update", "sync")
        }
        reward = next(e for e in events if e["kind"] == "reward")
        generated = sum(e["tokens"] for e in events if e["kind"] in ("prefill", "decode", "verify"))
        lengths = [len(r) for r in batch.response_ids]
        return {
            "step": step,
            "reward_mean": reward["reward_mean"],
            "accuracy": reward["accuracy"],
            "response_len_mean": sum(lengths) / len(lengths),
            "response_len_max": max(lengths),
            "samples": len(lengths),
            "timing_s/gen": phases["rollout"],
            "timing_s/reward": phases["reward"],
            "timing_s/update": phases["update"],
            "timing_s/sync": phases["sync"],
            "step_time_s": sum(phases.values()),
            "rollout_tokens_per_s": generated / phases["rollout"] if phases["rollout"] > 0 else math.nan,
            **{k: stats[k] for k in ROW_STATS if k in stats},
        }


def load_run_config(out_dir: Path) -> TrainConfig:
    """The config a run in out_dir was started with (what --resume continues)."""
    path = Path(out_dir) / "train_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} holds no training run (no train_config.json)")
    return TrainConfig.from_json(json.loads(path.read_text()))
