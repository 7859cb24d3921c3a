"""One `rlbench simulate` run as a checked config (`SimConfig.check()`), and the run itself (`run`): the cost
model (a preset, or fitted to a measured run), the workload (a length trace, or the synthetic one) and every
(mode, worker count) replayed through the schedulers."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reference_trainer.errors import MAX_SEED, UserError, check_integer, check_number
from reference_trainer.modes import MODES, parse_option_pairs
from reference_trainer.rollout.dispatch import make_policy
from reference_trainer.trace.steps import worker_capacities
from rlbench.simulate import simulate, workload
from rlbench.simulate.cost import fit_run, preset
from rlbench.simulate.modes import SimMode, parse_sim_modes
from rlbench.simulate.replay import read_events

MAX_SIM_STEPS = 10_000
MAX_SIM_TOKENS = 1 << 24
MAX_SIM_WORKERS = 1 << 20
MAX_SIM_SAMPLES = 1 << 26  # a synthetic workload's samples over all steps: a few arrays of this size
DEFAULT_CAPACITY = 256
# The replay's peak memory per sample outstanding in a step (its job columns, sort keys and engine state):
# about 400 bytes, measured as peak RSS of `simulate --modes sorted:oversubscription=4 --workers 64 --steps 1`
# at --prompts 2048 and 16384 (65,536 and 524,288 samples outstanding: 103 and 278 MB), 2026-11-29.
BYTES_PER_SAMPLE = 400


DEFAULT_WORKERS = (1, 8, 64, 512, 4096)
# The synthetic workload's default size, a quick one: every mode on 1, 8 and 64 workers, 4 steps of 128
# prompts x 8, took 35 s of CPU (docs/simulate.md). The run time grows with the samples replayed on few
# workers: 10 steps of 512 prompts hold ten times as many.
SYNTHETIC_WORKERS = (1, 8, 64)
SYNTHETIC_STEPS = 4
SYNTHETIC_PROMPTS = 128
# The SimConfig fields passed on by name: to the synthetic workload, and to every replay.
SYNTHETIC_SHAPE = ("group_size", "mean_tokens", "sigma", "max_tokens", "rank_corr", "overlap", "seed")
REPLAY_OPTIONS = (
    "steps",
    "groups_per_worker",
    "mode_options",
    "acceptance",
    "rank_corr",
    "max_prefill_tokens",
)
REPLAY_OPTIONS += ("seed",)


def parse_worker_counts(text: str, flag: str = "--workers") -> tuple[int, ...]:
    """Comma-separated worker counts, each 1..MAX_SIM_WORKERS (the simulator's rule, and the what-if's)."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise UserError(f"{flag}: expected positive integers, got {text!r}")
    return tuple(check_integer(flag, w, low=1, high=MAX_SIM_WORKERS) for w in counts)


@dataclass
class SimConfig:
    """One `rlbench simulate` run, one field per option (the command's help says what each does), parsed:
    worker counts as integers, the modes as a list (an entry may carry NAME:KEY=VALUE options of its own),
    --mode-option as the options every mode that takes them gets."""

    trace: Path | None = None
    synthetic: bool = False
    workers: tuple[int, ...] = DEFAULT_WORKERS
    gpu: str = "h100"
    model_size: str = "7b"
    fit: Path | None = None  # a run whose own cost model the simulator fits (`--fit`, alias `--calibrate`)
    modes: tuple[str, ...] = tuple(MODES)
    dispatch: tuple[str, ...] = ()  # --dispatch: every mode under each of these policies
    mode_options: dict[str, Any] = field(default_factory=dict)
    capacity: int | None = None
    steps: int | None = None
    groups_per_worker: int | None = None
    acceptance: float = 0.7
    rank_corr: float = 0.8
    overlap: float = 0.8
    prompts: int = SYNTHETIC_PROMPTS
    group_size: int = 8
    mean_tokens: float = 2000.0
    sigma: float = 1.0
    max_tokens: int = 16384
    max_prefill_tokens: int = 8192
    seed: int = 0

    @classmethod
    def from_cli(
        cls,
        workers: str | None,
        modes: str | None,
        mode_option: list[str] | None,
        dispatch: str | None = None,
        **rest: Any,
    ) -> SimConfig:
        """The command's options: --workers and --modes as comma-separated text (no --modes: every mode;
        no --workers: the full sweep for a trace, the quick one for the synthetic workload), --mode-option
        as KEY=VALUE pairs; parsed, then checked. No workload named: the synthetic one."""
        if rest.get("trace") is None:
            rest["synthetic"] = True
        default = DEFAULT_WORKERS if rest.get("trace") is not None else SYNTHETIC_WORKERS
        return cls(
            workers=parse_worker_counts(workers) if workers is not None else default,
            modes=tuple(m.strip() for m in (modes or ",".join(MODES)).split(",") if m.strip()),
            dispatch=tuple(p.strip() for p in (dispatch or "").split(",") if p.strip()),
            mode_options=parse_option_pairs(mode_option or [], "--mode-option"),
            **rest,
        ).check()

    def check(self) -> SimConfig:
        """Every number in range, the presets, the modes and their options known, one workload named: one line
        naming the first that is not, before anything is built."""
        for flag, value in (("--capacity", self.capacity), ("--groups-per-worker", self.groups_per_worker)):
            if value is not None:
                check_integer(flag, value, low=1)
        if not self.workers:
            raise UserError("--workers: give at least one worker count")
        for count in self.workers:
            check_integer("--workers", count, low=1, high=MAX_SIM_WORKERS)
        if self.steps is not None:
            check_integer("--steps", self.steps, low=1, high=MAX_SIM_STEPS)
        check_number("--acceptance", self.acceptance, low=0.0, high=1.0)
        check_number("--rank-corr", self.rank_corr, low=-1.0, high=1.0)
        check_number("--overlap", self.overlap, low=0.0, high=1.0)
        check_integer("--prompts", self.prompts, low=1)
        check_integer("--group-size", self.group_size, low=1)
        check_integer("--max-tokens", self.max_tokens, low=1, high=MAX_SIM_TOKENS)
        check_number("--mean-tokens", self.mean_tokens, low=1.0, high=self.max_tokens)
        check_number("--sigma", self.sigma, low=0.0, high=10.0)  # e^10: a tail far beyond any response cap
        check_integer("--max-prefill-tokens", self.max_prefill_tokens, low=1)
        check_integer("--seed", self.seed, low=0, high=MAX_SEED)
        samples = self.synthetic_prompts * self.group_size * (self.steps or SYNTHETIC_STEPS)
        if self.synthetic and samples > MAX_SIM_SAMPLES:
            raise UserError(
                f"the synthetic workload would hold {samples:,} samples; at most {MAX_SIM_SAMPLES:,} (fewer "
                "--steps, --prompts, --group-size or --groups-per-worker)"
            )
        if self.fit is None:
            preset(self.gpu, self.model_size)  # an unknown preset: one line, before the workload
        for policy in self.dispatch:
            try:
                make_policy(policy)
            except ValueError as err:
                raise UserError(f"--dispatch: {err}") from None
        if self.dispatch and (own := [m for m in self.modes if "dispatch=" in m]):
            raise UserError(f"--dispatch and a --modes entry's own dispatch ({own[0]}): give one of them")
        modes = parse_sim_modes(self.entries, self.mode_options)  # a bad name or option: before the workload
        if self.synthetic:
            groups = self.groups_per_worker * max(self.workers) if self.groups_per_worker else self.prompts
            check_outstanding(modes, groups, self.group_size)
        if (self.trace is None) == (not self.synthetic):
            raise UserError("give exactly one of --trace FILE or --synthetic")
        for flag, path in (("--trace", self.trace), ("--fit/--calibrate", self.fit)):
            if path is not None and not Path(path).exists():  # before --out is claimed (and created)
                raise UserError(f"{flag} {path}: no such trace file or run folder")
        return self

    @property
    def entries(self) -> list[str]:
        """The --modes entries, each under each --dispatch policy (`sorted:dispatch=least-tokens`)."""
        if not self.dispatch:
            return list(self.modes)
        return [f"{m}:dispatch={p}" for m in self.modes for p in self.dispatch]

    @property
    def synthetic_prompts(self) -> int:
        """Prompts per step of the synthetic workload: --prompts, or enough for --groups-per-worker."""
        return max(self.prompts, (self.groups_per_worker or 0) * max(self.workers))


