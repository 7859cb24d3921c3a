"""The options a mode takes, typed (`--mode-option KEY=VALUE`): each strategy's, and HistoSpec's on the
reference engine and on vLLM; how KEY=VALUE pairs parse and nest. The mode registry (modes.py) says which
mode takes which. Imports nothing heavy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.rollout.placement import ORDERS, PLACEMENTS
from reference_trainer.trace.records import decode_json

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
    drafter: str | None = None  # a speculation option of this drafter only (DRAFTERS); None: of any

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
        if ok and self.type == "float" and not math.isfinite(value):  # JSON 1e999 parses as inf
            raise ValueError(f"option {self.name} must be a finite number, got {value!r}")
        if ok and self.type == "int" and value > MAX_COUNT:
            raise ValueError(f"option {self.name} must be <= {MAX_COUNT}, got {value!r}")
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
# Speculation on the reference engine: the drafter (histospec: HistoryDrafter, engine/histospec.py;
# suffix: SuffixDrafter, engine/suffix.py; lookahead: LookaheadDrafter alone, engine/lookahead.py), its
# constructor arguments and the Speculator's (engine/histospec.py attach_histospec), except the Speculator's
# accept_rule, a callable.
DRAFTERS = {"histospec": "HistoSpec", "suffix": "SuffixDecoding", "lookahead": "Lookahead"}  # name -> title


def _speculation_options(drafter: str | None, rows: tuple[tuple[Any, ...], ...]) -> tuple[Option, ...]:
    """Rows of (name, type, default, minimum, nullable, simulated, help) -> histospec.* options of
    `drafter` only (None: of any drafter)."""
    return tuple(
        Option(
            f"histospec.{name}",
            kind,
            default,
            text,
            minimum=low,
            nullable=null,
            simulated=sim,
            drafter=drafter,
        )
        for name, kind, default, low, null, sim, text in rows
    )


HISTOSPEC_OPTIONS = (
    Option(
        "histospec.drafter",
        "str",
        "histospec",
        "histospec: this prompt's earlier responses; suffix: SuffixDecoding over all responses (needs "
        "arctic-inference); lookahead: only the request's own run in the last bubble (lookahead modes); "
        "default: the mode's",
        choices=tuple(DRAFTERS),
    ),
    *_speculation_options(
        "histospec",
        (
            ("max_prompts", "int", 4096, 1, False, False, "prompts with a history (LRU)"),
            ("max_responses", "int", 16, 1, False, False, "responses kept per prompt"),
            ("max_epochs", "int", 2, 1, False, False, "policy versions a history spans"),
            ("min_draft", "int", 1, 1, False, False, "shortest adaptive draft"),
            ("init_draft", "int", 4, 1, False, False, "a new sequence's draft length"),
            ("min_match", "int", 1, 0, False, False, "shortest suffix match that may draft"),
            ("rematch_window", "int", 64, 1, False, False, "tokens re-matched after a history change"),
            ("min_confidence", "float", 0.5, 0, False, False, "stop a draft below this cumulative share"),
        ),
    ),
    *_speculation_options(
        "suffix",
        (
            ("suffix_max_depth", "int", 64, 1, False, False, "suffix trees' depth: longest match + draft"),
            ("suffix_max_cached", "int", 10000, 1, False, False, "responses in the global tree (FIFO)"),
            ("suffix_spec_factor", "float", 1.0, 0, False, False, "draft <= this x match length + offset"),
            ("suffix_spec_offset", "float", 0.0, None, False, False, "that offset, in tokens"),
            ("suffix_min_prob", "float", 0.1, 0, False, False, "stop at a token estimated below it"),
        ),
    ),
    *_speculation_options(
        None,
        (
            ("max_draft", "int", 8, 1, False, True, "longest draft"),
            ("cost_model", "list", None, None, True, False, "[[batch, q, seconds], ...]; none = measure"),
            (
                "margin",
                "float",
                0.05,
                0,
                False,
                False,
                "verify must beat decode by this share or cost within it",
            ),
            ("prior_acceptance", "float", 0.7, 0, False, False, "acceptance assumed before any is seen"),
            ("prior_weight", "float", 8.0, 0, False, False, "weight of that prior, in draft positions"),
            ("decay", "float", 0.98, 0, False, False, "per-step decay of the acceptance counts"),
            (
                "cost_batches",
                "list[int]",
                [1, 4, 16, 64],
                None,
                False,
                False,
                "batch sizes the cost table times",
            ),
            (
                "cost_qs",
                "list[int]",
                [1, 2, 4, 8, 16],
                None,
                False,
                False,
                "verify widths the cost table times",
            ),
            ("cost_repeats", "int", 3, 1, False, False, "timing repeats per cost-table cell"),
        ),
    ),
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


def parse_option_pairs(pairs: Sequence[str], flag: str = "--mode-option") -> dict[str, Any]:
    """["oversubscription=3", "histospec.max_draft=8"] -> {"oversubscription": 3, "histospec": {...}}:
    values are JSON where they parse, else strings; a dotted key nests one level."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} needs KEY=VALUE, got {pair!r}")
        value, why, _ = decode_json(raw)  # depth and 4,300-digit integers too: a string, never a traceback
        if why:
            value = raw
        head, _, sub = key.partition(".")
        if sub:
            parsed.setdefault(head, {})[sub] = value
        else:
            parsed[key] = value
    return parsed


def flatten_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """{"histospec": {"max_draft": 8}} -> {"histospec.max_draft": 8}."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if key == "histospec" and isinstance(value, Mapping):
            flat.update({f"histospec.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
