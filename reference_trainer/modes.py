"""Modes, defined once: each mode is a rollout strategy plus, optionally, speculation (HistoSpec's,
SuffixDecoding's or lookahead drafts), lookahead in the bubble, a dispatch policy over W > 1 workers and an
off-policy correction, with typed options.

`rlbench train/profile/compare` build the trainer from this registry, `rlbench simulate` builds its policies
from it (rlbench/simulate/modes.py), and `rlbench modes` prints it. So a mode name means one algorithm
everywhere; where the simulator only approximates part of a mode, `simulator_note` says how.

This module imports nothing heavy (no torch): strategy classes are resolved by import path only when a
strategy is built, and the drafter table (speculation/drafters.py) holds classes that import no torch, so
`rlbench --help`, `rlbench modes` and CLI validation stay instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.option import Option, Options, options_of
from reference_trainer.rollout.base import AheadOptions
from reference_trainer.rollout.dispatch import CONTROLLER_TAKES, DispatchOptions, renamed_option
from reference_trainer.rollout.sorted import SortedOptions
from reference_trainer.speculation.drafters import (
    SPEC,
    SpeculationOptions,
    VLLMSpecOptions,
    drafters_taking,
    spec_options,
    vllm_spec_options,
)
from reference_trainer.speculation.lookahead import LookaheadOptions
from reference_trainer.trace.records import decode_json


@dataclass(frozen=True)
class Strategy:
    """A rollout strategy: its class, by import path (imported when one is built: strategies import torch),
    its title and the record of its options (None: it takes none)."""

    path: str  # "module:Class"
    title: str
    options: type[Options] | None = None

    def load(self) -> type:
        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)


# The rollout strategies by name, in one table; "placed" is the synchronous baseline spread over a WorkerPool.
STRATEGY_TABLE: dict[str, Strategy] = {
    "baseline": Strategy("reference_trainer.rollout.base:SynchronousRollout", "synchronous"),
    "sorted": Strategy(
        "reference_trainer.rollout.sorted:SortedRollout", "SortedRL, on-policy", SortedOptions
    ),
    "sorted-partial": Strategy(
        "reference_trainer.rollout.sorted:SortedPartialRollout", "SortedRL, partial rollouts", SortedOptions
    ),
    "placed": Strategy(
        "reference_trainer.rollout.placed:PlacedRollout", "synchronous over W workers", DispatchOptions
    ),
}


@dataclass(frozen=True)
class ModeOptions:
    """A run's mode options as the records its parts take: the strategy's, the rollout run ahead's, the
    speculation's (a SpeculationOptions on the reference engine, a VLLMSpecOptions on vLLM)."""

    strategy: Options | None = None
    ahead: AheadOptions | None = None
    speculation: SpeculationOptions | VLLMSpecOptions | None = None
    dispatch: DispatchOptions | None = None  # a controlled mode's on W > 1 engines (rollout/multi.py)


