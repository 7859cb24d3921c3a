"""`rlbench simulate validate`'s arithmetic on synthetic numbers: the cross-engine idle, the verdict's bound
(3 points on the bubble and on the cross-engine idle, forwards equal per engine in every step) and the
command's one-line refusals. The replay of real runs is tests/test_simulate_validation.py's."""

from __future__ import annotations

import json

import pytest
from conftest import cli

from reference_trainer.errors import UserError
from rlbench.simulate.replay import ValidateConfig, run_mode, table, verdict


def doc(bubble=(0.60, 0.61), idle=(0.10, 0.11), forwards=((10, 7), (10, 7)), steps=(1, 1)) -> dict:
    """A run's replay with measured/simulated bubble, cross-engine idle and one step's forwards per engine."""
    return {
        "run": "r",
        "mode": "baseline",
        "dispatch": "round-robin",
        "workers": 2,
        "measured_bubble": bubble[0],
        "simulated_bubble": bubble[1],
        "measured_cross_engine_idle": idle[0],
        "simulated_cross_engine_idle": idle[1],
        "measured_engine_forwards": list(forwards[0]),
        "simulated_engine_forwards": list(forwards[1]),
        "measured_steps": steps[0],
        "simulated_steps": steps[1],
        "steps": [
            {
                "step": 0,
                "measured_engine_forwards": list(forwards[0]),
                "simulated_engine_forwards": list(forwards[1]),
            }
        ],
    }


def test_the_replays_forwards_are_read_by_the_traces_own_cross_engine_idle():
    """A replay's rounds as forward events: engine 0 runs 2 forwards of 1 s (each followed by 0.5 s of host
    gap) from t = 0, engine 1 one forward of 1 s from t = 0: engine 1 idles while engine 0 runs its second
    forward (1 s of the 2.5 s span: the gap between forwards is no engine's forward)."""
    import numpy as np

    from rlbench.simulate.engine import Rounds
    from rlbench.simulate.replay import simulated_idle
    from rlbench.simulate.scheduler import forward_events

    one = lambda a, b: np.array([[a, b]])  # noqa: E731
    rounds = Rounds(t0=one(0.0, 0.0), busy=one(2.0, 1.0), gap=one(1.0, 0.5), occupied=one(4, 4),
                    it0=one(0, 0), k=one(2, 1), prefill=one(0, 0))  # fmt: skip
    events = forward_events(rounds, horizon=10.0)
    assert [(e["worker"], e["t_start"], e["t_end"]) for e in events] == [
        (0, 0.0, 1.0),
        (0, 1.5, 2.5),
        (1, 0.0, 1.0),
    ]
    idle, span = simulated_idle({"forward_events": events}, [0, 1])
    assert idle == pytest.approx(1.0) and span == pytest.approx(2 * 2.5)
    cut = forward_events(rounds, horizon=2.0)  # an early-terminated step: forwards end at the horizon
    assert [(e["worker"], e["t_end"]) for e in cut] == [(0, 1.0), (0, 2.0), (1, 1.0)]


def test_within_three_points_and_equal_forwards_holds():
    v = verdict(doc(bubble=(0.60, 0.629), idle=(0.10, 0.071)))
    assert v["holds"] and v["forwards_equal"]
    assert v["bubble_error_points"] == pytest.approx(2.9) and v[
        "cross_engine_idle_error_points"
    ] == pytest.approx(2.9)
    assert v["text"].startswith("holds: bubble 60.0% measured, 62.9% simulated (2.9 points)")


@pytest.mark.parametrize(
    "changed, said",
    [
        ({"bubble": (0.60, 0.631)}, "bubble 60.0% measured, 63.1% simulated (3.1 points > 3)"),
        ({"idle": (0.20, 0.10)}, "cross-engine idle 20.0% measured, 10.0% simulated (10.0 points > 3)"),
        (
            {"forwards": ((10, 7), (10, 8))},
            "forwards per engine differ in 1 of 1 steps (step 0: measured [10, 7]",
        ),
        ({"steps": (2, 1)}, "steps differ: 2 measured, 1 simulated"),
    ],
)
def test_a_disagreement_does_not_hold_and_says_which(changed, said):
    v = verdict(doc(**changed))
    assert not v["holds"]
    assert v["text"].startswith("does not hold: ") and said in v["text"]


def test_a_wider_tolerance_is_the_callers():
    assert verdict(doc(bubble=(0.60, 0.65)), tolerance=0.06)["holds"]
    assert not verdict(doc(bubble=(0.60, 0.65)))["holds"]


def test_the_table_names_the_simulated_forwards_where_they_differ():
    d = doc(forwards=((10, 7), (10, 8)))
    lines = table({"runs": [{**d, "verdict": verdict(d)}]})
    assert lines[-1].endswith("| 10, 7 (simulated 10, 8) | no |")


def test_the_runs_mode_comes_from_its_config(tmp_path):
    assert run_mode(tmp_path) == ("baseline", {})  # no config: a length log's trace, the baseline
    (tmp_path / "train_config.json").write_text(json.dumps({"mode": "sorted", "mode_options": {"x": 1}}))
    assert run_mode(tmp_path / "trace.jsonl") == ("sorted", {"x": 1})
    former = {
        "mode": "baseline",
        "mode_options": {"placement": "least-outstanding"},
    }  # a run of an older rlbench
    (tmp_path / "train_config.json").write_text(json.dumps(former))
    assert run_mode(tmp_path) == ("baseline", {"dispatch": "least-in-flight"})
    (tmp_path / "train_config.json").write_text(json.dumps({"mode": "sorted", "mode_options": [1]}))
    with pytest.raises(UserError, match="not a training run's config"):
        run_mode(tmp_path)


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no such run folder"):
        ValidateConfig((tmp_path,)).check()
    (tmp_path / "trace.jsonl").write_text("")
    with pytest.raises(UserError, match="named twice"):
        ValidateConfig((tmp_path, tmp_path)).check()
    with pytest.raises(UserError, match="--tolerance"):
        ValidateConfig((tmp_path,), tolerance=2.0).check()
    result = cli("simulate", "validate", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        "no such run folder or trace file" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "o").exists()


def test_an_engine_that_prefills_while_another_decodes_counts_its_own_forwards():
    """The vectorised engine steps all workers together: a worker whose queue refills an empty batch (a
    prefill of its own) while another decodes takes one forward, as it does alone (a real W = 2 run's queues,
    whose replay counted one forward too many on engine 0 before)."""
    import numpy as np

    from rlbench.simulate import engine
    from rlbench.simulate.cost import preset

    queues = [
        [37] * 6 + [11, 37, 26, 24, 24, 24, 24, 11, 24, 24],
        [35, 35, 10, 35, 10, 35, 37, 35, 96, 95, 11, 10, 11, 10, 96, 10],
    ]
    prompts = [[49.0] * 8 + [46.0] * 8, [50.0] * 8 + [64.0] * 8]
    cost = preset("h200", "embedded")

    def forwards(rows: list[int]) -> list[float]:
        tokens, ctx = np.array([queues[r] for r in rows]), np.array([prompts[r] for r in rows])
        q = engine.Queues(tokens, ctx, np.ones_like(ctx), np.full(len(rows), 16))
        return engine.run(q, 8, cost, 1.0, 32768).rounds.work(np.inf)[0].tolist()

    alone = forwards([0]) + forwards([1])
    assert alone == [61.0, 131.0]  # engine 0: 37 forwards, a prefill of 7, 23 decodes; as the trace counted
    assert forwards([0, 1]) == alone
