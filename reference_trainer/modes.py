"""Trainer modes: a rollout strategy (who is admitted, what an update consumes) plus, optionally,
speculative decoding attached to the engine. `sorted+rhyme` is SortedRL's strategy with HistoSpec drafting.

Issues add modes by adding entries here; the trainer loop never branches on a mode's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference_trainer.controller import SortedController, SortedPartialController
from reference_trainer.rollout import RolloutStrategy, SynchronousRollout

STRATEGIES: dict[str, type] = {
    "baseline": SynchronousRollout,
    "sorted": SortedController,
    "sorted-partial": SortedPartialController,
}


@dataclass(frozen=True)
class Mode:
    name: str
    strategy: str  # a key of STRATEGIES
    speculative: bool = False  # attach HistoSpec drafting to the engine
    # Truncated-importance-sampling cap for modes that train on tokens of older policies (GRPOConfig.tis_cap
    # takes it when the run's config leaves that None); None = no off-policy correction.
    tis_cap: float | None = None


MODES: dict[str, Mode] = {
    "baseline": Mode("baseline", strategy="baseline"),
    "sorted": Mode("sorted", strategy="sorted"),
    "sorted-partial": Mode("sorted-partial", strategy="sorted-partial", tis_cap=2.0),
    "rhyme": Mode("rhyme", strategy="baseline", speculative=True),
    "sorted+rhyme": Mode("sorted+rhyme", strategy="sorted", speculative=True),
}


def get_mode(name: str) -> Mode:
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; valid: {', '.join(MODES)}")
    return MODES[name]


def make_strategy(name: str, **options: Any) -> RolloutStrategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](**options)