@dataclass(frozen=True)
class ModeSpec:
    name: str
    description: str
    strategy: str  # a key of STRATEGY_TABLE: the strategy on one worker
    # The drafter attached to every engine (speculation/drafters.py DRAFTERS): the default of spec.drafter.
    speculation: str | None = None
    # With --workers > 1: the default dispatch policy (rollout/dispatch.py) of the "placed" strategy or of the
    # controller (SortedRL, async: rollout/multi.py); None = the trainer runs the mode on one engine (the
    # simulator spreads it by the default policy; the mode takes no dispatch option).
    dispatch: str | None = DispatchOptions.dispatch  # dispatch.DEFAULT_DISPATCH
    # Truncated-importance-sampling cap for modes that train on tokens of older policies (GRPOConfig.tis_cap
    # takes it when the run's config leaves that None); None = no off-policy correction.
    tis_cap: float | None = None
    simulator_note: str = ""  # how `rlbench simulate` models the mode, where it only approximates it
    # The strategy runs the next step's requests in the bubble (rollout/base.py BubbleFill) and the drafter
    # puts their tokens first (speculation/lookahead.py); on the reference engine.
    lookahead: bool = False
    # The strategy runs up to max_staleness steps ahead of the update, beside it (rollout/ahead.py).
    ahead: bool = False

    @property
    def speculative(self) -> bool:
        return self.speculation is not None

    def strategy_for(self, workers: int) -> str:
        if workers <= 1:
            return self.strategy
        if self.dispatch is None:
            multi = ", ".join(m.name for m in MODES.values() if m.dispatch is not None)
            raise UserError(f"mode {self.name!r} runs on one engine; --workers > 1 supports: {multi}")
        return self.strategy if self.controlled else "placed"

    @property
    def controlled(self) -> bool:
        """On W > 1 engines, the strategy runs unchanged over rollout/multi.py's controller (SortedRL, any
        rollout run ahead: its process drives the engines, and lookahead: each engine fills its own)."""
        return self.dispatch is not None and (self.strategy != "baseline" or self.ahead or self.lookahead)

    def options(self, workers: int | None = None, engine: str = "reference") -> dict[str, Option]:
        """The options this mode takes on `workers` workers (None: on any worker count, as the table and
        the simulator's sweep over worker counts see them), keyed by name, with this mode's defaults."""
        names = [self.strategy] if workers is None or workers <= 1 else [self.strategy_for(workers)]
        if workers is None and self.dispatch is not None and not self.controlled:  # placed on W > 1
            names.append("placed")
        records = [r for n in dict.fromkeys(names) if (r := STRATEGY_TABLE[n].options) is not None]
        if self.ahead:  # max_staleness (shared with SortedRL's) bounds a trained token's age either way
            records.append(AheadOptions)
        out = {o.name: o for r in records for o in options_of(r)}
        if self.controlled and (workers is None or workers > 1):  # the controller's policy and migration
            out.update({o.name: o for o in options_of(DispatchOptions) if o.name in CONTROLLER_TAKES})
        if "dispatch" in out and self.dispatch is not None:
            out["dispatch"] = replace(out["dispatch"], default=self.dispatch)
        if not self.speculative:
            return out
        if engine == "vllm":
            out.update(vllm_spec_options())
            if self.speculation == "suffix":  # vLLM's own SuffixDecoding
                out["spec.method"] = replace(out["spec.method"], default="suffix")
        else:
            out.update(spec_options())
            out["spec.drafter"] = replace(out["spec.drafter"], default=self.speculation)
        return out

    def values(
        self, options: Mapping[str, Any], workers: int = 1, engine: str = "reference"
    ) -> dict[str, Any]:
        """Every option this mode takes, as `options` (flat, checked) set them or at its default."""
        return {k: o.default for k, o in self.options(workers, engine).items()} | dict(options)

    def correction(self, options: Mapping[str, Any]) -> float | None:
        """The TIS cap of the run's update (GRPOConfig.tis_cap when the config leaves it unset): the mode's,
        except a rollout run 0 steps ahead, which is the synchronous schedule and trains on-policy."""
        if self.ahead and self.values(flatten_options(options))["max_staleness"] == 0:
            return None
        return self.tis_cap

    def speculation_options(
        self, options: Mapping[str, Any], engine: str = "reference"
    ) -> SpeculationOptions | VLLMSpecOptions:
        """The engine's speculation as its record, from a config's "spec" values, with this mode's drafter
        (or vLLM method) where they leave it out."""
        key = "method" if engine == "vllm" else "drafter"
        values = {key: self.options(1, engine)[f"{SPEC}.{key}"].default, **options}
        if engine == "vllm":
            return VLLMSpecOptions(**values)
        return SpeculationOptions.of({**values, "lookahead": self.lookahead})

    def resolve(self, options: Mapping[str, Any], workers: int = 1, engine: str = "reference") -> ModeOptions:
        """A config's (checked) mode options as the records the parts of a run on `workers` workers take (a
        dispatch's options mean nothing on one worker, where there is nothing to dispatch)."""
        flat = flatten_options(options)
        record = STRATEGY_TABLE[self.strategy_for(workers)].options
        if record is DispatchOptions:
            flat = {"dispatch": self.dispatch, **flat}
        controlled = self.controlled and workers > 1
        return ModeOptions(
            strategy=record.take(flat) if record is not None else None,
            dispatch=DispatchOptions.take({"dispatch": self.dispatch, **flat}) if controlled else None,
            ahead=AheadOptions.take(flat) if self.ahead else None,
            speculation=self.speculation_options(options.get(SPEC, {}), engine) if self.speculative else None,
        )

    def _drafter_takes(self, name: str, drafter: str | None) -> bool:
        """Whether option `name` goes with `drafter` (the speculator's options go with any; a lookahead
        mode's LookaheadDrafter takes its own in front of any drafter)."""
        owners = drafters_taking(name)
        ahead = self.lookahead and any(o.name == name for o in options_of(LookaheadOptions, f"{SPEC}."))
        return not owners or drafter in owners or ahead

    def check_options(
        self, options: Mapping[str, Any], workers: int | None = None, engine: str = "reference"
    ) -> dict[str, Any]:
        """Check `options` (flat keys, or speculation options nested under "spec") against the registry:
        a one-line UserError naming the mode for a key it does not take (on `workers` workers, with
        `engine`) or a wrong type or value. Returns them flat."""
        takes = self.options(workers, engine)
        flat = flatten_options(options)
        if (renamed := renamed_option(flat)) is not None:
            raise UserError(f"mode {self.name!r}: {renamed}")
        groups = sorted({key.split(".")[0] for key in flat if key not in takes})
        unknown = [g for g in groups if g != SPEC or not self.speculative]
        one = workers is None or workers <= 1  # an option of W > 1 engines that this run, on one, lacks
        if one and (multi := [k for k in unknown if k in self.options()]):
            raise UserError(f"mode {self.name!r} takes option {', '.join(multi)} only with --workers > 1")
        if unknown:
            raise UserError(f"mode {self.name!r} takes no option {', '.join(unknown)}")
        out = {}
        try:
            for key, value in flat.items():
                if key not in takes:
                    raise ValueError(f"unknown option {key}")
                out[key] = takes[key].check(value)
            # a dotted-path policy is loaded here, so one that does not load is this line
            DispatchOptions.take(out)
        except ValueError as err:
            raise UserError(f"mode {self.name!r}: {err}") from None
        if engine == "vllm" and (self.lookahead or self.ahead):
            side = "lookahead" if self.lookahead else "its rollout side"
            raise UserError(f"mode {self.name!r} runs {side} on the reference engine: use --engine reference")
        drafter = out.get("spec.drafter", self.speculation)
        if drafter == "lookahead" and not self.lookahead:
            lookahead = ", ".join(m.name for m in MODES.values() if m.lookahead)
            raise UserError(
                f"mode {self.name!r}: spec.drafter=lookahead needs a lookahead mode ({lookahead})"
            )
        if engine != "vllm" and (other := [k for k in out if not self._drafter_takes(k, drafter)]):
            owner = drafters_taking(other[0])[0]
            raise UserError(
                f"mode {self.name!r}: option {', '.join(other)} needs spec.drafter={owner}; "
                f"the drafter is {drafter}"
            )
        return out

    def accepted(
        self, options: Mapping[str, Any], workers: int = 1, engine: str = "reference"
    ) -> dict[str, Any]:
        """The part of `options` (nested as the config holds them) that this mode takes, for a command that
        hands one set of options to several modes (`rlbench compare`): of the speculation options, those of
        its drafter and of any drafter."""
        takes = self.options(workers, engine)
        out = {k: v for k, v in options.items() if k in takes or (k == SPEC and self.speculative)}
        if isinstance(spec := out.get(SPEC), Mapping) and engine != "vllm":
            drafter = spec.get("drafter", self.speculation)
            out[SPEC] = {k: v for k, v in spec.items() if self._drafter_takes(f"{SPEC}.{k}", drafter)}
        return out


