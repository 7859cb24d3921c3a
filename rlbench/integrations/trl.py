"""rlbench's trace and metrics from a TRL GRPOTrainer run, written while it trains (usage, what is read and
what it cannot know: docs/integrations.md, "TRL").

transformers' TrainerCallback has no event at generation start or end, nor per sample, so `probe` is a
reward function (weight 0; put it last) that TRL calls once per generation batch with every completion's
token ids: each sample's length, and its group (the sampler repeats each prompt `num_generations` times in
a row). Its call closes the rollout, after TRL's log-prob forwards; `wrap_generation` times
`GRPOTrainer._generate` itself, a private method a TRL release may rename (it then says so and the probe's
times are used). With transformers' generate a generation batch decodes together until its longest sample
ends: the default `slots`. One process only: under several ranks each sees its own share.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar

from transformers import TrainerCallback

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics
from reference_trainer.trace.records import extend_jsonl, write_json
from reference_trainer.trace.schema import REWARD, ROLLOUT, UPDATE, phase_event
from rlbench.integrations import lengthlog, run, trl_logs
from rlbench.integrations.imports import ImportConfig
from rlbench.integrations.lengthlog import Group
from rlbench.integrations.trl_logs import LENGTH_COLUMN, TRL_KEYS
from rlbench.rundirs import claim
from rlbench.simulate.whatif import logged_update_cost

METHOD = [
    "Per step: the rollout from the step's start (or, with wrap_generation, from GRPOTrainer._generate's "
    "start) to the length probe's call (or _generate's end); the update from the probe's call to the "
    "step's end.",
    "Every sample's length is its completion_ids as TRL hands them to the reward functions (the stop "
    "token included); its group is its run of num_generations samples.",
    "The slots are rebuilt from those lengths: a generation batch decodes together until its longest "
    "sample ends (continuous batching when fewer slots are given), spread over the measured rollout time.",
]
SOURCE = "rlbench.integrations.trl callback"
MARKER = "imported.json"  # what the folder holds (rlbench/rundirs.py MARKERS), written when it is claimed
RUN_FILES = (MARKER, "trace.jsonl", "lengths.jsonl", "metrics.json", "report.html")  # a recorded run's
LIMITS = [
    "TRL has no per-sample finish times: when each sample ended is rebuilt from its length, assuming equal "
    "decode steps.",
    "Without wrap_generation the rollout phase includes TRL's log-prob forwards before the rewards.",
    "TRL's profiling timers go to wandb/mlflow/trackio, not to callbacks: they are not read.",
    "No GPU timeline: run under `rlbench profile -- python train.py` for NVML samples.",
]


class LengthProbe:
    """A reward function that returns 0 for every sample and records its length (weight 0 in TRL)."""

    __name__ = "rlbench_length_probe"  # TRL names a reward function's logs by its __name__

    def __init__(self, recorder: RLBenchRecorder) -> None:
        self.recorder = recorder

    def __call__(
        self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **kwargs: Any
    ) -> list[float]:
        lengths = [len(ids) for ids in completion_ids]
        self.recorder.samples(prompts, lengths)
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):  # with log_completions=True, TRL's completions parquet keeps them too
            log_extra(LENGTH_COLUMN, lengths)
        return [0.0] * len(completion_ids)


class RLBenchRecorder(TrainerCallback):
    """The TrainerCallback that writes the run folder; `probe` is its length-probe reward. Every argument is
    checked and the folder claimed here, before training starts, and held until the run ends (the rules:
    docs/integrations.md, "TRL"; rlbench/rundirs.py)."""

    _recording: ClassVar[set[Path]] = set()  # folders a recorder of this process holds

    def __init__(
        self,
        out: str | Path,
        slots: int | None = None,
        whatif_workers: tuple[int, ...] | None = None,
        gpu: str = "h100",
        model_size: str = "7b",
        overwrite: bool = False,
    ) -> None:
        if not isinstance(out, (str, Path)) or not str(out):
            raise UserError(f"RLBenchRecorder: the run folder must be a path, got {out!r}")
        if not isinstance(overwrite, bool):  # bool('false') is True: only a real bool may remove a run
            raise UserError(f"RLBenchRecorder: overwrite must be True or False, got {overwrite!r}")
        workers = tuple(whatif_workers) if isinstance(whatif_workers, (list, tuple)) else whatif_workers
        self.config = ImportConfig(Path(out), slots, workers, gpu, model_size).check()
        self.out, self.slots = self.config.out, slots
        self._held = ExitStack()
        self._claim(overwrite)
        self.probe = LengthProbe(self)
        self.group_size = 1
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self.groups: list[Group] = []
        self.trl_logs: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = []
        self._step = 0
        self._begin = 0.0
        self._gen: tuple[float, float] | None = None
        self._probe_at: float | None = None
        self._prompt_tokens: list[int] | None = None
        self._step_groups: list[Group] = []
        self._wrapped = False
        self._finished = False

    def _claim(self, overwrite: bool) -> None:
        """Hold the run folder until `finish`, and mark it as a recording (imported.json) at once, so every
        other command sees what it holds while TRL trains."""
        key = self.out.resolve()
        if key in self._recording:
            raise UserError(f"{self.out} is being recorded by another RLBenchRecorder in this process")
        with ExitStack() as held:
            held.enter_context(claim(self.out, "import", accepts=("import",)))
            recorded = [name for name in RUN_FILES if (self.out / name).exists()]
            if recorded and not overwrite:
                raise UserError(
                    f"{self.out} already holds a recorded or imported run ({recorded[0]}): pass "
                    "overwrite=True to replace it, or record into another folder"
                )
            for name in recorded:
                (self.out / name).unlink()
            write_json(
                self.out / MARKER,
                {"kind": "import", "framework": "TRL GRPOTrainer", "source": SOURCE, "recording": True},
            )
            self._held = held.pop_all()
        self._recording.add(key)

    def _release(self) -> None:
        self._held.close()
        self._recording.discard(self.out.resolve())

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def wrap_generation(self, trainer: Any) -> None:
        """Time GRPOTrainer._generate (exact generation phase) and read the prompts' token counts from it."""
        original: Callable[..., Any] | None = getattr(trainer, "_generate", None)
        if original is None:
            self.notes.append("this TRL has no GRPOTrainer._generate: generation times are the probe's")
            return

        @wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self._now()
            result = original(*args, **kwargs)
            self._gen = (start, self._now())
            prompt_ids = result[0] if isinstance(result, tuple) and result else None
            if isinstance(prompt_ids, list):
                self._prompt_tokens = [len(ids) for ids in prompt_ids]
            return result

        trainer._generate = timed
        self._wrapped = True

    # --- the probe's records -----------------------------------------------------------------------------

    def samples(self, prompts: list[Any], lengths: list[int]) -> None:
        """One generation batch's prompts and completion lengths, in TRL's order: groups of num_generations.
        An evaluation's batch (after on_step_end) is dropped at the next on_step_begin."""
        self._probe_at = self._now()
        counts = (
            self._prompt_tokens if self._prompt_tokens and len(self._prompt_tokens) == len(lengths) else None
        )
        size = max(1, self.group_size)
        for first in range(0, len(lengths), size):
            prompt = prompts[first] if first < len(prompts) else ""
            name = hashlib.sha1(repr(prompt).encode()).hexdigest()[:12]  # the same prompt keeps its name
            group = tuple(max(1, n) for n in lengths[first : first + size])
            self._step_groups.append(Group(self._step, name, group, counts[first] if counts else 0))

    # --- TrainerCallback ---------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._finished:
            raise UserError(f"this RLBenchRecorder has finished its run in {self.out}: make a new one")
        self.group_size = int(getattr(args, "num_generations", 1) or 1)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # TRL's number for this step: global_step once it ends, the number its logs and parquet carry
        self._step, self._begin = int(state.global_step) + 1, self._now()
        self._gen, self._probe_at, self._prompt_tokens, self._step_groups = None, None, None, []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = self._now()
        events: list[dict[str, Any]] = []
        update_from = self._probe_at if self._probe_at is not None else self._begin
        if self._step_groups:  # this step generated (with steps_per_generation > 1, not every step does)
            window = self._gen or (self._begin, update_from)
            events.append(phase_event(ROLLOUT, window[0], window[1], step=self._step, source="trl"))
            slots = self.slots or sum(len(g.lengths) for g in self._step_groups)
            events += lengthlog.rebuild(self._step_groups, slots, {self._step: window}, phases=False)
            self.groups += self._step_groups
        events.append(phase_event(UPDATE, update_from, end, step=self._step))
        self.events += events
        extend_jsonl(self.out / "trace.jsonl", events)  # durable per step: a killed run keeps its steps

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if logs and "step_time" in logs:  # a training step's log (not the run's closing summary)
            step = int(state.global_step)
            self.trl_logs[step] = {k: logs[k] for k in TRL_KEYS if k in logs}
            rollouts = [e for e in self.events if e["kind"] == ROLLOUT and e["step"] == step]
            if rollouts and isinstance(logs.get("reward"), (int, float)):  # TRL's reward, on the trace
                at = rollouts[-1]["t_end"]
                event = phase_event(REWARD, at, at, step=step, reward_mean=logs["reward"])
                self.events.append(event)
                extend_jsonl(self.out / "trace.jsonl", [event])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finish()

    def finish(self) -> dict[str, Any]:
        """Write metrics.json and report.html from everything recorded (on_train_end calls it), and give the
        folder up."""
        if self._finished:
            raise UserError(f"this RLBenchRecorder has already finished its run in {self.out}")
        try:
            return self._write()
        finally:
            self._finished = True
            self._release()

    def _write(self) -> dict[str, Any]:
        batches = [sum(len(g.lengths) for g in gs) for gs in lengthlog.by_step(self.groups).values()]
        slots = self.slots or max(batches, default=None)
        ours = {s["step"]: s for s in metrics.step_metrics(self.events)}
        per_step = []
        for step, logged in sorted(self.trl_logs.items()):
            mine = ours.get(step, {})
            per_step.append({"step": step, **{f"TRL {k}": v for k, v in logged.items()},
                             "rlbench step_time_s": mine.get("step_time_s"),
                             "rlbench timing_s/gen": mine.get("timing_s/gen"),
                             "rlbench response_len_mean": mine.get("response_len_mean"),
                             "rlbench bubble_ratio": mine.get("bubble_ratio")})  # fmt: skip
        if not self.groups:
            self.notes.append("the length probe was never called: add recorder.probe to reward_funcs")
        info = {"method": METHOD + self.notes, "limits": LIMITS, "per_step": per_step}
        meta = {"framework": "TRL GRPOTrainer", "source": SOURCE,
                "slots_per_worker": slots, "time_unit": "s", "checked_against": trl_logs.CHECKED_AT,
                "rollout_timed_by": "GRPOTrainer._generate" if self._wrapped else "length probe"}  # fmt: skip
        whatif = None
        if self.groups and slots:
            cfg = self.config
            whatif = run.whatif(self.groups, slots, cfg.workers, cfg.gpu, cfg.model_size,
                                logged_update_cost(self.events))  # fmt: skip
        return run.write_run(self.out, [self.events], self.groups, meta, info, whatif)