def run(cfg: SimConfig, progress: Callable[[dict[str, Any], int, int], None] | None = None) -> dict[str, Any]:
    """simulate.json's document for a checked config (`progress`: simulate's, each result as it comes)."""
    capacity = cfg.capacity
    if cfg.fit is not None:
        events = read_events(cfg.fit)
        cost = fit_run(events, source=str(cfg.fit))
        capacity = capacity or max(worker_capacities(events).values(), default=DEFAULT_CAPACITY)
    else:
        cost = preset(cfg.gpu, cfg.model_size)
    if cfg.synthetic:
        shape = {k: getattr(cfg, k) for k in SYNTHETIC_SHAPE}
        lengths = workload.synthetic(
            steps=cfg.steps or SYNTHETIC_STEPS, prompts=cfg.synthetic_prompts, **shape
        )
    else:
        assert cfg.trace is not None  # check() said so
        lengths = workload.load(cfg.trace)
        check_trace_outstanding(cfg, lengths)
    replay = {k: getattr(cfg, k) for k in REPLAY_OPTIONS}
    entries, capacity = cfg.entries, capacity or DEFAULT_CAPACITY
    return simulate(lengths, cost, list(cfg.workers), entries, capacity, progress=progress, **replay)


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def check_outstanding(modes: Sequence[SimMode], groups: int, group_size: float) -> None:
    """SortedRL keeps ceil(oversubscription x B) groups outstanding in a step (B: `groups` a step trains
    on): one line, before any replay, for a mode whose outstanding samples would not fit this machine's
    memory. The bound is the work the option asks for, not a cap on its value."""
    memory = machine_memory()
    for mode in modes:
        outstanding = math.ceil(max(mode.oversub, 1.0) * groups)
        samples = math.ceil(outstanding * group_size)
        need = samples * BYTES_PER_SAMPLE
        if need > memory:
            most = memory / (BYTES_PER_SAMPLE * group_size * groups)
            raise UserError(
                f"mode {mode.name}: oversubscription {mode.oversub:,.10g} keeps {outstanding:,} groups "
                f"({samples:,} samples) outstanding per step, about {_size(need)} to replay; this machine "
                f"has {_size(memory)} of memory (room for oversubscription {most:,.0f} at most, with "
                f"{groups:,} groups a step)"
            )


def check_trace_outstanding(cfg: SimConfig, lengths: workload.LengthTrace) -> None:
    """`check_outstanding` for a length trace, once it is read (its groups a step are known only then)."""
    width = int(lengths.prompt.max(initial=0)) + 1
    groups = np.unique(lengths.step.astype(np.int64) * width + lengths.prompt)  # (step, prompt) pairs
    if groups.size == 0:
        return
    per_step = int(np.unique(groups // width, return_counts=True)[1].max())
    b = cfg.groups_per_worker * max(cfg.workers) if cfg.groups_per_worker else per_step
    check_outstanding(parse_sim_modes(cfg.entries, cfg.mode_options), b, len(lengths) / groups.size)
