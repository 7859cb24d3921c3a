"""Dispatch: which rollout engine runs which request. One policy object, used by the trainer's multi-engine
strategies (placed.py, multi.py) and by the simulator (rlbench/simulate), so a simulated dispatch is the
trainer's own code, not a copy.

A policy sees the engines through `EngineLoad` (requests in flight and predicted tokens outstanding per
engine, kept by the caller as requests start and finish) and assigns a batch of `Unit`s, in the order
given, updating the load as it goes. A batch is a whole step's requests (the synchronous modes) or the
samples of the prompts admitted at one engine step (SortedRL); a policy keeps whatever it needs between
batches (round-robin's turn, group-sticky's engines) and `begin_step` starts a step.

The policies, by name (`DISPATCH`; any other class by a dotted path `package.module:Class`):

- `round-robin`: a group's samples together on the next engine in turn (OpenRLHF, verl's synchronous
  rollout, AReaL);
- `least-in-flight`: each request to the engine with the fewest requests in flight (verl's global load
  balancer);
- `least-tokens`: each request to the engine with the fewest predicted tokens outstanding;
- `group-sticky`: a group's samples on one engine, the one with the fewest in flight when its first
  sample is dispatched (verl's sticky request ids, by group);
- `group-spread`: a group's samples dealt over the engines, least in flight first (ROLL Flash's prompt
  replication);
- `histopipe`: predicted length, HistoPipe's (RhymeRL): longest predicted first onto the engine with the
  fewest predicted tokens outstanding (LPT: makespan at most (4/3 - 1/(3W)) x optimal).

Pure Python over lists and heaps, O(n log W) a batch: the simulator dispatches 4,096 engines with it.
"""

from __future__ import annotations

import dataclasses
import heapq
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from reference_trainer.option import Options, option


@dataclass(frozen=True)
class Unit:
    """One request to dispatch: its group (the prompt's key in the run) and its predicted work (tokens)."""

    group: int
    work: float


@dataclass
class EngineLoad:
    """Per engine: requests in flight (dispatched, not finished) and their predicted tokens outstanding."""

    in_flight: list[int]
    tokens: list[float]

    @classmethod
    def empty(cls, engines: int) -> EngineLoad:
        return cls([0] * engines, [0.0] * engines)

    @property
    def engines(self) -> int:
        return len(self.in_flight)

    def add(self, engine: int, work: float) -> None:
        self.in_flight[engine] += 1
        self.tokens[engine] += work

    def remove(self, engine: int, work: float) -> None:
        self.in_flight[engine] -= 1
        self.tokens[engine] = max(0.0, self.tokens[engine] - work)


@runtime_checkable
class DispatchPolicy(Protocol):
    name: str

    def begin_step(self, step: int) -> None: ...

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        """An engine per unit (in the order of `units`); `load` is updated with every unit assigned."""
        ...


class _Least:
    """The engine with the least `key` (ties: lowest id), from a heap of (key, engine) entries: an entry
    whose key is no longer the engine's (its load moved since) is dropped when popped, so an assignment
    outside `take` costs a push (`add`), not a rebuild."""

    def __init__(self, load: EngineLoad, by_tokens: bool) -> None:
        self.load, self.by_tokens = load, by_tokens
        self.heap = [(self._key(w), w) for w in range(load.engines)]
        heapq.heapify(self.heap)

    def _key(self, w: int) -> float:
        return self.load.tokens[w] if self.by_tokens else float(self.load.in_flight[w])

    def take(self, work: float, skip: set[int] | frozenset[int] = frozenset()) -> int:
        """The least engine not in `skip`, with `work` added to it."""
        skipped = []
        while True:
            key, w = heapq.heappop(self.heap)
            if key != self._key(w):
                continue
            if w not in skip:
                break
            skipped.append((key, w))
        for entry in skipped:
            heapq.heappush(self.heap, entry)
        self.add(w, work)
        return w

    def add(self, w: int, work: float) -> None:
        self.load.add(w, work)
        heapq.heappush(self.heap, (self._key(w), w))


