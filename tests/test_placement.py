"""Dispatch policies in the roles of the former placement functions (HistoPipe and its baselines), each
engine's queue order, and the length predictor."""

from __future__ import annotations

import heapq
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.rollout.dispatch import DispatchOptions, EngineLoad, Unit, engine_queues, make_policy
from reference_trainer.rollout.placement import LengthHistory, reorder

works = st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=0, max_size=60)


def units_of(ws: list[float], group_size: int = 1) -> list[Unit]:
    return [Unit(i // group_size, w) for i, w in enumerate(ws)]


def assign(name: str, units: list[Unit], workers: int, step: int = 0) -> tuple[list[int], list[float]]:
    """A fresh policy's engines for `units` on idle engines, and the predicted tokens each then holds."""
    policy, load = make_policy(name), EngineLoad.empty(workers)
    policy.begin_step(step)
    return policy.assign(units, load), load.tokens


def queues(name: str, units: list[Unit], workers: int, step: int, order: str) -> list[list[int]]:
    """Each engine's queue as the trainer's placed strategy builds it."""
    return reorder(engine_queues(assign(name, units, workers, step)[0], workers), units, step, order)


# ---- the former placement functions (rollout/placement.py before dispatch.py), frozen as the oracle -------


def _old_round_robin(units, workers, step=0):
    slot = {g: i % workers for i, g in enumerate(sorted(set(u.group for u in units)))}
    placement = [[] for _ in range(workers)]
    for i, unit in enumerate(units):
        placement[slot[unit.group]].append(i)
    return placement


def _old_least_outstanding(units, workers, step=0):
    placement = [[] for _ in range(workers)]
    for i in range(len(units)):
        placement[min(range(workers), key=lambda w: (len(placement[w]), w))].append(i)
    return placement


def _old_histopipe(units, workers, step=0):
    placement, heap = [[] for _ in range(workers)], [(0.0, w) for w in range(workers)]
    for i in sorted(range(len(units)), key=lambda i: (-units[i].work, i)):
        load, w = heapq.heappop(heap)
        placement[w].append(i)
        heapq.heappush(heap, (load + units[i].work, w))
    return reorder(placement, units, step, "alternate")


OLD = {
    "round-robin": _old_round_robin,
    "least-in-flight": _old_least_outstanding,
    "histopipe": _old_histopipe,
}


@settings(max_examples=200, deadline=None)
@given(ws=works, workers=st.integers(1, 8), steps=st.integers(1, 4), group_size=st.integers(1, 4))
def test_the_policies_give_the_former_placements(ws, workers, steps, group_size):
    """round-robin, least-in-flight (least-outstanding) and histopipe assign every request to the engine the
    former placement functions did, and the trainer's queues (after the mode's order) are the same, step
    after step with one policy object, as the placed strategy keeps it."""
    units = units_of(ws, group_size)
    for name, old in OLD.items():
        policy, order = make_policy(name), DispatchOptions(dispatch=name).queue_order
        for step in range(steps):
            policy.begin_step(step)
            engines = policy.assign(units, EngineLoad.empty(workers))
            was = old(units, workers, step)
            assert [sorted(q) for q in engine_queues(engines, workers)] == [sorted(q) for q in was], name
            got = reorder(engine_queues(engines, workers), units, step, order)
            assert got == reorder(was, units, step, order), name


# ---- the former placement tests, now on the policies ------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(ws=works, workers=st.integers(1, 8), step=st.integers(0, 5), group_size=st.integers(1, 4))
def test_every_unit_placed_exactly_once(ws, workers, step, group_size):
    units = units_of(ws, group_size)
    for name in (
        "round-robin",
        "least-in-flight",
        "least-tokens",
        "group-sticky",
        "group-spread",
        "histopipe",
    ):
        engines, tokens = assign(name, units, workers, step)
        assert len(engines) == len(units) and all(0 <= w < workers for w in engines), name
        assert sum(tokens) == pytest.approx(sum(ws)), name


@settings(max_examples=200, deadline=None)
@given(ws=works, workers=st.integers(1, 8))
def test_lpt_within_graham_bound(ws, workers):
    # Any list schedule: makespan <= total / W + the largest unit.
    _, placed = assign("histopipe", units_of(ws), workers)
    if ws:
        assert max(placed) <= sum(ws) / workers + max(ws) + 1e-6


def optimal_makespan(ws: list[float], workers: int) -> float:
    return min(
        max(sum(w for w, a in zip(ws, assign, strict=True) if a == k) for k in range(workers))
        for assign in itertools.product(range(workers), repeat=len(ws))
    )


@settings(max_examples=150, deadline=None)
@given(
    ws=st.lists(st.integers(1, 50).map(float), min_size=1, max_size=7),
    workers=st.integers(2, 3),
)
def test_lpt_within_four_thirds_of_optimal(ws, workers):
    makespan = max(assign("histopipe", units_of(ws), workers)[1])
    assert makespan <= (4 / 3 - 1 / (3 * workers)) * optimal_makespan(ws, workers) + 1e-9


def test_lpt_beats_round_robin_on_a_skewed_batch():
    ws = [100.0, 5.0, 90.0, 5.0, 4.0, 3.0]  # round-robin puts both long ones on worker 0
    units = units_of(ws)
    assert assign("round-robin", units, 2)[1] == [194.0, 13.0]
    assert sorted(assign("histopipe", units, 2)[1]) == [103.0, 104.0]


@given(ws=works, workers=st.integers(1, 8))
def test_least_in_flight_equalises_counts(ws, workers):
    sizes = [len(q) for q in engine_queues(assign("least-in-flight", units_of(ws), workers)[0], workers)]
    assert max(sizes) - min(sizes) <= 1


@given(groups=st.integers(1, 20), group_size=st.integers(1, 5), workers=st.integers(1, 6))
def test_round_robin_keeps_groups_together_and_cycles(groups, group_size, workers):
    units = units_of([1.0] * groups * group_size, group_size)
    for w, queue in enumerate(queues("round-robin", units, workers, 0, "fifo")):
        assert {units[i].group % workers for i in queue} <= {w}
        assert queue == sorted(queue)  # stream order kept


@given(ws=works, workers=st.integers(1, 4), step=st.integers(0, 9))
def test_histopipe_alternates_order_by_step(ws, workers, step):
    units = units_of(ws)
    for queue in queues("histopipe", units, workers, step, "alternate"):
        seq = [units[i].work for i in queue]
        assert seq == sorted(seq, reverse=step % 2 == 0)


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dispatch 'fifo'; valid: round-robin"):
        make_policy("fifo")
    with pytest.raises(ValueError, match="dispatch 'least-outstanding' is now 'least-in-flight'"):
        make_policy("least-outstanding")


def test_length_history_predicts_last_epoch_then_a_fitted_prior():
    h = LengthHistory(default=7.0)
    assert h.predict("a", 10) == 7.0  # nothing seen yet
    h.record("a", 10, [20, 40])
    assert h.predict("a", 10) == 30.0
    assert h.predict("b", 99) == 30.0  # one point: the mean
    h.record("b", 20, [50, 50])
    assert h.predict("c", 30) == pytest.approx(70.0)  # the line through (10, 30) and (20, 50)
    h.record("a", 10, [10])  # the latest epoch replaces the older one
    assert h.predict("a", 10) == 10.0
    restored = LengthHistory()
    restored.load_state_dict(h.state_dict())
    assert restored.predict("a", 10) == 10.0
    assert restored.predict("z", 15) == pytest.approx(h.predict("z", 15))


@given(ws=works, workers=st.integers(1, 4), step=st.integers(0, 9))
def test_reorder_long_first_and_fifo(ws, workers, step):
    units = units_of(ws)
    placed = queues("histopipe", units, workers, step, "fifo")
    assert reorder(placed, units, step, "fifo") == placed
    for queue in reorder(placed, units, step, "long-first"):
        seq = [units[i].work for i in queue]
        assert seq == sorted(seq, reverse=True)
    with pytest.raises(ValueError, match="unknown order 'random'"):
        reorder(placed, units, step, "random")
