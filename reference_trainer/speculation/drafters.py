"""The drafters in one table (name, class, title, options record), the speculation a mode runs as one
record (`SpeculationOptions`), and `attach`, which builds a Speculator from it and hooks it into an engine.

Each drafter's options are a record beside its class (histospec.py `HistoSpecOptions`, suffix.py
`SuffixOptions`, lookahead.py `LookaheadOptions`), the speculator's beside the Speculator
(`SpeculatorOptions`); on the command line they are `spec.<field>`. A lookahead mode puts the
LookaheadDrafter in front of the mode's drafter, which it falls back to; the `lookahead` drafter is the
LookaheadDrafter alone. Imports nothing heavy: the mode registry (modes.py) reads the table without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reference_trainer.option import Option, Options, option, options_of
from reference_trainer.speculation.histospec import HistoryDrafter, HistoSpecOptions
from reference_trainer.speculation.lookahead import LookaheadDrafter, LookaheadOptions
from reference_trainer.speculation.speculator import Speculator, SpeculatorOptions
from reference_trainer.speculation.suffix import SuffixDrafter, SuffixOptions

if TYPE_CHECKING:
    from reference_trainer.engine.engine import Engine
    from reference_trainer.speculation.cost import ForwardCosts

SPEC = "spec"  # the group of the speculation options: `spec.KEY=VALUE`, held as config["spec"][KEY]


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter: its class (None: lookahead runs only, the LookaheadDrafter alone), its title, and the
    record of the options its constructor takes."""

    name: str
    title: str
    cls: type | None
    options: type[Options]


DRAFTERS: dict[str, DrafterSpec] = {
    "histospec": DrafterSpec("histospec", "HistoSpec", HistoryDrafter, HistoSpecOptions),
    "suffix": DrafterSpec("suffix", "SuffixDecoding", SuffixDrafter, SuffixOptions),
    "lookahead": DrafterSpec("lookahead", "Lookahead", None, LookaheadOptions),
}
DRAFTER_OPTION = Option(
    "spec.drafter",
    "str",
    "histospec",
    "histospec: this prompt's earlier responses; suffix: SuffixDecoding over all responses (needs "
    "arctic-inference); lookahead: only the request's own run in the last bubble (lookahead modes); "
    "default: the mode's",
    choices=tuple(DRAFTERS),
)


@dataclass(frozen=True)
class VLLMSpecOptions(Options):
    """--engine vllm: vLLM's own drafting (engine/vllm_engine.py speculative_config maps these keys)."""

    method: str = option("ngram", "vLLM drafter (suffix needs arctic-inference)", choices=("ngram", "suffix"))
    max_draft: int = option(4, "num_speculative_tokens", minimum=1)
    prompt_lookup_min: int = option(2, "shortest n-gram match (ngram)", minimum=1)
    prompt_lookup_max: int = option(4, "longest n-gram match (ngram)", minimum=1)


def spec_options() -> dict[str, Option]:
    """Every speculation option of the reference engine by name: the drafter choice, each drafter's, the
    speculator's."""
    out = {DRAFTER_OPTION.name: DRAFTER_OPTION}
    for spec in DRAFTERS.values():
        out.update({o.name: o for o in options_of(spec.options, f"{SPEC}.")})
    out.update({o.name: o for o in options_of(SpeculatorOptions, f"{SPEC}.")})
    return out


def vllm_spec_options() -> dict[str, Option]:
    return {o.name: o for o in options_of(VLLMSpecOptions, f"{SPEC}.")}


def drafters_taking(name: str) -> list[str]:
    """The drafters whose options include `name` (a spec.* option); empty for the speculator's own."""
    return [
        d.name for d in DRAFTERS.values() if any(o.name == name for o in options_of(d.options, f"{SPEC}."))
    ]


@dataclass(frozen=True)
class SpeculationOptions:
    """What a reference engine drafts with: the drafter and its options, lookahead's in front of it where
    the mode looks ahead, and the speculator's."""

    drafter: str = DRAFTER_OPTION.default
    lookahead: bool = False
    drafter_options: Options | None = None  # the drafter's record; None: its defaults
    lookahead_options: LookaheadOptions = dataclasses.field(default_factory=LookaheadOptions)
    speculator: SpeculatorOptions = dataclasses.field(default_factory=SpeculatorOptions)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> SpeculationOptions:
        """The records from a config's "spec" values (keys without the prefix; "drafter" names the drafter,
        "lookahead" true puts lookahead drafts in front of it). Each record takes its own fields."""
        values = dict(values)
        name = str(values.pop("drafter", DRAFTER_OPTION.default))
        lookahead = bool(values.pop("lookahead", False))
        if name not in DRAFTERS:
            raise ValueError(f"unknown drafter {name!r}; valid: {', '.join(DRAFTERS)}")
        spec = DRAFTERS[name]
        lookahead = lookahead or spec.cls is None
        records = (
            [SpeculatorOptions] + [LookaheadOptions] * lookahead + [spec.options] * (spec.cls is not None)
        )
        taken = {f.name for r in records for f in dataclasses.fields(r)}
        if unknown := sorted(set(values) - taken):
            raise ValueError(f"drafter {name!r} takes no option {', '.join(unknown)}")
        return cls(
            drafter=name,
            lookahead=lookahead,
            drafter_options=spec.options.take(values) if spec.cls is not None else None,
            lookahead_options=LookaheadOptions.take(values) if lookahead else LookaheadOptions(),
            speculator=SpeculatorOptions.take(values),
        )


def build_speculator(
    options: SpeculationOptions | Mapping[str, Any],
    accept_rule: Any = None,
    cost_model: ForwardCosts | None = None,
) -> Speculator:
    """A Speculator from a mode's speculation (the record, or a config's "spec" values to make it from).
    `accept_rule`: the verify's accept rule (default: the exact one); another only to show what it costs.
    `cost_model`: a cost table at hand (tests, reproductions), instead of the options' or a timed one."""
    if not isinstance(options, SpeculationOptions):
        options = SpeculationOptions.of(options)
    spec = DRAFTERS[options.drafter]
    drafter = spec.cls(options.drafter_options) if spec.cls is not None else None
    if options.lookahead:
        drafter = LookaheadDrafter(drafter, options.lookahead_options)
    return Speculator(drafter, options.speculator, accept_rule=accept_rule, cost_model=cost_model)


def attach(
    engine: Engine,
    options: SpeculationOptions | Mapping[str, Any],
    accept_rule: Any = None,
    cost_model: ForwardCosts | None = None,
) -> Speculator:
    """`build_speculator(...)` hooked into `engine` (its cost table timed now, before any request, unless
    one is given)."""
    return build_speculator(options, accept_rule, cost_model).attach(engine)
