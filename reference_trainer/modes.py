"""Modes, defined once: each mode is a rollout strategy plus, optionally, HistoSpec speculation, a placement
over W > 1 workers and an off-policy correction, with typed options.

`rlbench train/profile/compare` build the trainer from this registry, `rlbench simulate` builds its policies
from it (rlbench/simulate/modes.py), and `rlbench modes` prints it. So a mode name means one algorithm
everywhere; where the simulator only approximates part of a mode, `simulator_note` says how.

This module imports nothing heavy (no torch): strategy classes are resolved by import path only when a
strategy is built, so `rlbench --help`, `rlbench modes` and CLI validation stay instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from reference_trainer.rollout.placement import ORDERS, PLACEMENTS

# One-engine strategies by name; "placed" is the synchronous baseline spread over a WorkerPool.
STRATEGY_PATHS: dict[str, str] = {
    "baseline": "reference_trainer.rollout.base:SynchronousRollout",
    "sorted": "reference_trainer.rollout.sorted:SortedController",
    "sorted-partial": "reference_trainer.rollout.sorted:SortedPartialController",
    "placed": "reference_trainer.rollout.placed:PlacedRollout",
}
STRATEGY_TITLES = {
    "baseline": "synchronous",
    "sorted": "SortedRL, on-policy",
    "sorted-partial": "SortedRL, partial rollouts",
    "placed": "synchronous over W workers",
}


def _resolve(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class _LazyClasses(Mapping[str, type]):
    """name -> class, imported on first access (the strategies import torch)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self._paths = paths

    def __getitem__(self, name: str) -> type:
        return _resolve(self._paths[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


STRATEGIES: Mapping[str, type] = _LazyClasses(STRATEGY_PATHS)

_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


@dataclass(frozen=True)
class Option:
    """One `--mode-option KEY=VALUE`: its JSON type, default and meaning."""

    name: str  # histospec options are "histospec.<key>"
    type: str  # int | float | bool | str | list[int] | list
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    nullable: bool = False  # JSON null is allowed (and usually the default: "the component decides")
    multi_worker: bool = False  # takes effect only with --workers > 1
    simulated: bool = False  # rlbench simulate models it

    def check(self, value: Any) -> Any:
        """The value if it has this option's type, else a one-line ValueError."""
        if value is None and self.nullable:
            return None
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "list[int]": isinstance(value, list) and all(type(v) is int for v in value),
            "list": isinstance(value, list),
        }[self.type]
        if not ok:
            want = _TYPE_WORDS.get(self.type, f"a JSON {self.type}")
            raise ValueError(f"option {self.name} must be {want}{' or null' * self.nullable}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"unknown {self.name} {value!r}; valid: {', '.join(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"option {self.name} must be >= {self.minimum:g}, got {value!r}")
        return float(value) if self.type == "float" else value

    def shown_default(self) -> str:
        if self.default is None:
            return "auto" if self.nullable and self.name in ("migrate", "order") else "none"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, (list, tuple)):
            return "[" + ",".join(str(v) for v in self.default) + "]"
        return str(self.default)


SORTED_OPTIONS = (
    Option(
        "oversubscription",
        "float",
        2.0,
        "unfinished samples allowed at once, as a multiple of one "
        "update's (prompts admitted beyond the update: the early-termination pool)",
        minimum=1.0,
        simulated=True,
    ),
    Option(
        "max_staleness",
        "int",
        1,
        "a kept sample whose oldest token is more policy versions old than "
        "this is regenerated (no effect on-policy: nothing outlives an update)",
        minimum=0,
        simulated=True,
    ),
    Option(
        "max_attempts",
        "int",
        None,
        "drop a prompt after this many regenerations; none = never",
        minimum=1,
        nullable=True,
    ),
    Option(
        "refill_margin",
        "int",
        None,
        "requests kept queued beyond the free slots; none = group_size",
        minimum=0,
        nullable=True,
    ),
)
PLACED_OPTIONS = (
    Option(
        "placement",
        "str",
        "round-robin",
        "which worker runs which request (rollout/placement.py)",
        choices=tuple(PLACEMENTS),
        multi_worker=True,
        simulated=True,
    ),
    Option(
        "migrate",
        "bool",
        None,
        "straggler migration: a worker that runs dry takes not-started requests "
        "from the busiest; auto = on for histopipe placement",
        nullable=True,
        multi_worker=True,
        simulated=True,
    ),
    Option(
        "order",
        "str",
        None,
        "each worker's queue order; auto = alternate for histopipe placement, else fifo",
        choices=ORDERS,
        nullable=True,
        multi_worker=True,
        simulated=True,
    ),
)
# HistoSpec on the reference engine: HistoryDrafter's and Speculator's constructor arguments
# (rollout/histospec.py attach_histospec), except the Speculator's accept_rule, a callable.
HISTOSPEC_OPTIONS = tuple(
    Option(f"histospec.{name}", kind, default, text, minimum=low, nullable=nullable, simulated=sim)
    for name, kind, default, low, nullable, sim, text in (
        ("max_prompts", "int", 4096, 1, False, False, "prompts with a history (LRU)"),
        ("max_responses", "int", 16, 1, False, False, "responses kept per prompt"),
        ("max_epochs", "int", 2, 1, False, False, "policy versions a history spans"),
        ("min_draft", "int", 1, 1, False, False, "shortest adaptive draft"),
        ("max_draft", "int", 8, 1, False, True, "longest adaptive draft"),
        ("init_draft", "int", 4, 1, False, False, "a new sequence's draft length"),
        ("min_match", "int", 1, 0, False, False, "shortest suffix match that may draft"),
        ("rematch_window", "int", 64, 1, False, False, "tokens re-matched after a history change"),
        ("min_confidence", "float", 0.5, 0, False, False, "stop a draft below this cumulative share"),
        ("cost_model", "list", None, None, True, False, "[[batch, q, seconds], ...]; none = measure"),
        ("margin", "float", 0.05, 0, False, False, "verify only when it beats decode by this share"),
        ("prior_acceptance", "float", 0.7, 0, False, False, "acceptance assumed before any is seen"),
        ("prior_weight", "float", 8.0, 0, False, False, "weight of that prior, in draft positions"),
        ("decay", "float", 0.98, 0, False, False, "per-step decay of the acceptance counts"),
        ("cost_batches", "list[int]", [1, 4, 16, 64], None, False, False, "batch sizes the cost table times"),
        ("cost_qs", "list[int]", [1, 2, 4, 8, 16], None, False, False, "verify widths the cost table times"),
        ("cost_repeats", "int", 3, 1, False, False, "timing repeats per cost-table cell"),
    )
)
# --engine vllm maps the histospec keys onto vLLM's speculative_config (engine/vllm_engine.py).
VLLM_HISTOSPEC_OPTIONS = (
    Option(
        "histospec.method",
        "str",
        "ngram",
        "vLLM drafter (suffix needs arctic-inference)",
        choices=("ngram", "suffix"),
    ),
    Option("histospec.max_draft", "int", 4, "num_speculative_tokens", minimum=1),
    Option("histospec.num_speculative_tokens", "int", 4, "alias of max_draft", minimum=1),
    Option("histospec.prompt_lookup_min", "int", 2, "shortest n-gram match (ngram)", minimum=1),
    Option("histospec.prompt_lookup_max", "int", 4, "longest n-gram match (ngram)", minimum=1),
)
STRATEGY_OPTIONS: dict[str, tuple[Option, ...]] = {
    "baseline": (),
    "sorted": SORTED_OPTIONS,
    "sorted-partial": SORTED_OPTIONS,
    "placed": PLACED_OPTIONS,
}


@dataclass(frozen=True)
class ModeSpec:
    name: str
    description: str
    strategy: str  # a key of STRATEGY_PATHS: the strategy on one worker
    speculation: str | None = None  # "histospec": HistoSpec drafting attached to every engine
    # With --workers > 1: the default placement of the "placed" strategy; None = the mode needs one engine.
    placement: str | None = "round-robin"
    # Truncated-importance-sampling cap for modes that train on tokens of older policies (GRPOConfig.tis_cap
    # takes it when the run's config leaves that None); None = no off-policy correction.
    tis_cap: float | None = None
    simulator_note: str = ""  # how `rlbench simulate` models the mode, where it only approximates it

    @property
    def speculative(self) -> bool:
        return self.speculation is not None

    def strategy_for(self, workers: int) -> str:
        if workers <= 1:
            return self.strategy
        if self.placement is None:
            multi = ", ".join(m.name for m in MODES.values() if m.placement is not None)
            raise ValueError(f"mode {self.name!r} runs on one engine; --workers > 1 supports: {multi}")
        return "placed"

    def options(self, workers: int | None = None, engine: str = "reference") -> dict[str, Option]:
        """The options this mode takes on `workers` workers (None: on any worker count, as the table and
        the simulator's sweep over worker counts see them), keyed by name, with this mode's defaults."""
        names = [self.strategy] if workers is None or workers <= 1 else [self.strategy_for(workers)]
        if workers is None and self.placement is not None:
            names.append("placed")
        out = {o.name: o for n in names for o in STRATEGY_OPTIONS[n]}
        if "placement" in out and self.placement is not None:
            out["placement"] = replace(out["placement"], default=self.placement)
        if self.speculative:
            spec = VLLM_HISTOSPEC_OPTIONS if engine == "vllm" else HISTOSPEC_OPTIONS
            out.update({o.name: o for o in spec})
        return out

    def check_options(
        self, options: Mapping[str, Any], workers: int | None = None, engine: str = "reference"
    ) -> dict[str, Any]:
        """Type-check `options` (flat keys, or histospec options nested under "histospec") against the
        registry; a one-line ValueError (callers prefix the mode) for an unknown key or a wrong type or
        value. Returns them flat."""
        accepted = self.options(workers, engine)
        out = {}
        for key, value in flatten_options(options).items():
            if key not in accepted:
                raise ValueError(f"unknown option {key}")
            out[key] = accepted[key].check(value)
        return out


def flatten_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """{"histospec": {"max_draft": 8}} -> {"histospec.max_draft": 8}."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if key == "histospec" and isinstance(value, Mapping):
            flat.update({f"histospec.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


_ONE_ENGINE_SIM = (
    "Admission is modelled as all outstanding groups queued at the step's start (the trainer admits "
    "lazily as slots free up). W > 1 is an extrapolation: the trainer runs SortedRL on one engine; the "
    "simulator gives each worker its share of the outstanding groups, placed round-robin."
)
_SPEC_SIM = (
    "HistoSpec is modelled as i.i.d. per-token acceptance (the trace's, else --acceptance) with one "
    "cost-aware draft length per run (1..histospec.max_draft), not per-sequence adaptive drafts from "
    "a history."
)
_PLACE_SIM = (
    "W > 1: histopipe placement is LPT over whole groups by predicted tokens (the trainer places each "
    "request), queues ordered as the trainer's; migration moves not-yet-admitted work from the slowest "
    "to the fastest workers, kept only when the makespan drops (the trainer steals when a worker runs "
    "dry)."
)

MODES: dict[str, ModeSpec] = {
    m.name: m
    for m in (
        ModeSpec(
            "baseline",
            "Admit the step's prompts x group_size samples and wait for the slowest.",
            strategy="baseline",
            simulator_note="Continuous batching replayed on the cost model. W > 1: round-robin places whole "
            "groups and least-outstanding deals requests by count, as the trainer's do; placement=histopipe "
            "as in mode histopipe.",
        ),
        ModeSpec(
            "sorted",
            "Oversubscribe; update on the first update_batch complete groups (shortest first); abort and "
            "regenerate the rest under the new policy.",
            strategy="sorted",
            placement=None,
            simulator_note=_ONE_ENGINE_SIM,
        ),
        ModeSpec(
            "sorted-partial",
            "As sorted, but unfinished samples keep their tokens and resume under the new weights; TIS "
            "corrects the off-policy tokens.",
            strategy="sorted-partial",
            placement=None,
            tis_cap=2.0,
            simulator_note=_ONE_ENGINE_SIM + " TIS changes the update, not the timing: not modelled.",
        ),
        ModeSpec(
            "histopipe",
            "The baseline over W workers with HistoPipe placement; on one worker it is the baseline.",
            strategy="baseline",
            placement="histopipe",
            simulator_note=_PLACE_SIM,
        ),
        ModeSpec(
            "rhyme",
            "RhymeRL: HistoSpec drafting from earlier epochs' responses, and HistoPipe placement with "
            "--workers > 1.",
            strategy="baseline",
            speculation="histospec",
            placement="histopipe",
            simulator_note=_SPEC_SIM + " " + _PLACE_SIM,
        ),
        ModeSpec(
            "sorted+rhyme",
            "SortedRL's on-policy strategy (as sorted) with HistoSpec drafting on its one engine.",
            strategy="sorted",
            speculation="histospec",
            placement=None,
            simulator_note=_ONE_ENGINE_SIM + " " + _SPEC_SIM,
        ),
    )
}


def get_mode(name: str) -> ModeSpec:
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}")
    return MODES[name]


def make_strategy(name: str, **options: Any) -> Any:
    """A RolloutStrategy by strategy name (imports it, and torch, now)."""
    if name not in STRATEGY_PATHS:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGY_PATHS)}")
    return STRATEGIES[name](**options)


def make_mode_strategy(mode: ModeSpec, workers: int, options: dict[str, Any]) -> Any:
    """The mode's strategy for `workers` rollout workers from its strategy options (histospec excluded);
    options of a placement are dropped on one worker, where there is nothing to place."""
    name = mode.strategy_for(workers)
    if name == "placed":
        options = {"placement": mode.placement, **options}
    else:
        options = {k: v for k, v in options.items() if k not in ("placement", "migrate", "order")}
    return make_strategy(name, **options)
