"""Placement policies (HistoPipe and its baselines) and the length predictor, as pure functions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.rollout.placement import (
    PLACEMENTS,
    LengthHistory,
    Unit,
    balance,
    get_placement,
    histopipe,
    least_outstanding,
    loads,
    reorder,
    round_robin,
)

works = st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=0, max_size=60)


def units_of(ws: list[float], group_size: int = 1) -> list[Unit]:
    return [Unit(i // group_size, w) for i, w in enumerate(ws)]


@settings(max_examples=200, deadline=None)
@given(ws=works, workers=st.integers(1, 8), step=st.integers(0, 5), group_size=st.integers(1, 4))
def test_every_unit_placed_exactly_once(ws, workers, step, group_size):
    units = units_of(ws, group_size)
    for name, place in PLACEMENTS.items():
        placement = place(units, workers, step)
        assert len(placement) == workers, name
        assert sorted(i for q in placement for i in q) == list(range(len(units))), name


@settings(max_examples=200, deadline=None)
@given(ws=works, workers=st.integers(1, 8))
def test_lpt_within_graham_bound(ws, workers):
    # Any list schedule: makespan <= total / W + the largest unit.
    placed = loads(balance(ws, workers), ws)
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
    makespan = max(loads(balance(ws, workers), ws))
    assert makespan <= (4 / 3 - 1 / (3 * workers)) * optimal_makespan(ws, workers) + 1e-9


def test_lpt_beats_round_robin_on_a_skewed_batch():
    ws = [100.0, 5.0, 90.0, 5.0, 4.0, 3.0]  # round-robin puts both long ones on worker 0
    units = units_of(ws)
    assert loads(round_robin(units, 2), ws) == [194.0, 13.0]
    assert sorted(loads(histopipe(units, 2), ws)) == [103.0, 104.0]


@given(ws=works, workers=st.integers(1, 8))
def test_least_outstanding_equalises_counts(ws, workers):
    sizes = [len(q) for q in least_outstanding(units_of(ws), workers)]
    assert max(sizes) - min(sizes) <= 1


@given(groups=st.integers(1, 20), group_size=st.integers(1, 5), workers=st.integers(1, 6))
def test_round_robin_keeps_groups_together_and_cycles(groups, group_size, workers):
    units = units_of([1.0] * groups * group_size, group_size)
    placement = round_robin(units, workers)
    for w, queue in enumerate(placement):
        assert {units[i].group % workers for i in queue} <= {w}
        assert queue == sorted(queue)  # stream order kept


@given(ws=works, workers=st.integers(1, 4), step=st.integers(0, 9))
def test_histopipe_alternates_order_by_step(ws, workers, step):
    units = units_of(ws)
    for queue in histopipe(units, workers, step):
        seq = [units[i].work for i in queue]
        assert seq == sorted(seq, reverse=step % 2 == 0)


def test_unknown_placement_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown placement 'fifo'; valid: round-robin"):
        get_placement("fifo")


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
    placed = balance(ws, workers)
    assert reorder(placed, units, step, "fifo") == placed
    for queue in reorder(placed, units, step, "long-first"):
        seq = [units[i].work for i in queue]
        assert seq == sorted(seq, reverse=True)
    with pytest.raises(ValueError, match="unknown order 'random'"):
        reorder(placed, units, step, "random")