@dataclass
class RoundRobin:
    """A group's samples together on the next engine in turn, from engine 0 each step (OpenRLHF, AReaL)."""

    name: str = "round-robin"
    # State, not options (init=False): a policy's options are its other constructor fields (policy_options).
    turn: int = field(default=0, init=False)
    _step_groups: dict[int, int] = field(default_factory=dict, init=False)

    def begin_step(self, step: int) -> None:
        # Each step deals from engine 0 again, so a synchronous step's placement depends on the step alone.
        self.turn, self._step_groups = 0, {}

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        out = []
        for u in units:
            if u.group not in self._step_groups:
                self._step_groups[u.group] = self.turn % load.engines
                self.turn += 1
            w = self._step_groups[u.group]
            load.add(w, u.work)
            out.append(w)
        return out


class _NoSteps:
    """A policy that keeps nothing per step."""

    def begin_step(self, step: int) -> None:
        pass


class _LeastLoaded(_NoSteps):
    """Each request to the least-loaded engine, by requests in flight or by predicted tokens."""

    by_tokens: ClassVar[bool]

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least = _Least(load, by_tokens=self.by_tokens)
        return [least.take(u.work) for u in units]


@dataclass
class LeastInFlight(_LeastLoaded):
    """Each request to the engine with the fewest requests in flight (verl's global load balancer)."""

    name: str = "least-in-flight"
    by_tokens: ClassVar[bool] = False


@dataclass
class LeastTokens(_LeastLoaded):
    """Each request to the engine with the fewest predicted tokens outstanding."""

    name: str = "least-tokens"
    by_tokens: ClassVar[bool] = True


@dataclass
class GroupSticky(_NoSteps):
    """A group's samples on one engine, the least in flight at its first sample, and its later ones."""

    name: str = "group-sticky"
    engine_of: dict[int, int] = field(default_factory=dict, init=False)

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least, out = _Least(load, by_tokens=False), []
        for u in units:
            w = self.engine_of.get(u.group)
            if w is None or w >= load.engines:
                w = self.engine_of[u.group] = least.take(u.work)
            else:
                least.add(w, u.work)
            out.append(w)
        return out

    def forget(self, group: int) -> None:
        """A group trained (or dropped): its engine is free to change."""
        self.engine_of.pop(group, None)


@dataclass
class GroupSpread(_NoSteps):
    """A group's samples dealt over distinct engines, least in flight first (ROLL Flash's replication)."""

    name: str = "group-spread"

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        # A group's samples go to distinct engines while there are engines it has not used, least in flight
        # first; with more samples than engines, the deal wraps.
        least, out, used = _Least(load, by_tokens=False), [], {}
        for u in units:
            seen = used.setdefault(u.group, set())
            if len(seen) >= load.engines:
                seen.clear()
            w = least.take(u.work, skip=seen)
            seen.add(w)
            out.append(w)
        return out


@dataclass
class HistoPipe(_NoSteps):
    """Longest predicted first onto the engine with the fewest predicted tokens outstanding (RhymeRL, LPT)."""

    name: str = "histopipe"

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least, out = _Least(load, by_tokens=True), [0] * len(units)
        for i in sorted(range(len(units)), key=lambda i: (-units[i].work, i)):
            out[i] = least.take(units[i].work)
        return out


DISPATCH: dict[str, type] = {
    p.name: p for p in (RoundRobin, LeastInFlight, LeastTokens, GroupSticky, GroupSpread, HistoPipe)
}


# The policy of every rollout over W > 1 engines that names none: the trainer's placed baseline and its
# controller, a rollout run ahead, the simulator and `rlbench modes`.
DEFAULT_DISPATCH = "round-robin"
# Former names of policies and of the option, and what they are now (a one-line error names the new ones).
RENAMED = {"least-outstanding": "least-in-flight"}
RENAMED_OPTIONS = {"placement": "dispatch"}