_ONE_ENGINE_SIM = (
    "Admission is modelled as all outstanding groups queued at the step's start (the trainer admits "
    "lazily as slots free up). W > 1: the trainer's one controller admits over all engines' slots and "
    "dispatches as it admits; the simulator dispatches the step's new requests with option dispatch "
    "(round-robin by default) onto engines still holding the carried work."
)
_IID_SIM = (
    "is modelled as i.i.d. per-token acceptance (the trace's, else --acceptance) with one cost-aware draft "
    "length per run (1..spec.max_draft), not per-sequence"
)
_SPEC_SIM = f"HistoSpec {_IID_SIM} adaptive drafts from a history."
_SUFFIX_SIM = f"SuffixDecoding {_IID_SIM} drafts from suffix trees."
_LOOKAHEAD_SIM = (
    "Lookahead is modelled as speculation with the trace's acceptance (else --acceptance); the bubble slots "
    "its runs fill are counted idle, and their cost and the drafts' coverage are not modelled."
)
_AHEAD_SIM = (
    "Rollout and update as two pools of the same W devices: the trainer pool holds the share of them that "
    "balances the baseline's update against its rollout (at least one; W = 1 is not modelled), its step "
    "time the cost model's update (or the log's or the run's) scaled to its devices; the rollout of step t "
    "starts once the weights of step t - max_staleness are out, the update of step t once its rollout is "
    "done. On one device the trainer shares it with the rollout, which the simulator does not model."
)
_PLACE_SIM = (
    "W > 1: the trainer's dispatch policy (histopipe: LPT over requests by predicted tokens), queues "
    "ordered as the trainer's; migration moves not-yet-admitted work from the slowest "
    "to the fastest workers, kept only when the makespan drops (the trainer steals when a worker runs "
    "dry)."
)


