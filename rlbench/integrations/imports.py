"""`rlbench import`'s two jobs, each one function over one checked config: a length log, a verl log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError, check_integer
from reference_trainer.trace import metrics
from rlbench.integrations import lengthlog, run, trl_logs, verl
from rlbench.integrations.lengthlog import Group
from rlbench.simulate.config import MAX_SIM_WORKERS
from rlbench.simulate.cost import preset
from rlbench.simulate.whatif import logged_update_cost

Event = dict[str, Any]

LENGTH_METHOD = [
    "Each step's samples run in log order under continuous batching with the given slots per worker, one "
    "token per running sample per decode step: a synchronous rollout, rebuilt in decode steps.",
    "The bubble, tail share and tokens are computed from that trace by reference_trainer.trace.metrics; "
    "the decode-step bubble is exact for that batch, the time axis assumes equal decode steps.",
]


@dataclass(frozen=True)
class ImportConfig:
    out: Path
    slots: int | None = None  # per worker; None: every sample of a step has a slot
    workers: tuple[int, ...] | None = None  # worker counts of the what-if; None: the log's scale decides
    gpu: str = "h100"
    model_size: str = "7b"

    def check(self) -> ImportConfig:
        """Every setting in range before anything is read (`rlbench import`, and the TRL callback before
        training starts): one line naming the first that is not."""
        if not isinstance(self.out, Path):
            raise UserError(f"the run folder must be a path, got {self.out!r}")
        if self.slots is not None:
            check_integer("--slots", self.slots, low=1)
        if self.workers is not None:
            if not isinstance(self.workers, tuple) or not self.workers:
                raise UserError(f"--workers: give worker counts, got {self.workers!r}")
            for count in self.workers:  # the simulator's --workers rule
                check_integer("--workers", count, low=1, high=MAX_SIM_WORKERS)
        if not isinstance(self.gpu, str) or not isinstance(self.model_size, str):
            raise UserError(f"--gpu and --model-size are names, got {self.gpu!r} and {self.model_size!r}")
        preset(self.gpu, self.model_size)  # an unknown preset fails here, before any file is read
        return self


def _slots(groups: list[Group], given: int | None) -> int:
    if given is not None:
        return given
    per_engine: Counter[tuple[int, int]] = Counter()
    for g in groups:
        per_engine[g.step, g.worker] += len(g.lengths)
    return max(per_engine.values())


def _whatif(
    groups: list[Group], slots: int, cfg: ImportConfig, events: Sequence[Event] = ()
) -> dict[str, Any]:
    """The what-if, its trainer's update at the log's own cost where the log times it (a length log has no
    clock: no events)."""
    return run.whatif(groups, slots, cfg.workers, cfg.gpu, cfg.model_size, logged_update_cost(events))


def import_lengths(path: Path, cfg: ImportConfig) -> dict[str, Any]:
    """A length log -> a run folder (cfg.out): the rebuilt synchronous batches, their metrics, the what-if."""
    groups = lengthlog.read(path)
    slots = _slots(groups, cfg.slots)
    steps = lengthlog.rebuild_steps(groups, slots)  # written step by step: never all events at once
    info = {
        "method": LENGTH_METHOD,
        "limits": [
            "A length log has no clock: times are decode steps (one time unit each), so tokens/s and "
            "step times are per decode step, not per second."
        ],
    }
    meta = {
        "framework": "length log",
        "source": str(path),
        "slots_per_worker": slots,
        "time_unit": "decode step",
    }
    whatif = _whatif(groups, slots, cfg)
    return run.write_run(cfg.out, steps, groups, meta, info, whatif, lengthlog.capacities(groups, slots))


def load_tokenizer(path: Path) -> Any:
    """A tokenizer from a local directory (never the network): the run's, to count tokens of decoded text."""
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise UserError(
            f"{path}: not a directory holding a tokenizer (tokenizer.json, tokenizer_config.json)"
        )
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a foreign folder fails anywhere in transformers or tokenizers
        why = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise UserError(f"{path}: cannot load a tokenizer ({type(err).__name__}: {why})") from None


