"""The dispatch policies (rollout/dispatch.py): each one's characteristic property, the registry (a dotted
path to a user's class, bad names as one line), the dispatch trace event and the multi-engine metrics
recomputed from raw events, and the trainer's recorded decisions against the simulator's call of the same
policy."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.errors import UserError
from reference_trainer.rollout.dispatch import DISPATCH, DispatchOptions, EngineLoad, Unit, make_policy
from reference_trainer.trace.metrics import compute
from reference_trainer.trace.schema import DISPATCH as DISPATCH_KIND
from reference_trainer.trace.schema import check_events, dispatch_event, phase_event
from reference_trainer.trace.steps import step_metrics
from reference_trainer.trace.writer import Trace


def run(name: str, units: list[Unit], load: EngineLoad, step: int = 0) -> list[int]:
    policy = make_policy(name)
    policy.begin_step(step)
    return policy.assign(units, load)


# ---- each policy's own property ------------------------------------------------------------------------


def test_round_robin_deals_whole_groups_in_turn_from_engine_0_each_step_whatever_the_load():
    policy, load = make_policy("round-robin"), EngineLoad([0, 9, 0], [0.0, 1e6, 0.0])  # engine 1 is loaded
    units = [Unit(g, 1.0) for g in (7, 7, 3, 3, 9, 5)]
    policy.begin_step(0)
    assert policy.assign(units, load) == [0, 0, 1, 1, 2, 0]
    assert policy.assign([Unit(3, 1.0), Unit(11, 1.0)], load) == [1, 1]  # the turn goes on within a step
    policy.begin_step(1)
    assert policy.assign([Unit(12, 1.0)], load) == [0]


def test_least_in_flight_counts_requests_not_tokens():
    load = EngineLoad([2, 0, 1], [0.0, 500.0, 0.0])
    assert run("least-in-flight", [Unit(g, 1.0) for g in range(4)], load) == [1, 1, 2, 0]
    assert load.in_flight == [3, 2, 2]


def test_least_tokens_weighs_predicted_work_not_counts():
    load = EngineLoad([0, 5], [100.0, 0.0])
    assert run("least-tokens", [Unit(0, 60.0), Unit(1, 60.0), Unit(2, 10.0)], load) == [1, 1, 0]
    assert load.tokens == [110.0, 120.0]


def test_group_sticky_keeps_a_group_on_one_engine_across_batches():
    policy, load = make_policy("group-sticky"), EngineLoad.empty(3)
    policy.begin_step(0)
    first = policy.assign([Unit(g, 1.0) for g in (0, 0, 1, 1, 2, 2)], load)
    assert first == [0, 0, 1, 1, 2, 2]
    # a later batch: group 1's next samples go back to its engine though engine 1 is no longer the least
    later = policy.assign([Unit(1, 1.0), Unit(3, 1.0), Unit(1, 1.0)], load)
    assert later[0] == later[2] == 1 and later[1] == 0
    policy.forget(1)
    assert policy.assign([Unit(1, 1.0)], load) != [1]  # free to move once trained


@settings(max_examples=100, deadline=None)
@given(engines=st.integers(1, 6), size=st.integers(1, 12), busy=st.lists(st.integers(0, 4), min_size=6))
def test_group_spread_puts_a_groups_samples_on_distinct_engines(engines, size, busy):
    load = EngineLoad(busy[:engines], [0.0] * engines)
    got = run("group-spread", [Unit(0, 1.0)] * size, load)
    for start in range(0, size, engines):  # every `engines` samples use each engine once
        chunk = got[start : start + engines]
        assert len(set(chunk)) == len(chunk)


def test_group_spread_deals_least_in_flight_first_counting_requests_not_tokens():
    load = EngineLoad([3, 0, 1, 5], [0.0, 1000.0, 0.0, 0.0])  # engine 1: idle by count, loaded by tokens
    assert run("group-spread", [Unit(0, 1.0)] * 4, load) == [1, 2, 0, 3]
    assert load.in_flight == [4, 1, 2, 6]
    # the next group starts again from the least in flight; a group's samples past W wrap the same way
    assert run("group-spread", [Unit(1, 1.0)] * 2 + [Unit(2, 1.0)] * 5, load) == [1, 2, 1, 2, 0, 3, 1]


def test_histopipe_puts_the_longest_first_on_the_least_loaded_engine():
    load = EngineLoad([0, 0], [50.0, 0.0])
    units = [Unit(0, 10.0), Unit(1, 100.0), Unit(2, 40.0), Unit(3, 30.0)]
    # LPT: 100 -> engine 1 (0 tokens), 40 -> engine 0 (50), 30 -> engine 0 (90 < 100), 10 -> engine 1
    assert run("histopipe", units, load) == [1, 1, 0, 0]
    assert load.tokens == [120.0, 110.0]
    # the order the units come in does not change where each goes
    assert run("histopipe", units[::-1], EngineLoad([0, 0], [50.0, 0.0])) == [0, 0, 1, 1]


@settings(max_examples=100, deadline=None)
@given(
    works=st.lists(st.floats(0.0, 1e4, allow_nan=False), max_size=40),
    engines=st.integers(1, 7),
    group_size=st.integers(1, 4),
)
def test_every_policy_keeps_the_load_it_was_given(works, engines, group_size):
    for name in DISPATCH:
        load = EngineLoad([1] * engines, [5.0] * engines)
        got = run(name, [Unit(i // group_size, w) for i, w in enumerate(works)], load)
        assert len(got) == len(works) and all(0 <= w < engines for w in got), name
        assert sum(load.in_flight) == engines + len(works), name
        for w in range(engines):
            mine = sum(x for x, e in zip(works, got, strict=True) if e == w)
            assert load.tokens[w] == pytest.approx(5.0 + mine), name


# ---- the registry: a user's class by dotted path, and bad names ---------------------------------------


@dataclass
class LastEngine:
    """Every request to the last engine (a user's policy, by dotted path)."""

    name: str = "last-engine"

    def begin_step(self, step: int) -> None:
        pass

    def assign(self, units, load):
        for u in units:
            load.add(load.engines - 1, u.work)
        return [load.engines - 1] * len(units)


class NotAPolicy:
    pass


def test_a_dotted_path_names_a_users_policy_for_the_trainer_and_the_simulator():
    from rlbench.simulate.modes import sim_mode
    from rlbench.simulate.scheduler import simulate_mode
    from rlbench.simulate.workload import synthetic

    path = f"{__name__}:LastEngine"
    assert make_policy(path).name == "last-engine"
    assert DispatchOptions(dispatch=path).policy().name == "last-engine"
    tr = synthetic(steps=1, prompts=6, group_size=2, mean_tokens=40, sigma=0.5, max_tokens=200, seed=1)
    pred = np.full(len(tr), 40.0)
    res = simulate_mode(sim_mode("baseline", {"dispatch": path}), tr, pred, pred, _cost(), 3, 4, 1)
    busy = res["steps"][0]
    assert busy["busy_sum"] == pytest.approx(busy["busy_max"])  # one engine did everything


def _cost():
    from rlbench.simulate.cost import preset

    return preset("h100", "7b")


def test_bad_policy_names_are_one_line():
    from reference_trainer.modes import get_mode

    for name, message in (
        ("nope", "unknown dispatch 'nope'; valid: round-robin, least-in-flight"),
        ("least-outstanding", "dispatch 'least-outstanding' is now 'least-in-flight'"),
        ("no.such.module:X", "dispatch 'no.such.module:X' cannot be loaded"),
        (f"{__name__}:Missing", "cannot be loaded"),
        (f"{__name__}:NotAPolicy", "is not a policy: it needs name, begin_step and assign"),
        ("datetime:date", "dispatch 'datetime:date' cannot be constructed with no arguments"),
        ("json:loads", "dispatch 'json:loads' cannot be constructed with no arguments"),
    ):
        with pytest.raises(ValueError, match=message):
            make_policy(name)
        line = "is now dispatch=least-in-flight" if "is now" in message else message.split(";")[0]
        with pytest.raises(UserError, match=line) as err:
            get_mode("baseline").check_options({"dispatch": name}, workers=2)
        assert "\n" not in str(err.value)


def test_simulate_dispatch_runs_each_mode_under_each_policy(tmp_path):
    from rlbench.simulate.config import SimConfig

    cfg = SimConfig.from_cli("1,2", "baseline,sorted", None, "least-tokens,group-spread", synthetic=True)
    assert cfg.entries == [
        "baseline:dispatch=least-tokens",
        "baseline:dispatch=group-spread",
        "sorted:dispatch=least-tokens",
        "sorted:dispatch=group-spread",
    ]
    with pytest.raises(UserError, match="^--dispatch: unknown dispatch 'fifo'"):
        SimConfig.from_cli(None, "baseline", None, "fifo", synthetic=True)


# ---- the trace: the dispatch event and the multi-engine metrics, from raw events ------------------------


def _decode(w: int, t0: float, t1: float, slots: int, step: int = 0) -> dict:
    return {"kind": "decode", "t_start": t0, "t_end": t1, "active_slots": slots, "capacity": 2,
            "tokens": slots, "worker": w, "step": step}  # fmt: skip


def test_multi_engine_metrics_from_a_hand_built_trace():
    events = [
        phase_event("rollout", 0.0, 4.0, step=0),
        _decode(0, 0.0, 1.0, 2), _decode(0, 1.0, 2.0, 1),  # engine 0 runs 0..2
        _decode(1, 0.0, 0.5, 2), _decode(1, 3.0, 4.0, 1),  # engine 1 runs 0..0.5 and 3..4
        dispatch_event(0.0, 0, "least-tokens", [0, 0, 1], [30.0, 10.0]),
        dispatch_event(0.1, 0, "least-tokens", [1], [10.0, 10.0]),
    ]  # fmt: skip
    (s,) = step_metrics(check_events(events, "test"))
    # idle while the other runs: engine 1 in 0.5..1 and 1..2, engine 0 in 3..4; nobody runs in 2..3
    assert s["cross_engine_idle_s"] == pytest.approx(2.5) and s["engine_span_s"] == pytest.approx(8.0)
    assert s["cross_engine_idle_share"] == pytest.approx(2.5 / 8) and s["straggler_engine"] == 1
    # each engine's slot-time over its 2 slots x the 4 s window; the global bubble is their mean here
    assert s["engine_bubble"] == {"0": pytest.approx(1 - 3 / 8), "1": pytest.approx(1 - 2 / 8)}
    assert s["bubble_ratio"] == pytest.approx(1 - 5 / 16)
    assert s["dispatch_imbalance"] == pytest.approx((1.5 + 1.0) / 2) and s["dispatches"] == 2
    later = [{**e, "step": 1} for e in events[:5]]  # a second step like the first, no dispatch events
    summary = compute(events + later)["summary"]
    assert summary["straggler_steps"] == {"1": 2}
    assert summary["cross_engine_idle_share"] == pytest.approx(5.0 / 16)
    assert summary["engine_bubble"]["1"] == pytest.approx(0.75) and summary["dispatch_imbalance"] == 1.25


def test_an_engine_lost_leaves_the_metrics_from_its_loss_on():
    """Engine 1 is lost at t = 1 of step 0: a dispatch after that reads only engine 0's tokens, and from
    step 1 its slots are no idle slots (engine 0 full is no bubble); in step 0 it held its slots."""
    from reference_trainer.trace.schema import engine_lost_event

    events = [
        phase_event("rollout", 0.0, 2.0, step=0),
        _decode(0, 0.0, 2.0, 2), _decode(1, 0.0, 1.0, 2),
        dispatch_event(0.0, 0, "least-tokens", [0, 1], [10.0, 10.0]),
        engine_lost_event(1.0, 0, 1, 1),
        dispatch_event(1.0, 0, "least-tokens", [0], [20.0, 0.0]),
        phase_event("rollout", 2.0, 4.0, step=1),
        _decode(0, 2.0, 4.0, 2, step=1),
        dispatch_event(2.0, 1, "least-tokens", [0, 0], [20.0, 0.0]),
    ]  # fmt: skip
    first, second = step_metrics(check_events(events, "test"))
    assert first["dispatch_imbalance"] == 1.0 and first["bubble_ratio"] == pytest.approx(0.25)
    assert second["dispatch_imbalance"] == 1.0 and second["bubble_ratio"] == 0.0
    assert second["engine_bubble"] == {"0": 0.0} and second["cross_engine_idle_share"] == 0.0
    # the trainer's row of step 1: the run's capacities, the earlier loss and the step's events
    (row,) = step_metrics([events[4], *events[6:]], {0: 2, 1: 2})
    assert row["bubble_ratio"] == 0.0 and row["engine_bubble"] == {"0": 0.0}
    assert row["dispatch_imbalance"] == 1.0


def test_a_malformed_dispatch_event_is_one_line():
    good = dispatch_event(0.0, 0, "round-robin", [0, 1], [1.0, 1.0])
    for bad, message in (
        ({"engines": [0, -1]}, "engines is not a list of engine indices"),
        ({"tokens_outstanding": []}, "tokens_outstanding is not a list"),
        ({"engines": [2]}, "names an engine past the 2"),
    ):
        with pytest.raises(UserError, match=message):
            check_events([{**good, **bad}], "trace.jsonl")


def test_every_engine_event_names_its_engine():
    trace = Trace(worker=3)
    trace.engine_step("decode", 0.0, 1.0, {"0": "a"}, 4, 1)
    trace.add_phase("capture", 0.0, 0.5, graphs=2)  # the engine's capture goes through the phase writer
    trace.add_phase("rollout", 0.0, 1.0)  # a trainer phase names no engine
    assert [e.get("worker") for e in trace.events] == [3, 3, None]


# ---- a recorded run: the trainer's decisions are the simulator's ----------------------------------------


@pytest.mark.parametrize(("mode", "dispatch"), [("histopipe", "histopipe"), ("baseline", "least-tokens")])
def test_the_trainers_dispatch_decisions_equal_the_simulators(
    tiny_model_dir, toy_task, tmp_path, mode, dispatch
):
    """A LocalWorkerPool run at W = 2 records each step's decision; the simulator, replaying the run's
    length trace, calls the same policy on the same units and gets the same engines, step by step."""
    from test_multiworker import config

    from reference_trainer.train.trainer import Trainer
    from rlbench.simulate.jobs import Jobs, Stream
    from rlbench.simulate.scheduler import _dispatch
    from rlbench.simulate.workload import fill_predictions, from_run_trace

    cfg = config(tiny_model_dir, toy_task, mode, steps=3, mode_options={"dispatch": dispatch})
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.run()
    events = trainer.trace.events
    decisions = sorted((e for e in events if e["kind"] == DISPATCH_KIND), key=lambda e: e["step"])
    assert [d["step"] for d in decisions] == [0, 1, 2] and {d["policy"] for d in decisions} == {dispatch}

    lengths = from_run_trace(events)
    predicted = fill_predictions(lengths, 0.8)  # the run's own predictions (its sequence events carry them)
    assert not np.isnan(lengths.predicted).any()
    stream, policy, first = Stream.of(lengths), make_policy(dispatch), 0
    works = set()
    for step, decision in enumerate(decisions):
        uids = np.arange(first, first + stream.step_groups[step])
        first += uids.size
        rows, which = stream.expand(uids)
        works |= set(predicted[rows].tolist())
        got = _dispatch(policy, step, Jobs.empty(), uids[which], predicted[rows], 2, predicted)
        assert got.tolist() == decision["engines"], step
        tokens = np.bincount(got, weights=predicted[rows], minlength=2)
        assert tokens.tolist() == pytest.approx(decision["tokens_outstanding"])
    assert len(works) > 1  # history made the predictions differ: the decisions were not a count deal

    # the metrics, recomputed from the raw events
    steps = compute(events)["steps"]
    for s, decision in zip(steps, decisions, strict=True):
        forwards = [e for e in events if e["kind"] in ("prefill", "decode") and e["step"] == s["step"]]
        ends = {w: max(e["t_end"] for e in forwards if e["worker"] == w) for w in (0, 1)}
        assert s["straggler_engine"] == max(ends, key=ends.get)
        tok = decision["tokens_outstanding"]
        assert s["dispatch_imbalance"] == pytest.approx(max(tok) / (sum(tok) / 2))
        assert 0.0 <= s["cross_engine_idle_share"] <= 1.0 and set(s["engine_bubble"]) == {"0", "1"}


def test_rlbench_modes_lists_the_policies_from_the_registry(tmp_path):
    from conftest import cli

    from reference_trainer.rollout.dispatch import describe

    text = cli("modes", tmp=tmp_path).stdout.split("DISPATCH POLICIES", 1)[1]
    assert [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  ") and
            not line.startswith("   ")] == list(DISPATCH)  # fmt: skip
    doc = json.loads(cli("modes", "--json", tmp=tmp_path).stdout)["dispatch"]
    assert {n: d["description"] for n, d in doc.items()} == {n: describe(c) for n, c in DISPATCH.items()}
    assert all(d["description"] for d in doc.values())
    assert [n for n, d in doc.items() if d["auto_migrate"]] == ["histopipe"]
    assert doc["histopipe"]["auto_order"] == "alternate" and doc["round-robin"]["options"] == {}


def test_every_multi_engine_path_has_one_default_policy():
    """The placed baseline, the controller, a run ahead, the simulator and the mode table default alike."""
    import inspect

    from reference_trainer.modes import get_mode
    from reference_trainer.rollout.dispatch import DEFAULT_DISPATCH
    from reference_trainer.rollout.multi import Engines, MultiEngine
    from rlbench.simulate.modes import SimMode

    controller = inspect.signature(MultiEngine).parameters["dispatch"].default
    defaults = {controller, Engines().dispatch, DispatchOptions().dispatch, SimMode("x").dispatch}
    defaults |= {get_mode(m).dispatch for m in ("baseline", "sorted", "sorted-partial", "async")}
    assert defaults == {DEFAULT_DISPATCH}


def test_an_engine_lost_event_is_checked_like_every_other_kind():
    from reference_trainer.trace.schema import ENGINE_LOST, engine_lost_event, migrate_event, problem

    event = engine_lost_event(1.5, 2, 1, 3)
    assert event["kind"] == ENGINE_LOST and problem(event) is None
    assert problem(migrate_event(1.0, 0, 1, 2)) is None
    assert problem({k: v for k, v in event.items() if k != "worker"}) == "worker is None, not a number"
    assert problem({**event, "requests": "3"}) == "requests is '3', not a number"
    assert problem({**event, "worker": -1}) == "worker is -1, not a worker index"


def test_the_timing_fields_are_the_ones_docs_metrics_names():
    """The dispatch fields follow the order engines report in (their speed): timing fields, named so."""
    import re
    from pathlib import Path

    from reference_trainer.train.rows import ROW_FIELDS, TIMING_FIELDS

    text = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    listed = re.search(r"Timing fields \((.*?)\) depend on the wall clock", text, re.S)
    assert listed is not None
    named = set(re.findall(r"`([^`]+)`", listed.group(1)))
    timing = {f for f in TIMING_FIELDS if not f.startswith("timing_s/")} | {"timing_s/*"}
    assert named == timing and {"dispatches", "dispatch_imbalance"} <= TIMING_FIELDS & set(ROW_FIELDS)


def test_each_mode_lists_and_the_simulator_takes_only_the_dispatch_options_its_w_gt_1_run_takes():
    from reference_trainer.modes import MODES
    from rlbench.simulate.modes import sim_mode

    family = {"dispatch", "migrate", "order"}
    for name, mode in MODES.items():
        listed = family & set(mode.options())
        if mode.dispatch is None:  # one engine only: no dispatch of its own anywhere
            assert not listed, name
        else:  # what `rlbench modes` and the simulator list is what a W = 2 run takes
            assert listed == family & set(mode.options(2)), name
            assert listed == ({"dispatch", "migrate"} if mode.controlled else family), name
    with pytest.raises(UserError, match=re.escape("mode 'sorted' takes no option order")):
        sim_mode("sorted", {"order": "long-first"})
    assert sim_mode("sorted+lookahead", {"dispatch": "least-tokens"}).dispatch == "least-tokens"