def _on_sorted(name: str, what: str, note: str, **kw: Any) -> ModeSpec:
    """A mode on SortedRL's on-policy strategy, with `what` added; on W engines under one controller."""
    return ModeSpec(
        name,
        f"SortedRL's on-policy strategy (as sorted) {what}",
        "sorted",
        dispatch=DispatchOptions.dispatch,
        simulator_note=f"{_ONE_ENGINE_SIM} {note}",
        **kw,
    )


MODES: dict[str, ModeSpec] = {
    m.name: m
    for m in (
        ModeSpec(
            "baseline",
            "Admit the step's prompts x group_size samples and wait for the slowest.",
            strategy="baseline",
            simulator_note="Continuous batching replayed on the cost model. W > 1: the trainer's dispatch "
            "policy objects assign the requests (rollout/dispatch.py); dispatch=histopipe as in mode "
            "histopipe.",
        ),
        ModeSpec(
            "sorted",
            "Oversubscribe; update on the first update_batch complete groups (shortest first); abort and "
            "regenerate the rest under the new policy.",
            strategy="sorted",
            simulator_note=_ONE_ENGINE_SIM,
        ),
        ModeSpec(
            "sorted-partial",
            "As sorted, but unfinished samples keep their tokens and resume under the new weights; TIS "
            "corrects the off-policy tokens.",
            strategy="sorted-partial",
            tis_cap=2.0,
            simulator_note=_ONE_ENGINE_SIM + " TIS changes the update, not the timing: not modelled.",
        ),
        ModeSpec(
            "histopipe",
            "The baseline over W workers with HistoPipe dispatch; on one worker it is the baseline.",
            strategy="baseline",
            dispatch="histopipe",
            simulator_note=_PLACE_SIM,
        ),
        ModeSpec(
            "rhyme",
            "RhymeRL: HistoSpec drafting from earlier epochs' responses, and HistoPipe dispatch with "
            "--workers > 1.",
            strategy="baseline",
            speculation="histospec",
            dispatch="histopipe",
            simulator_note=_SPEC_SIM + " " + _PLACE_SIM,
        ),
        _on_sorted(
            "sorted+rhyme", "with HistoSpec drafting on every engine.", _SPEC_SIM, speculation="histospec"
        ),
        ModeSpec(
            "suffix",
            "The baseline with SuffixDecoding drafting: one suffix tree over every earlier response (all "
            "prompts', from the first epoch on) plus the prompt; needs arctic-inference.",
            strategy="baseline",
            speculation="suffix",
            simulator_note=_SUFFIX_SIM,
        ),
        _on_sorted(
            "sorted+suffix",
            "with SuffixDecoding drafting on every engine.",
            _SUFFIX_SIM,
            speculation="suffix",
        ),
        ModeSpec(
            "lookahead",
            "The baseline, with the next step's requests started in the bubble under the current weights; "
            "their tokens are those requests' drafts after the update (BubbleSpec/SRT), verified exactly.",
            strategy="baseline",
            speculation="lookahead",
            lookahead=True,
            simulator_note=_LOOKAHEAD_SIM,
        ),
        _on_sorted(
            "sorted+lookahead",
            "with lookahead: slots idle while the oversubscription bound holds admission back run the "
            "stream's next prompts, whose tokens draft for them.",
            _LOOKAHEAD_SIM,
            speculation="lookahead",
            lookahead=True,
        ),
        ModeSpec(
            "rhyme+lookahead",
            "rhyme with lookahead: a request drafts from its lookahead run first, then from HistoSpec's "
            "history of its prompt.",
            strategy="baseline",
            speculation="histospec",
            dispatch="histopipe",
            lookahead=True,
            simulator_note=_SPEC_SIM + " " + _LOOKAHEAD_SIM,
        ),
        ModeSpec(
            "async",
            "The baseline's rollout run up to max_staleness steps ahead of the update, beside it (its own "
            "process): step t's samples come from the weights of step t - k; TIS corrects the stale tokens.",
            strategy="baseline",
            tis_cap=2.0,
            ahead=True,
            simulator_note=_AHEAD_SIM,
        ),
        _on_sorted(
            "sorted+async",
            "run up to max_staleness steps ahead of the update, beside it; TIS corrects the stale tokens.",
            _AHEAD_SIM,
            tis_cap=2.0,
            ahead=True,
        ),
    )
}