def import_verl(
    log: Path, rollout_dir: Path | None, tokenizer: Path | None, cfg: ImportConfig
) -> dict[str, Any]:
    """A verl file log (+ rollout_data_dir dumps) -> a run folder (cfg.out)."""
    if rollout_dir is not None and tokenizer is None:
        raise UserError(
            "--rollout-dir needs --tokenizer DIR (the run's tokenizer, to count the texts' tokens)"
        )
    steps, notes = verl.read_log(log)
    events, windows = verl.timeline(steps)
    groups: list[Group] = []
    method = [
        "Steps laid end to end in verl's fit() order: rollout for timing_s/gen from each step's start, "
        "the reward, the trainer's work (old_log_prob, ref, values, adv, update_critic, update_actor: "
        "rlbench update phases), the weight sync (update_weights or param_sync); the step ends at "
        "timing_s/step. Steps keep verl's numbers (global_steps, from 1)."
    ]
    generations = verl.key_generations(steps)
    method += [f"{key}: read as written by {where}" for key, where in generations.items()]
    if rollout_dir is not None:
        found = verl.read_rollout_dir(rollout_dir, load_tokenizer(tokenizer))  # type: ignore[arg-type]
        groups = [g for g in found if g.step in steps]
        if len(groups) < len(found):
            notes.append(f"{len(found) - len(groups)} group(s) of steps the log does not have were left out")
        if not groups:
            raise UserError(f"{rollout_dir}: none of its steps is a training step of {log}")
        slots = _slots(groups, cfg.slots)
        events += lengthlog.rebuild(groups, slots, windows, phases=False)
        method += LENGTH_METHOD
    rows = verl.per_step(steps)
    for row, computed in zip(rows, metrics.step_metrics(events), strict=True):
        row["rlbench bubble_ratio"] = computed["bubble_ratio"]  # null without per-sample lengths
    info = {"method": method + notes, "limits": verl.LIMITS, "per_step": rows, "key_generations": generations}
    meta = {
        "framework": "verl",
        "source": str(log),
        "rollout_dir": str(rollout_dir) if rollout_dir else None,
        "slots_per_worker": _slots(groups, cfg.slots) if groups else None,
        "time_unit": "s",
        "checked_against": verl.CHECKED_AT,
    }
    whatif = _whatif(groups, meta["slots_per_worker"], cfg, events) if groups else None
    return run.write_run(cfg.out, [events], groups, meta, info, whatif)


def import_trl(output_dir: Path, tokenizer: Path | None, cfg: ImportConfig) -> dict[str, Any]:
    """A finished TRL GRPOTrainer run (completions parquet, trainer_state.json) -> a run folder."""
    if not output_dir.is_dir():
        raise UserError(f"{output_dir}: not a directory (TRL's output_dir)")
    loaded = load_tokenizer(tokenizer) if tokenizer else None
    groups = trl_logs.read_completions(output_dir / "completions", loaded)
    slots = _slots(groups, cfg.slots)
    events = lengthlog.rebuild(groups, slots)
    state = trl_logs.find_state(output_dir)
    logged = trl_logs.read_state(state) if state else {}
    events += trl_logs.reward_phases(events, logged)
    ours = {s["step"]: s for s in metrics.step_metrics(events)}
    rows = [
        {
            "step": step,
            **{f"TRL {k}": v for k, v in figures.items()},
            "rlbench bubble_ratio": ours.get(step, {}).get("bubble_ratio"),
        }
        for step, figures in sorted(logged.items())
    ]
    method = LENGTH_METHOD + [
        f"TRL's per-step figures from {state}"
        if state
        else "no trainer_state.json: TRL's own figures not shown"
    ]
    info = {"method": method, "limits": trl_logs.LIMITS, "per_step": rows}
    meta = {
        "framework": "TRL GRPOTrainer",
        "source": str(output_dir),
        "slots_per_worker": slots,
        "time_unit": "decode step",
        "checked_against": trl_logs.CHECKED_AT,
    }
    return run.write_run(cfg.out, [events], groups, meta, info, _whatif(groups, slots, cfg, events))
