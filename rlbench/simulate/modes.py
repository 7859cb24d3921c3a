"""The trainer's modes as the simulator runs them: a registry mode (reference_trainer/modes.py) plus its
options becomes a `SimMode`, the handful of knobs scheduler.py steps through.

So `rlbench simulate --modes X` accepts exactly the names `rlbench train --mode X` does, with the same
meaning; `--mode-option KEY=VALUE` works as on train, and an option the simulator cannot model is a
one-line error. A `--modes` entry may carry options of its own, `NAME:KEY=VALUE[:KEY=VALUE...]`, so one
run can compare variants of a mode (e.g. `baseline,baseline:dispatch=least-in-flight`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.modes import MODES, ModeSpec, flatten_options, get_mode, parse_option_pairs
from reference_trainer.rollout.dispatch import DISPATCH, DispatchOptions
from reference_trainer.rollout.sorted import SortedOptions
from reference_trainer.speculation.lookahead import LookaheadOptions

# The simulator's former policy names that were not modes, and what they are now.
RENAMED = {
    "least-loaded": "baseline:dispatch=least-in-flight",
    "histospec": "rhyme:dispatch=round-robin",
}


@dataclass(frozen=True)
class SimMode:
    """A mode with its options resolved to what the simulator models."""

    name: str  # the label in results: the --modes entry as written ("rhyme", "baseline:dispatch=...")
    mode: str = "baseline"  # the registry mode
    options: tuple[tuple[str, Any], ...] = ()  # the options given (flat keys), sorted
    dispatch: str = DispatchOptions.dispatch  # the trainer's policy (rollout/dispatch.py make_policy)
    order: str = DispatchOptions().queue_order  # fifo | alternate | long-first (rollout/placement.py reorder)
    migrate: bool = DispatchOptions().migrates  # straggler migration
    spec: bool = False  # HistoSpec speculative decoding
    max_draft: int = LookaheadOptions.max_draft  # longest draft the cost-aware chooser may pick
    oversub: float = 1.0  # > 1: SortedRL early termination over this many times the update's groups
    partial: bool = False  # SortedRL keeps unfinished work (sorted-partial)
    # partial: kept work older than this many policy versions is regenerated; ahead: how many steps the
    # rollout runs ahead of the update
    max_staleness: int = SortedOptions.max_staleness
    ahead: bool = False  # the rollout runs beside the update (async): rollout and trainer as two pools


def _lookup(name: str) -> ModeSpec:
    try:
        return get_mode(name)
    except UserError as err:
        hint = f" (the simulator's old {name!r} is now {RENAMED[name]})" if name in RENAMED else ""
        raise UserError(f"{err}{hint}") from None


def sim_mode(name: str, options: dict[str, Any] | None = None, label: str | None = None) -> SimMode:
    """Mode `name` with `options` (flat, or speculation keys nested under "spec") as a simulator policy."""
    mode = _lookup(name)
    try:
        given = mode.check_options(options or {})
    except ValueError as err:
        raise UserError(f"mode {name!r}: {err}") from None
    accepted = mode.options()
    for key in given:
        if not accepted[key].simulated:
            raise UserError(
                f"rlbench simulate cannot model option {key} of mode {name!r} (it runs on the trainer only; "
                "see rlbench modes)"
            )
    opts = {k: o.default for k, o in accepted.items()} | given
    placed = DispatchOptions.take(opts)
    sortedrl = mode.strategy in ("sorted", "sorted-partial")
    return SimMode(
        name=label or name,
        mode=name,
        options=tuple(sorted(given.items())),
        dispatch=placed.dispatch,
        order=placed.queue_order,
        migrate=placed.migrates,
        spec=mode.speculative,
        max_draft=int(opts.get("spec.max_draft", SimMode.max_draft)),
        oversub=float(opts["oversubscription"]) if sortedrl else 1.0,
        partial=mode.strategy == "sorted-partial",
        max_staleness=int(opts.get("max_staleness", SimMode.max_staleness)),
        ahead=mode.ahead,
    )


def parse_entry(entry: str) -> tuple[str, dict[str, Any]]:
    """ "rhyme:dispatch=round-robin:spec.max_draft=4" -> ("rhyme", flat options)."""

    name, *pairs = (part.strip() for part in entry.split(":"))
    return name, flatten_options(parse_option_pairs(pairs))


def parse_sim_modes(entries: list[str], options: dict[str, Any] | None = None) -> list[SimMode]:
    """The policies of `--modes` entries; `options` (from --mode-option) go to every entry whose mode takes
    them, an entry's own options override them. A plain `baseline` is put first when no entry is exactly
    `baseline`: speed-ups are ratios against it."""
    common = flatten_options(options or {})
    out, used = [], set()
    for entry in entries:
        name, own = parse_entry(entry)
        takes = _lookup(name).options()
        shared = {k: v for k, v in common.items() if k in takes}
        used |= shared.keys()
        out.append(sim_mode(name, {**shared, **own}, label=entry.strip()))
    if unknown := sorted(common.keys() - used):
        raise UserError(f"no selected mode takes option {', '.join(unknown)}")
    labels = [p.name for p in out]
    if len(set(labels)) != len(labels):
        raise UserError(f"--modes lists an entry twice: {', '.join(labels)}")
    if "baseline" not in labels:
        out.insert(0, sim_mode("baseline"))
    return out


# Every mode with its defaults, by name.
SIM_MODES: dict[str, SimMode] = {name: sim_mode(name) for name in MODES}


def dispatch_option(mode: str) -> tuple[str, tuple[str, ...]] | None:
    """The option by which `mode` picks which engine runs which request over W engines (`dispatch`, or
    `placement` where the mode has no `dispatch`) and its policies; None for a mode that takes neither (it
    dispatches as the simulator's default does)."""
    takes = _lookup(mode).options()
    for key in ("dispatch", "placement"):
        if key in takes:  # a registry open to dotted paths lists no choices: its named policies, then
            return key, tuple(takes[key].choices or DISPATCH)
    return None


def dispatch_entries(mode: str) -> list[str]:
    """`--modes` entries of `mode` under every dispatch policy it takes (`mode:dispatch=P`), its default
    policy first; just the mode where it takes none."""
    found = dispatch_option(mode)
    if found is None:
        return [mode]
    key, policies = found
    default = _lookup(mode).options()[key].default
    first = [p for p in policies if p == default] + [p for p in policies if p != default]
    return [f"{mode}:{key}={p}" for p in first]