def get_mode(name: str) -> ModeSpec:
    if name not in MODES:
        raise UserError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}")
    return MODES[name]


def make_mode_strategy(mode: ModeSpec, workers: int, options: ModeOptions) -> Any:
    """The mode's rollout strategy for `workers` rollout workers, from its resolved options (imports the
    strategy, and torch, now)."""
    name = mode.strategy_for(workers)
    cls = STRATEGY_TABLE[name].load()
    if name == "placed":
        return cls(options.strategy)
    args = () if options.strategy is None else (options.strategy,)
    return cls(*args, lookahead=mode.lookahead)


def parse_option_pairs(pairs: Sequence[str], flag: str = "--mode-option") -> dict[str, Any]:
    """["oversubscription=3", "spec.max_draft=8"] -> {"oversubscription": 3, "spec": {...}}:
    values are JSON where they parse, else strings; a dotted key nests one level."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} needs KEY=VALUE, got {pair!r}")
        value, why, _ = decode_json(raw)  # depth and 4,300-digit integers too: a string, never a traceback
        head, _, sub = key.partition(".")
        (parsed.setdefault(head, {}) if sub else parsed)[sub or key] = raw if why else value
    return parsed


def flatten_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """{"spec": {"max_draft": 8}} -> {"spec.max_draft": 8}."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if key == SPEC and isinstance(value, Mapping):
            flat.update({f"{SPEC}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
