"""Trainer modes: a rollout strategy (who is admitted, what an update consumes) plus, optionally,
speculative decoding attached to the engine. `sorted+rhyme` is SortedRL's strategy with HistoSpec drafting.

Issues add modes by adding entries here; the trainer loop never branches on a mode's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference_trainer.rollout.base import RolloutStrategy, SynchronousRollout
from reference_trainer.rollout.placed import PlacedRollout
from reference_trainer.rollout.sorted import SortedController, SortedPartialController

STRATEGIES: dict[str, type] = {
    "baseline": SynchronousRollout,
    "sorted": SortedController,
    "sorted-partial": SortedPartialController,
    "placed": PlacedRollout,  # the baseline over W > 1 workers with a placement policy
}


@dataclass(frozen=True)
class Mode:
    name: str
    strategy: str  # a key of STRATEGIES
    speculative: bool = False  # attach HistoSpec drafting to the engine
    # Truncated-importance-sampling cap for modes that train on tokens of older policies (GRPOConfig.tis_cap
    # takes it when the run's config leaves that None); None = no off-policy correction.
    tis_cap: float | None = None
    # With --workers > 1: how groups are placed on workers (placement.py); None = the mode needs one engine.
    placement: str | None = "round-robin"

    def strategy_for(self, workers: int) -> str:
        if workers <= 1:
            return self.strategy
        if self.placement is None:
            multi = ", ".join(m.name for m in MODES.values() if m.placement is not None)
            raise ValueError(f"mode {self.name!r} runs on one engine; --workers > 1 supports: {multi}")
        return "placed"


MODES: dict[str, Mode] = {
    "baseline": Mode("baseline", strategy="baseline"),
    "sorted": Mode("sorted", strategy="sorted", placement=None),
    "sorted-partial": Mode("sorted-partial", strategy="sorted-partial", tis_cap=2.0, placement=None),
    # HistoPipe without HistoSpec; on one worker it is the baseline.
    "histopipe": Mode("histopipe", strategy="baseline", placement="histopipe"),
    # RhymeRL: HistoSpec drafting, and HistoPipe placement when there are several workers.
    "rhyme": Mode("rhyme", strategy="baseline", speculative=True, placement="histopipe"),
    "sorted+rhyme": Mode("sorted+rhyme", strategy="sorted", speculative=True, placement=None),
}


def get_mode(name: str) -> Mode:
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; valid: {', '.join(MODES)}")
    return MODES[name]


def make_strategy(name: str, **options: Any) -> RolloutStrategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](**options)


def make_mode_strategy(mode: Mode, workers: int, options: dict[str, Any]) -> RolloutStrategy:
    """The mode's strategy for `workers` rollout workers; a placement mode option overrides the mode's."""
    name = mode.strategy_for(workers)
    if name == "placed":
        options = {"placement": mode.placement, **options}
    else:
        options = {k: v for k, v in options.items() if k not in ("placement", "migrate", "order")}
    return make_strategy(name, **options)
