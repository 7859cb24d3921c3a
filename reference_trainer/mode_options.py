"""The options a rollout strategy takes, typed (`--mode-option KEY=VALUE`), and how KEY=VALUE pairs parse and
nest. The speculation options (`spec.*`) are the drafters' and the speculator's own
(speculation/drafters.py); the mode registry (modes.py) says which mode takes which. Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.option import Option
from reference_trainer.rollout.placement import ORDERS, PLACEMENTS
from reference_trainer.trace.records import decode_json

SPEC = "spec"  # the group of the speculation options: `spec.KEY=VALUE`, held as config["spec"][KEY]

# The bound on a trained token's age in policy versions, whoever keeps tokens that long: a kept partial
# rollout older than it is regenerated (sorted-partial); a rollout runs this many steps ahead (async).
MAX_STALENESS = Option(
    "max_staleness",
    "int",
    1,
    "a trained token is at most this many policy versions old: a kept sample whose oldest token would be "
    "older is regenerated (no effect on-policy: nothing outlives an update); an async mode's rollout runs "
    "this many steps ahead, step t on the weights of step t - k (0: the synchronous schedule)",
    minimum=0,
    simulated=True,
)
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
    MAX_STALENESS,
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
        null_word="auto",
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
        null_word="auto",
        multi_worker=True,
        simulated=True,
    ),
)
# A strategy run ahead of the update in a rollout process of its own (modes async, sorted+async:
# rollout/ahead.py): how far ahead, and how the rollout side is placed.
AHEAD_OPTIONS = (
    MAX_STALENESS,
    Option(
        "rollout_threads",
        "int",
        None,
        "CPU threads of the rollout side; the update keeps the rest of --threads (auto: half, at least 1; "
        "with max_staleness 0 both sides take all, as they never run at once)",
        minimum=1,
        nullable=True,
        null_word="auto",
    ),
    Option(
        "rollout_device",
        "str",
        None,
        "the rollout side's device, e.g. cuda:1 (auto: the run's --device, shared with the update)",
        nullable=True,
        null_word="auto",
    ),
    Option(
        "backend",
        "str",
        "process",
        "where the rollout side runs: a process of its own, or a thread of the trainer's (tests and "
        "debugging: one GIL and one torch thread pool, so its timings are not a process's)",
        choices=("process", "thread"),
    ),
)
STRATEGY_OPTIONS: dict[str, tuple[Option, ...]] = {
    "baseline": (),
    "sorted": SORTED_OPTIONS,
    "sorted-partial": SORTED_OPTIONS,
    "placed": PLACED_OPTIONS,
}


def parse_option_pairs(pairs: Sequence[str], flag: str = "--mode-option") -> dict[str, Any]:
    """["oversubscription=3", "spec.max_draft=8"] -> {"oversubscription": 3, "spec": {...}}:
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
    """{"spec": {"max_draft": 8}} -> {"spec.max_draft": 8}."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if key == SPEC and isinstance(value, Mapping):
            flat.update({f"{SPEC}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
