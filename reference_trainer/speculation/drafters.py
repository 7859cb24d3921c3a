"""The drafters in one table (name, class, title, options) and `attach`, which builds a Speculator from a
mode's `spec.*` options and hooks it into an engine.

A drafter's options are its constructor's arguments as `spec.<argument>` (tests/test_modes.py checks that
each option names an argument); the speculator's options are the Speculator's. A lookahead mode puts the
LookaheadDrafter (lookahead.py) in front of the mode's drafter, which it falls back to; the `lookahead`
drafter is the LookaheadDrafter alone. Imports nothing heavy: the mode registry (modes.py) reads the table
without loading torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reference_trainer.option import Option
from reference_trainer.speculation.histospec import HistoryDrafter
from reference_trainer.speculation.lookahead import LookaheadDrafter
from reference_trainer.speculation.suffix import SuffixDrafter

if TYPE_CHECKING:
    from reference_trainer.engine.engine import Engine
    from reference_trainer.speculation.speculator import Speculator


def _options(rows: tuple[tuple[Any, ...], ...]) -> tuple[Option, ...]:
    """Rows of (argument, type, default, minimum, nullable, help) -> spec.* options."""
    return tuple(
        Option(f"spec.{arg}", kind, default, text, minimum=low, nullable=null)
        for arg, kind, default, low, null, text in rows
    )


MAX_DRAFT = Option("spec.max_draft", "int", 8, "longest draft", minimum=1, simulated=True)


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter: its class (None: lookahead runs only, the LookaheadDrafter alone), its title, and the
    options its constructor takes."""

    name: str
    title: str
    cls: type | None
    options: tuple[Option, ...]


DRAFTERS: dict[str, DrafterSpec] = {
    "histospec": DrafterSpec(
        "histospec",
        "HistoSpec",
        HistoryDrafter,
        (
            MAX_DRAFT,
            *_options(
                (
                    ("max_prompts", "int", 4096, 1, False, "prompts with a history (LRU)"),
                    ("max_responses", "int", 16, 1, False, "responses kept per prompt"),
                    ("max_epochs", "int", 2, 1, False, "policy versions a history spans"),
                    ("min_draft", "int", 1, 1, False, "shortest adaptive draft"),
                    ("init_draft", "int", 4, 1, False, "a new sequence's draft length"),
                    ("min_match", "int", 1, 0, False, "shortest suffix match that may draft"),
                    ("rematch_window", "int", 64, 1, False, "tokens re-matched after a history change"),
                    ("min_confidence", "float", 0.5, 0, False, "stop a draft below this cumulative share"),
                )
            ),
        ),
    ),
    "suffix": DrafterSpec(
        "suffix",
        "SuffixDecoding",
        SuffixDrafter,
        (
            MAX_DRAFT,
            *_options(
                (
                    ("suffix_max_depth", "int", 64, 1, False, "suffix trees' depth: longest match + draft"),
                    ("suffix_max_cached", "int", 10000, 1, False, "responses in the global tree (FIFO)"),
                    ("suffix_spec_factor", "float", 1.0, 0, False, "draft <= this x match length + offset"),
                    ("suffix_spec_offset", "float", 0.0, None, False, "that offset, in tokens"),
                    ("suffix_min_prob", "float", 0.1, 0, False, "stop at a token estimated below it"),
                )
            ),
        ),
    ),
    "lookahead": DrafterSpec("lookahead", "Lookahead", None, (MAX_DRAFT,)),
}
LOOKAHEAD_OPTIONS = (MAX_DRAFT,)  # the LookaheadDrafter's own, in front of any drafter in a lookahead mode

