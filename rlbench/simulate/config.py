"""One `rlbench simulate` run as a checked config (`SimConfig.check()`), and the run itself (`run`): the cost
model (a preset, or fitted to a measured run), the workload (a length trace, or the synthetic one) and every
(mode, worker count) replayed through the schedulers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_SEED, UserError, check_integer, check_number
from reference_trainer.mode_options import parse_option_pairs
from reference_trainer.modes import MODES
from reference_trainer.trace.schema import DECODE, PREFILL
from rlbench.simulate import simulate, workload
from rlbench.simulate.cost import calibrate as fit
from rlbench.simulate.cost import preset
from rlbench.simulate.modes import parse_sim_modes
from rlbench.simulate.replay import read_events

MAX_SIM_STEPS = 10_000
MAX_SIM_TOKENS = 1 << 24
MAX_SIM_WORKERS = 1 << 20
MAX_SIM_SAMPLES = 1 << 26  # a synthetic workload's samples over all steps: a few arrays of this size
DEFAULT_CAPACITY = 256


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{what}: expected positive integers, got {text!r}")
    return values


@dataclass
class SimConfig:
    """The options of `rlbench simulate`, one field each (the command's help says what each does)."""

    trace: Path | None = None
    synthetic: bool = False
    workers: str = "1,8,64,512,4096"
    gpu: str = "h100"
    model_size: str = "7b"
    calibrate: Path | None = None
    modes: str | None = None  # None: every mode
    mode_option: list[str] = field(default_factory=list)
    capacity: int | None = None
    steps: int | None = None
    groups_per_worker: int | None = None
    acceptance: float = 0.7
    rank_corr: float = 0.8
    overlap: float = 0.8
    prompts: int = 512
    group_size: int = 8
    mean_tokens: float = 2000.0
    sigma: float = 1.0
    max_tokens: int = 16384
    max_prefill_tokens: int = 8192
    validate: Path | None = None
    seed: int = 0

    def check(self) -> None:
        """Every number in range, the modes and their options known, one workload named: one line naming the
        first that is not, before anything is built."""
        for flag, value in (("--capacity", self.capacity), ("--groups-per-worker", self.groups_per_worker)):
            if value is not None:
                check_integer(flag, value, low=1)
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
        samples = self.synthetic_prompts * self.group_size * (self.steps or 10)  # checks --workers too
        if self.synthetic and samples > MAX_SIM_SAMPLES:
            raise UserError(
                f"the synthetic workload would hold {samples:,} samples; at most {MAX_SIM_SAMPLES:,} (fewer "
                "--steps, --prompts, --group-size or --groups-per-worker)"
            )
        if self.validate is not None:
            return  # a validation replays its own run: modes and workload are its own
        parse_sim_modes(self.mode_names, self.options)  # a bad name or option fails before the workload
        if (self.trace is None) == (not self.synthetic):
            raise UserError("give exactly one of --trace FILE or --synthetic")

    @property
    def worker_counts(self) -> list[int]:
        counts = _ints(self.workers, "--workers")
        return [check_integer("--workers", w, low=1, high=MAX_SIM_WORKERS) for w in counts]

    @property
    def mode_names(self) -> list[str]:
        return [m.strip() for m in (self.modes or ",".join(MODES)).split(",") if m.strip()]

    @property
    def options(self) -> dict[str, Any]:
        return parse_option_pairs(self.mode_option, "--mode-option")

    @property
    def synthetic_prompts(self) -> int:
        """Prompts per step of the synthetic workload: --prompts, or enough for --groups-per-worker."""
        return max(self.prompts, (self.groups_per_worker or 0) * max(self.worker_counts))


def run(cfg: SimConfig) -> dict[str, Any]:
    """simulate.json's document for a checked config."""
    capacity = cfg.capacity
    if cfg.calibrate is not None:
        events = read_events(cfg.calibrate)
        cost = fit(events, source=str(cfg.calibrate))
        caps = [int(e.get("capacity", 0)) for e in events if e.get("kind") in (PREFILL, DECODE)]
        capacity = capacity or max(caps, default=DEFAULT_CAPACITY)
    else:
        cost = preset(cfg.gpu, cfg.model_size)
    if cfg.synthetic:
        lengths = workload.synthetic(
            steps=cfg.steps or 10,
            prompts=cfg.synthetic_prompts,
            group_size=cfg.group_size,
            mean_tokens=cfg.mean_tokens,
            sigma=cfg.sigma,
            max_tokens=cfg.max_tokens,
            rank_corr=cfg.rank_corr,
            overlap=cfg.overlap,
            seed=cfg.seed,
        )
    else:
        assert cfg.trace is not None  # check() said so
        lengths = workload.load(cfg.trace)
    return simulate(
        lengths,
        cost,
        cfg.worker_counts,
        cfg.mode_names,
        capacity or DEFAULT_CAPACITY,
        steps=cfg.steps,
        groups_per_worker=cfg.groups_per_worker,
        mode_options=cfg.options,
        acceptance=cfg.acceptance,
        rank_corr=cfg.rank_corr,
        max_prefill_tokens=cfg.max_prefill_tokens,
        seed=cfg.seed,
    )
