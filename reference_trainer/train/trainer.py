"""The GRPO loop: rollout (engine) -> reward -> update -> in-place weight sync -> log, one step at a time.

How rollout admits prompts and picks the groups to train on is a `RolloutStrategy` (rollout/); the loop
itself is the same for every mode, and its parts are assembled in one place (assemble.py). Outputs in
`out_dir`: train_config.json, metrics.jsonl (one row per step, train/rows.py), trace.jsonl (engine steps,
phases, sequences) and checkpoints/.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reference_trainer.engine import Trace
from reference_trainer.model.loader import load_model
from reference_trainer.rollout.base import Group
from reference_trainer.train.assemble import RunParts, assemble
from reference_trainer.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.grpo import RolloutBatch
from reference_trainer.train.heldout import HeldOut, check_disjoint, held_out_problems
from reference_trainer.train.rows import VAL_FIELDS, step_row
from rlbench.metrics import worker_capacities
from rlbench.records import append_jsonl, read_jsonl, write_json, write_text


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        out_dir: Path,
        trace: Trace | None = None,
        resume: bool = False,
        parts: RunParts | None = None,
    ) -> None:
        """A run in `out_dir` over `parts` (by default assembled from `config` by `assemble`)."""
        self.config, self.out_dir = config, Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        parts = parts if parts is not None else assemble(config, trace)
        self.parts = parts
        self.task, self.tokenizer, self.policy = parts.task, parts.tokenizer, parts.policy
        self.updater, self.trace, self.engine = parts.updater, parts.trace, parts.engine
        self.stream, self.strategy, self.ctx = parts.stream, parts.strategy, parts.ctx
        self.step = 0
        self.heldout = self._heldout() if config.eval_every > 0 else None
        if resume:
            self._resume()
        else:
            self._start_fresh()

    def close(self) -> None:
        """Stop rollout workers or the vLLM engine (the reference engine just drops unfinished requests)."""
        self.engine.close()

    def _heldout(self) -> HeldOut:
        pool = self.config.prompt_pool
        training = [self.stream.problem(i).prompt for i in range(pool)] if pool else []
        problems = held_out_problems(self.task, self.config.eval_problems, training, self.config.heldout_seed)
        check_disjoint(problems, training)
        return HeldOut(
            self.policy,
            self.tokenizer,
            self.task,
            problems,
            self.config.response_tokens,
            self.config.max_model_len,
        )

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy accuracy and pass@1 at the rollout temperature of the current policy."""
        assert self.heldout is not None
        return self.heldout.evaluate(self.config.temperature, self.config.eval_samples, seed=self.config.seed)

    # ---- state -------------------------------------------------------------------------------------------
    def _start_fresh(self) -> None:
        shutil.rmtree(self.out_dir / "checkpoints", ignore_errors=True)
        for name in ("metrics.jsonl", "trace.jsonl", "heldout.json"):
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
        if self.heldout is not None and rows:
            self.write_heldout_summary()
        return rows

    def write_heldout_summary(self) -> None:
        """heldout.json: the held-out curve against samples consumed, ending with the final policy's
        evaluation (metrics.jsonl rows carry the evaluations made before their step's rollout)."""
        curve, samples = [], 0
        for row in read_jsonl(self.out_dir / "metrics.jsonl"):
            if VAL_FIELDS[0] in row:
                curve.append({"step": row["step"], "samples": samples, **_val(row)})
            samples += row["samples"]
        if not curve or curve[-1]["step"] != self.step:
            curve.append({"step": self.step, "samples": samples, **_val(self.evaluate())})
        write_json(
            self.out_dir / "heldout.json",
            {"task": self.config.task, "problems": len(self.heldout.problems), "curve": curve},
        )

    def train_step(self) -> dict[str, Any]:
        trace, step = self.trace, self.step
        trace.step = step
        val = self.evaluate() if self.heldout is not None and step % self.config.eval_every == 0 else {}
        first_event = len(trace.events)
        with trace.phase("rollout", policy_version=self.engine.policy_version) as rollout:
            groups = self.strategy.collect(self.ctx)
            rollout["groups"] = len(groups)
        with trace.phase("reward") as reward:
            batch, correct, formatted = self._score(groups)
            reward["reward_mean"] = sum(batch.rewards) / len(batch.rewards)
            reward["accuracy"] = sum(correct) / len(correct)
            reward["answer_rate"] = sum(formatted) / len(formatted)
        with trace.phase("update", policy_version=self.engine.policy_version) as update:
            stats = self.updater.update(batch)
            update["loss"] = stats["loss"]
        with trace.phase("sync"):
            self.engine.update_weights(self.policy.state_dict())
        self.step += 1
        row = step_row(trace.events[first_event:], worker_capacities(trace.events), len(batch), stats)
        row.update(val)
        append_jsonl(self.out_dir / "metrics.jsonl", row)
        trace.flush_to(self.out_dir / "trace.jsonl")
        return row

    def _score(self, groups: list[Group]) -> tuple[RolloutBatch, list[bool], list[bool]]:
        prompts, responses, rewards, logprobs, correct, formatted = [], [], [], [], [], []
        for group in groups:
            for seq in group.samples:
                text = self.tokenizer.decode(seq.response_ids)
                prompts.append(seq.prompt_ids)
                responses.append(seq.response_ids)
                logprobs.append(seq.logprobs)
                answered, is_correct = self.task.grade(group.problem, text)
                rewards.append(self.task.reward_of(answered, is_correct))
                correct.append(is_correct)
                formatted.append(answered)
        batch = RolloutBatch(prompts, responses, rewards, self.config.group_size, old_logprobs=logprobs)
        return batch, correct, formatted


def _val(values: dict[str, Any]) -> dict[str, float]:
    return {k.removeprefix("val/heldout_"): values[k] for k in VAL_FIELDS}
