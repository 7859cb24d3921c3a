"""The GRPO loop: rollout (engine) -> reward -> update -> in-place weight sync -> log, one step at a time.

How rollout admits prompts and picks the groups to train on is a `RolloutStrategy` (rollout/); the loop
itself is the same for every mode, and its parts are assembled in one place (assemble.py). Outputs in
`out_dir`: train_config.json, metrics.jsonl (one row per step, train/rows.py), trace.jsonl (engine steps,
phases, sequences) and checkpoints/.

Resume loses nothing finished. A step is finished once its metrics row is written (its trace events are
written just before it). `resume` restores the latest checkpoint and re-runs the steps finished after it,
which the run's fixed seeds make the same steps again, without logging them twice: their rows and trace
events from the first run are kept. That costs the re-run of at most `checkpoint_every - 1` steps, where a
checkpoint per step would write the model and optimizer state (three copies of the weights) every step.
A run stopped during its final held-out evaluation writes heldout.json when resumed. A rollout run ahead
(modes async, sorted+async) restarts from the checkpoint's step with the strategy's state as of it and the
k older weights its next steps roll out on, which the checkpoint keeps too (`rollout.history()`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import UserError
from reference_trainer.model.loader import load_model
from reference_trainer.rollout.base import Group
from reference_trainer.rollout.slots import WorkerSlots
from reference_trainer.trace.records import append_jsonl, make_dir, read_jsonl, write_json, write_text
from reference_trainer.trace.schema import ENGINE_LOST, HELDOUT, REWARD, SYNC, UPDATE
from reference_trainer.trace.steps import worker_capacities
from reference_trainer.trace.writer import Trace
from reference_trainer.train.assemble import RunParts, assemble
from reference_trainer.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_rollout_history,
    restoring,
    save_checkpoint,
)
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.grpo import NonFiniteUpdate, RolloutBatch
from reference_trainer.train.heldout import HeldOut, check_disjoint, held_out_problems
from reference_trainer.train.rows import VAL_FIELDS, step_row


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        out_dir: Path,
        trace: Trace | None = None,
        resume: bool = False,
        parts: RunParts | None = None,
        slots: WorkerSlots | None = None,
    ) -> None:
        """A run in `out_dir` over `parts` (by default assembled from `config` by `assemble`, its Ray
        workers in `slots` when given: places shared with other runs' pools)."""
        self.config, self.out_dir = config, make_dir(out_dir)
        _remove_stale_temps(self.out_dir)
        if not resume:  # written first, so a run stopped at any later moment can be resumed
            self._start_fresh()
        parts = parts if parts is not None else assemble(config, trace, slots)
        self.parts = parts
        self.task, self.tokenizer, self.policy = parts.task, parts.tokenizer, parts.policy
        self.updater, self.trace, self.engine = parts.updater, parts.trace, parts.engine
        self.stream, self.strategy, self.ctx = parts.stream, parts.strategy, parts.ctx
        self.rollout = parts.rollout
        self.step = 0
        self.logged: list[dict[str, Any]] = []  # finished steps a resume re-runs: rows kept, not re-logged
        self.heldout = self._heldout() if config.eval_every > 0 else None
        # Told before each held-out evaluation (which can take minutes on a CPU), so a caller can say so.
        self.on_evaluate: Callable[[int], None] | None = None
        if resume:
            self._resume()
        self.rollout.launch(self.step)  # captures and compiles before any step's clock starts

    def close(self) -> None:
        """Stop rollout workers or the vLLM engine (the reference engine just drops unfinished requests)."""
        self.engine.close()

    def _heldout(self) -> HeldOut:
        cfg = self.config
        training = [self.stream.problem(i).prompt for i in range(cfg.prompt_pool)] if cfg.prompt_pool else []
        problems = held_out_problems(self.task, cfg.eval_problems, training, cfg.heldout_seed)
        check_disjoint(problems, training)
        # the rollout engine's sizes: its compiled shapes serve both
        sizes = (cfg.response_tokens, cfg.max_model_len, cfg.max_num_seqs)
        return HeldOut(self.policy, self.tokenizer, self.task, problems, *sizes)

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy accuracy and pass@1 at the rollout temperature of the current policy."""
        assert self.heldout is not None
        if self.on_evaluate is not None:
            self.on_evaluate(self.step)
        return self.heldout.evaluate(self.config.temperature, self.config.eval_samples, seed=self.config.seed)

    # ---- state -------------------------------------------------------------------------------------------
    def _start_fresh(self) -> None:
        shutil.rmtree(self.out_dir / "checkpoints", ignore_errors=True)
        for name in ("metrics.jsonl", "trace.jsonl", "heldout.json"):
            (self.out_dir / name).unlink(missing_ok=True)
        write_json(self.out_dir / "train_config.json", self.config.to_json())

    def _resume(self) -> None:
        """Continue from the latest checkpoint in out_dir (none: from the start), keeping the rows of every
        step finished since: those steps are re-run, not logged again."""
        ckpt = latest_checkpoint(self.out_dir / "checkpoints")
        if ckpt is not None:
            with restoring(ckpt):  # a damaged file is one line naming the checkpoint
                optimizer, state = load_checkpoint(ckpt)
                weights = load_model(ckpt, device=self.config.device, dtype="float32").state_dict()
                self.policy.load_state_dict(weights)
                self.updater.load_state_dict(optimizer)
                self.engine.update_weights(self.policy.state_dict(), version=state["policy_version"])
                self.rollout.restore(load_rollout_history(ckpt), state["step"], str(ckpt))
                self.stream.load_state_dict(state["stream"])
                self.strategy.load_state_dict(state["strategy"])
                if "dispatch" in state and hasattr(self.engine, "load_dispatch_state"):
                    self.engine.load_dispatch_state(state["dispatch"])
                torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
                self.step = state["step"]
        metrics = self.out_dir / "metrics.jsonl"
        logged = read_jsonl(metrics) if metrics.exists() else []
        finished: list[dict[str, Any]] = []
        for row in logged:
            if row.get("step") != len(finished):  # steps are logged in order; anything else is not kept
                break
            finished.append(row)
        if len(finished) < self.step:
            raise UserError(
                f"{metrics} lacks steps {len(finished)}..{self.step - 1} that checkpoint step {self.step} "
                "holds: the run's logs were edited or lost; start it again with --overwrite"
            )
        self.logged = finished[self.step :]
        # Rows and events past the finished steps (a step stopped midway) are dropped.
        if len(finished) < len(logged):
            write_text(metrics, "".join(json.dumps(row) + "\n" for row in finished))
        trace = self.out_dir / "trace.jsonl"
        events = read_jsonl(trace) if trace.exists() else []
        kept = [e for e in events if e.get("step", -1) < len(finished)]
        if len(kept) < len(events):
            write_text(trace, "".join(json.dumps(e) + "\n" for e in kept))

    def _checkpoint(self) -> None:
        dispatch = self.engine.dispatch_state() if hasattr(self.engine, "dispatch_state") else None
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
                # W > 1 under the controller (rollout/multi.py, inline or on a rollout run ahead's side): the
                # predicted lengths it dispatches by
                **({"dispatch": dispatch} if dispatch is not None else {}),
                "torch_rng": torch.get_rng_state().tolist(),
            },
            self.rollout.history(),
        )

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        rows = []
        while self.step < self.config.steps:
            row = self.train_step()
            rows.append(row)
            if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                self._checkpoint()
            if on_step is not None:  # after the checkpoint: a caller that stops the run here keeps it
                on_step(row)
        summary_missing = not (self.out_dir / "heldout.json").is_file()  # a resume stopped before it
        if self.heldout is not None and self.step > 0 and (rows or summary_missing):
            self.write_heldout_summary()
        return rows

    def write_heldout_summary(self) -> None:
        """heldout.json: the held-out curve against samples consumed, ending with the final policy's
        evaluation (metrics.jsonl rows carry the evaluations made before their step's rollout), and how long
        that final evaluation took (`final_eval_s`: it runs outside any step, so no trace phase holds it)."""
        curve, samples = [], 0
        for row in read_jsonl(self.out_dir / "metrics.jsonl"):
            if VAL_FIELDS[0] in row:
                curve.append({"step": row["step"], "samples": samples, **_val(row)})
            samples += row["samples"]
        took = None
        if not curve or curve[-1]["step"] != self.step:
            start = time.perf_counter()
            curve.append({"step": self.step, "samples": samples, **_val(self.evaluate())})
            took = time.perf_counter() - start
        summary = {"task": self.config.task, "problems": len(self.heldout.problems), "curve": curve}
        write_json(self.out_dir / "heldout.json", {**summary, "final_eval_s": took})

    def train_step(self) -> dict[str, Any]:
        trace, step = self.trace, self.step
        trace.step = step
        replayed = self.logged.pop(0) if self.logged and self.logged[0]["step"] == step else None
        first_event = len(trace.events)
        val = {}
        if self.heldout is not None and step % self.config.eval_every == 0 and replayed is None:
            with trace.phase(HELDOUT):
                val = self.evaluate()
        self.rollout.begin(step)  # a rollout run ahead runs only inside steps (rollout/ahead.py)
        try:
            groups = self.rollout.collect()  # its phase: the rollout, or the wait for one run ahead
            with trace.phase(REWARD) as reward:
                batch, correct, formatted, rewards = self._score(groups)
                reward["reward_mean"] = sum(batch.rewards) / len(batch.rewards)
                reward["accuracy"] = sum(correct) / len(correct)
                reward["answer_rate"] = sum(formatted) / len(formatted)
            with trace.phase(UPDATE, policy_version=self.engine.policy_version) as update:
                try:
                    stats = self.updater.update(batch)
                except NonFiniteUpdate as err:
                    raise UserError(f"step {step}: {err}; the run stopped, {self._last_good()}") from None
                update["loss"] = stats["loss"]
                update["tokens"] = int(stats["forward_tokens"])  # its work: padded positions processed
            with trace.phase(SYNC):
                self.engine.update_weights(self.policy.state_dict())
        finally:
            self.rollout.end()
        self._grade_recorded(rewards)  # outside the step's time: the ledger's reward over every generation
        self.step += 1
        if replayed is not None:  # a step finished before a resume: run again for its state, logged once
            trace.drop_since(first_event)
            return replayed
        losses = [e for e in trace.events[:first_event] if e["kind"] == ENGINE_LOST]  # engines gone before it
        row = step_row(
            losses + trace.events[first_event:], worker_capacities(trace.events), len(batch), stats
        )
        row.update(val)
        trace.flush_to(self.out_dir / "trace.jsonl")  # the events first: a metrics row marks a finished step
        append_jsonl(self.out_dir / "metrics.jsonl", row)
        return row

    def _last_good(self) -> str:
        ckpt = latest_checkpoint(self.out_dir / "checkpoints")
        if ckpt is None:
            return "before its first checkpoint (no weights were kept)"
        return f"its last good checkpoint is {ckpt}"

    def _score(self, groups: list[Group]) -> tuple[RolloutBatch, list[bool], list[bool], dict[int, float]]:
        """The update batch with its rewards; whether each sample is correct and answered in format; the
        rewards by sequence (id())."""
        pairs = [(group.problem, seq) for group in groups for seq in group.samples]
        seqs = [seq for _, seq in pairs]
        grades = [self.task.grade(p, self.tokenizer.decode(s.response_ids)) for p, s in pairs]
        rewards = [self.task.reward_of(answered, correct) for answered, correct in grades]
        prompts = [s.prompt_ids for s in seqs]
        responses = [s.response_ids for s in seqs]
        logprobs = [s.logprobs for s in seqs]
        batch = RolloutBatch(prompts, responses, rewards, self.config.group_size, old_logprobs=logprobs)
        by_seq = {id(s): r for s, r in zip(seqs, rewards, strict=True)}
        return batch, [c for _, c in grades], [a for a, _ in grades], by_seq

    def _grade_recorded(self, rewards: dict[int, float]) -> None:
        """Every sequence event the step recorded gets the reward of its response as it stands (a trained
        sample's from the update batch; an aborted or cached one graded here, unfinished as it is)."""
        for event, seq in self.rollout.take_recorded():
            if id(seq) not in rewards:
                problem = self.stream.problem(int(seq.meta["index"]))
                rewards[id(seq)] = self.task.reward_of(
                    *self.task.grade(problem, self.tokenizer.decode(seq.response_ids))
                )
            event["reward"] = rewards[id(seq)]


def _remove_stale_temps(out_dir: Path) -> None:
    """Temp files and checkpoint directories a killed run left (checkpoints/.step-*.tmp*, .NAME.*.tmp):
    only their writer used them, and a run directory has one writer at a time (locks.run_lock)."""
    for folder in (out_dir, out_dir / "checkpoints"):
        for stale in folder.glob(".*.tmp*") if folder.is_dir() else []:
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def _val(values: dict[str, Any]) -> dict[str, float]:
    return {k.removeprefix("val/heldout_"): values[k] for k in VAL_FIELDS}