DRAFTER_OPTION = Option(
    "spec.drafter",
    "str",
    "histospec",
    "histospec: this prompt's earlier responses; suffix: SuffixDecoding over all responses (needs "
    "arctic-inference); lookahead: only the request's own run in the last bubble (lookahead modes); "
    "default: the mode's",
    choices=tuple(DRAFTERS),
)
SPECULATOR_OPTIONS = _options(
    (
        ("cost_model", "list", None, None, True, "[[batch, q, seconds], ...]; none = measure"),
        ("margin", "float", 0.05, 0, False, "verify must beat decode by this share or cost within it"),
        ("prior_acceptance", "float", 0.7, 0, False, "acceptance assumed before any is seen"),
        ("prior_weight", "float", 8.0, 0, False, "weight of that prior, in draft positions"),
        ("decay", "float", 0.98, 0, False, "per-step decay of the acceptance counts"),
        ("cost_batches", "list[int]", [1, 4, 16, 64], None, False, "batch sizes the cost table times"),
        ("cost_qs", "list[int]", [1, 2, 4, 8, 16], None, False, "verify widths the cost table times"),
        ("cost_repeats", "int", 3, 1, False, "timing repeats per cost-table cell"),
    )
)
# --engine vllm: vLLM's own drafting (engine/vllm_engine.py speculative_config maps these keys).
VLLM_SPEC_OPTIONS = (
    Option(
        "spec.method",
        "str",
        "ngram",
        "vLLM drafter (suffix needs arctic-inference)",
        choices=("ngram", "suffix"),
    ),  # fmt: skip
    Option("spec.max_draft", "int", 4, "num_speculative_tokens", minimum=1),
    Option("spec.prompt_lookup_min", "int", 2, "shortest n-gram match (ngram)", minimum=1),
    Option("spec.prompt_lookup_max", "int", 4, "longest n-gram match (ngram)", minimum=1),
)


def spec_options() -> dict[str, Option]:
    """Every speculation option of the reference engine by name: the drafter choice, each drafter's, the
    speculator's."""
    out = {DRAFTER_OPTION.name: DRAFTER_OPTION}
    for spec in DRAFTERS.values():
        out.update({o.name: o for o in spec.options})
    out.update({o.name: o for o in SPECULATOR_OPTIONS})
    return out


def drafters_taking(name: str) -> list[str]:
    """The drafters whose options include `name` (a spec.* option); empty for the speculator's own."""
    return [d.name for d in DRAFTERS.values() if any(o.name == name for o in d.options)]


def build_speculator(options: Mapping[str, Any], accept_rule: Any = None) -> Speculator:
    """A Speculator from a mode's speculation options (the config's "spec" dict, keys without the prefix;
    "drafter" names the drafter, "lookahead" true puts lookahead drafts in front of it). `accept_rule`: the
    verify's accept rule (default: the exact one); another only to show what it costs."""
    from reference_trainer.engine.sampler import coupled_accept
    from reference_trainer.speculation.speculator import Speculator

    options = dict(options)
    name, lookahead = str(options.pop("drafter", "histospec")), bool(options.pop("lookahead", False))
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; valid: {', '.join(DRAFTERS)}")
    spec = DRAFTERS[name]
    lookahead = lookahead or spec.cls is None
    mine = {o.key for o in spec.options} if spec.cls is not None else set()
    ahead = {o.key for o in LOOKAHEAD_OPTIONS} if lookahead else set()
    shared = {o.key for o in SPECULATOR_OPTIONS}
    if unknown := sorted(set(options) - mine - ahead - shared):
        raise ValueError(f"drafter {name!r} takes no option {', '.join(unknown)}")
    drafter = spec.cls(**{k: v for k, v in options.items() if k in mine}) if spec.cls is not None else None
    if lookahead:
        drafter = LookaheadDrafter(drafter, **{k: v for k, v in options.items() if k in ahead})
    kwargs = {k: v for k, v in options.items() if k in shared}
    return Speculator(drafter, accept_rule=accept_rule or coupled_accept, **kwargs)


def attach(engine: Engine, options: Mapping[str, Any], accept_rule: Any = None) -> Speculator:
    """`build_speculator(options)` hooked into `engine` (its cost table timed now, before any request)."""
    return build_speculator(options, accept_rule).attach(engine)