def renamed_option(options: dict) -> str | None:
    """What a former option or policy among `options` (flat) is now: placement=least-outstanding is now
    dispatch=least-in-flight. None when there is none."""
    for key, value in options.items():
        new_key = RENAMED_OPTIONS.get(key, key)
        policy = new_key == "dispatch" and isinstance(value, str)
        new_value = RENAMED.get(value, value) if policy else value
        if (new_key, new_value) != (key, value):
            return f"option {key}={value} is now {new_key}={new_value} (rlbench modes lists them)"
    return None


def describe(policy: type) -> str:
    """A policy's one-line description: the first line of its class docstring."""
    return (policy.__doc__ or "").strip().splitlines()[0] if policy.__doc__ else ""


def policy_options(policy: type) -> dict[str, object]:
    """A policy class's options: its constructor's fields other than `name`, with their defaults (the
    built-in policies take none; a dotted-path class may)."""
    if not dataclasses.is_dataclass(policy):
        return {}
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else None
        for f in dataclasses.fields(policy)
        if f.init and f.name != "name"
    }


def make_policy(name: str) -> DispatchPolicy:
    """A fresh policy by its name in `DISPATCH`, or by a dotted path `package.module:Class` to a class with
    `name`, `begin_step` and `assign` (constructed with no arguments)."""
    if name in DISPATCH:
        return DISPATCH[name]()
    if name in RENAMED:
        raise ValueError(f"dispatch {name!r} is now {RENAMED[name]!r}")
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown dispatch {name!r}; valid: {', '.join(DISPATCH)}, or package.module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"dispatch {name!r} cannot be loaded: {err}") from None
    try:
        policy = cls()
    except Exception as err:  # any user class, any failure: the caller shows one line, not a traceback
        raise ValueError(f"dispatch {name!r} cannot be constructed with no arguments: {err}") from None
    if not isinstance(policy, DispatchPolicy):
        raise ValueError(f"dispatch {name!r} is not a policy: it needs name, begin_step and assign")
    return policy


def engine_queues(engines: Sequence[int], n_engines: int) -> list[list[int]]:
    """Per engine, the indices of the units assigned to it (`engines`: one per unit), in the units' order."""
    out: list[list[int]] = [[] for _ in range(n_engines)]
    for i, w in enumerate(engines):
        out[w].append(i)
    return out


# Each engine's queue order (rollout/placement.py reorder): as dispatched, HistoPipe's alternation by step,
# or longest first on every step.
ORDERS = ("fifo", "alternate", "long-first")


# What the controller of a mode on W engines (rollout/multi.py) takes of DispatchOptions: it admits requests
# as the strategy adds them, so there is no per-engine queue for `order` to arrange.
CONTROLLER_TAKES = ("dispatch", "migrate")


@dataclass(frozen=True)
class DispatchOptions(Options):
    """The options of a rollout over W engines: the policy, migration and queue order; `migrate` and `order`
    left to auto follow the policy (`migrates`, `queue_order`: the trainer's and the simulator's one rule)."""

    dispatch: str = option(
        DEFAULT_DISPATCH,
        "which engine runs which request (rollout/dispatch.py; rlbench modes lists the policies)",
        choices=tuple(DISPATCH),
        dotted_path=True,
        multi_worker=True,
        simulated=True,
    )
    migrate: bool | None = option(
        None,
        "straggler migration: an engine that runs dry takes not-started requests from the busiest; auto = on "
        "for dispatch histopipe",
        null_word="auto",
        multi_worker=True,
        simulated=True,
    )
    order: str | None = option(
        None,
        "each engine's queue order; auto = alternate for dispatch histopipe, else fifo",
        choices=ORDERS,
        null_word="auto",
        multi_worker=True,
        simulated=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy()  # a dotted path that does not load is this record's one-line ValueError

    def policy(self) -> DispatchPolicy:
        return make_policy(self.dispatch)

    @property
    def migrates(self) -> bool:
        return self.dispatch == "histopipe" if self.migrate is None else self.migrate

    @property
    def queue_order(self) -> str:
        return self.order or ("alternate" if self.dispatch == "histopipe" else "fifo")
