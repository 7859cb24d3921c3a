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

import heapq
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


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

    def imbalance(self) -> float:
        """Max over mean predicted tokens outstanding (1.0 = even; 0 engines loaded counts as even)."""
        mean = sum(self.tokens) / len(self.tokens)
        return max(self.tokens) / mean if mean > 0 else 1.0


@runtime_checkable
class DispatchPolicy(Protocol):
    name: str

    def begin_step(self, step: int) -> None: ...

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        """An engine per unit (in the order of `units`); `load` is updated with every unit assigned."""
        ...


class _Least:
    """The engine with the least `key` (ties: lowest id), kept in a heap that stays valid while only the
    assigning policy changes the load."""

    def __init__(self, load: EngineLoad, by_tokens: bool) -> None:
        self.load, self.by_tokens = load, by_tokens
        self.heap = [(self._key(w), w) for w in range(load.engines)]
        heapq.heapify(self.heap)

    def _key(self, w: int) -> float:
        return self.load.tokens[w] if self.by_tokens else float(self.load.in_flight[w])

    def take(self, work: float) -> int:
        _, w = heapq.heappop(self.heap)
        self.load.add(w, work)
        heapq.heappush(self.heap, (self._key(w), w))
        return w


@dataclass
class RoundRobin:
    name: str = "round-robin"
    turn: int = 0
    _step_groups: dict[int, int] = field(default_factory=dict)

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


@dataclass
class LeastInFlight:
    name: str = "least-in-flight"

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least = _Least(load, by_tokens=False)
        return [least.take(u.work) for u in units]


@dataclass
class LeastTokens:
    name: str = "least-tokens"

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least = _Least(load, by_tokens=True)
        return [least.take(u.work) for u in units]


@dataclass
class GroupSticky:
    name: str = "group-sticky"
    engine_of: dict[int, int] = field(default_factory=dict)

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least, out = _Least(load, by_tokens=False), []
        for u in units:
            w = self.engine_of.get(u.group)
            if w is None or w >= load.engines:
                w = self.engine_of[u.group] = least.take(u.work)
            else:
                load.add(w, u.work)
                least = _Least(load, by_tokens=False)  # the load moved outside the heap
            out.append(w)
        return out

    def forget(self, group: int) -> None:
        """A group trained (or dropped): its engine is free to change."""
        self.engine_of.pop(group, None)


@dataclass
class GroupSpread:
    name: str = "group-spread"

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        # A group's samples go to distinct engines while there are engines it has not used, least in flight
        # first; with more samples than engines, the deal wraps.
        out, used = [], {}
        for u in units:
            seen = used.setdefault(u.group, set())
            if len(seen) >= load.engines:
                seen.clear()
            w = min((e for e in range(load.engines) if e not in seen), key=lambda e: (load.in_flight[e], e))
            seen.add(w)
            load.add(w, u.work)
            out.append(w)
        return out


@dataclass
class HistoPipe:
    name: str = "histopipe"

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units: Sequence[Unit], load: EngineLoad) -> list[int]:
        least, out = _Least(load, by_tokens=True), [0] * len(units)
        for i in sorted(range(len(units)), key=lambda i: (-units[i].work, i)):
            out[i] = least.take(units[i].work)
        return out


DISPATCH: dict[str, type] = {
    p.name: p for p in (RoundRobin, LeastInFlight, LeastTokens, GroupSticky, GroupSpread, HistoPipe)
}


def make_policy(name: str) -> DispatchPolicy:
    """A fresh policy by its name in `DISPATCH`, or by a dotted path `package.module:Class` to a class with
    `name`, `begin_step` and `assign` (constructed with no arguments)."""
    if name in DISPATCH:
        return DISPATCH[name]()
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown dispatch {name!r}; valid: {', '.join(DISPATCH)}, or package.module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"dispatch {name!r} cannot be loaded: {err}") from None
    policy = cls()
    if not isinstance(policy, DispatchPolicy):
        raise ValueError(f"dispatch {name!r} is not a policy: it needs name, begin_step and assign")
    return policy
