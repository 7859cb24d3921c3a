"""One definition of a mode: the registry agrees with the strategies it builds, and train and simulate
accept the same names and options with the same meaning."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cli
from test_simulate import UnitCost, heavy, run_policy

from reference_trainer.errors import UserError
from reference_trainer.modes import MODES, STRATEGY_TABLE, get_mode, make_mode_strategy
from reference_trainer.speculation.drafters import (
    DRAFTERS,
    SpeculationOptions,
    build_speculator,
    vllm_spec_options,
)
from rlbench.simulate import workload
from rlbench.simulate.modes import parse_sim_modes, sim_mode
from rlbench.simulate.scheduler import simulate_mode

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    return res.stderr


# ---- the registry and the strategies -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", [n for n, s in STRATEGY_TABLE.items() if s.options is not None])
def test_a_strategy_receives_its_options_as_its_record(strategy):
    """The registry's options of a strategy are its record's fields, and a value set on the command line
    arrives at the class in that record (no copy of a default or a range to hold equal)."""
    record = STRATEGY_TABLE[strategy].options
    mode = next(m for m in MODES.values() if m.strategy_for(2 if strategy == "placed" else 1) == strategy)
    workers = 2 if strategy == "placed" else 1
    names = {f.name for f in dataclasses.fields(record)}
    assert names <= set(mode.options(workers))
    key, value = ("dispatch", "least-in-flight") if strategy == "placed" else ("oversubscription", 3)
    built = make_mode_strategy(mode, workers, mode.resolve({key: value}, workers))
    assert type(built.options) is record and getattr(built.options, key) == value
    with pytest.raises(ValueError, match="must be >= 1|unknown dispatch"):  # checked once, by the record
        record(**{"oversubscription": 0.5} if strategy != "placed" else {"dispatch": "x"})


def test_each_drafter_receives_its_options_as_its_record():
    """A mode's spec.* values reach each drafter, the lookahead drafter and the speculator as their own
    records; the vLLM keys are those the vLLM engine maps."""
    from reference_trainer.engine.vllm_engine import speculative_config

    for name, spec in DRAFTERS.items():
        if spec.cls is None or name == "suffix":  # suffix needs arctic-inference (tests/test_suffix.py)
            continue
        built = build_speculator(SpeculationOptions.of({"drafter": name, "max_draft": 4, "margin": 0.2}))
        assert built.drafter.options == spec.options(max_draft=4) and built.options.margin == 0.2
    ahead = build_speculator({"drafter": "histospec", "lookahead": True, "max_draft": 5})
    assert ahead.drafter.options.max_draft == 5 and ahead.drafter.fallback.options.max_draft == 5
    with pytest.raises(ValueError, match="takes no option suffix_min_prob"):
        SpeculationOptions.of({"drafter": "histospec", "suffix_min_prob": 0.2})
    for o in vllm_spec_options().values():  # every vLLM key is one the vLLM engine maps, with its default
        speculative_config({o.key: o.default})
        assert o.key in speculative_config.__doc__
    with pytest.raises(ValueError):
        speculative_config({"min_confidence": 0.5})


def test_modes_build_their_strategies():
    for mode in MODES.values():
        strategy = make_mode_strategy(mode, 1, mode.resolve({}, 1))
        assert type(strategy) is STRATEGY_TABLE[mode.strategy].load()
        if mode.dispatch is None:
            with pytest.raises(UserError, match="runs on one engine"):
                mode.strategy_for(2)
        elif mode.controlled:  # SortedRL's own strategy over W engines, with its dispatch (rollout/multi.py)
            options = mode.resolve({}, 2)
            assert type(make_mode_strategy(mode, 2, options)) is STRATEGY_TABLE[mode.strategy].load()
            assert options.dispatch is not None and options.dispatch.dispatch == mode.dispatch
        else:
            placed = make_mode_strategy(mode, 2, mode.resolve({}, 2))
            assert placed.migrate == (mode.dispatch == "histopipe")
            assert placed.policy.name == mode.dispatch
    assert MODES["sorted+rhyme"].strategy == "sorted" and MODES["sorted+rhyme"].speculative
    assert MODES["sorted+suffix"].strategy == "sorted" and MODES["sorted+suffix"].speculation == "suffix"
    assert MODES["sorted-partial"].tis_cap == 2.0 and MODES["sorted"].tis_cap is None


def test_option_types_and_values_are_checked_from_the_registry():
    sorted_mode, rhyme = get_mode("sorted"), get_mode("rhyme")
    assert sorted_mode.check_options({"oversubscription": 3, "max_attempts": None}) == {
        "oversubscription": 3.0,
        "max_attempts": None,
    }
    for options, message in (
        ({"oversubscription": "abc"}, "option oversubscription must be a number, got 'abc'"),
        ({"oversubscription": 0.5}, "option oversubscription must be >= 1"),
        # 1e308 x a batch is inf: math.ceil raised OverflowError deep in the lookahead strategy
        ({"oversubscription": 1e308}, "option oversubscription must be within ±1e\\+06"),
        ({"max_staleness": 1.5}, "option max_staleness must be an integer"),
        ({"max_staleness": True}, "option max_staleness must be an integer"),
        # the former option and policy names: one line naming the new ones
        ({"placement": "histopipe"}, "option placement=histopipe is now dispatch=histopipe"),
        ({"placement": "least-outstanding"}, "placement=least-outstanding is now dispatch=least-in-flight"),
    ):
        with pytest.raises(UserError, match=message):
            sorted_mode.check_options(options)
    with pytest.raises(UserError, match="takes option dispatch only with --workers > 1"):
        sorted_mode.check_options({"dispatch": "histopipe"}, workers=1)
    with pytest.raises(UserError, match="unknown dispatch 'fifo'; valid: round-robin"):
        rhyme.check_options({"dispatch": "fifo"})
    with pytest.raises(UserError, match="dispatch 'no_such_module:Policy' cannot be loaded"):
        rhyme.check_options({"dispatch": "no_such_module:Policy"})
    # SortedRL dispatches over W > 1 engines (rollout/multi.py), with migration as the option says (auto:
    # on for histopipe only), and no queue order (it admits as it goes); a one-engine mode takes no dispatch
    assert sorted_mode.check_options({"dispatch": "histopipe"}, 2) == {"dispatch": "histopipe"}
    assert sorted_mode.check_options({"migrate": True}, 2) == {"migrate": True}
    for options, migrates in (({}, False), ({"dispatch": "histopipe"}, True), ({"migrate": True}, True)):
        assert sorted_mode.resolve(options, 2).dispatch.migrates is migrates  # type: ignore[union-attr]
    with pytest.raises(UserError, match="takes no option order"):
        sorted_mode.check_options({"order": "alternate"}, 2)
    with pytest.raises(UserError, match="takes option migrate only with --workers > 1"):
        sorted_mode.check_options({"migrate": True}, 1)
    assert get_mode("sorted+lookahead").check_options({"dispatch": "histopipe"}, 2) == {
        "dispatch": "histopipe"
    }
    with pytest.raises(UserError, match="unknown option spec.bogus"):
        rhyme.check_options({"spec": {"bogus": 1}})
    assert rhyme.check_options({"spec": {"max_draft": 4}}) == {"spec.max_draft": 4}
    # the engine picks the spec keys: vLLM's n-gram method is no reference-engine option
    assert rhyme.check_options({"spec": {"method": "ngram"}}, 1, "vllm")
    with pytest.raises(UserError, match="unknown option spec.method"):
        rhyme.check_options({"spec": {"method": "ngram"}})
    # dispatch options exist only where there is something to dispatch
    baseline = get_mode("baseline")
    assert "dispatch" not in baseline.options(1) and "dispatch" in baseline.options(2)


@pytest.mark.e2e
def test_the_registry_imports_no_torch():
    code = "import sys, reference_trainer.modes, rlbench.simulate.modes; print('torch' in sys.modules)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert probe.stdout.strip() == "False", probe.stderr


# ---- the simulator builds its policies from the registry --------------------------------------------------


def test_simulator_policies_follow_the_registry():
    for name, mode in MODES.items():
        p = sim_mode(name)
        assert p.spec == mode.speculative
        assert p.partial == (mode.strategy == "sorted-partial")
        assert (p.oversub > 1.0) == (mode.strategy in ("sorted", "sorted-partial"))
        assert p.dispatch == (mode.dispatch or "round-robin")
    # sorted+rhyme is the trainer's: on-policy SortedRL (nothing kept) with HistoSpec, not partial + LPT
    p = sim_mode("sorted+rhyme")
    assert (p.partial, p.spec, p.oversub, p.dispatch) == (False, True, 2.0, "round-robin")
    # the simulator's former extra policies are options of modes now
    assert sim_mode("baseline", {"dispatch": "least-in-flight"}).dispatch == "least-in-flight"
    old_histospec = sim_mode("rhyme", {"dispatch": "round-robin"})
    assert (old_histospec.spec, old_histospec.migrate, old_histospec.order) == (True, False, "fifo")


def test_simulator_option_errors_are_one_line_user_errors():
    for entries, options, message in (
        (["turbo"], {}, "unknown mode 'turbo'; valid modes: baseline, sorted"),
        (["least-loaded"], {}, "now baseline:dispatch=least-in-flight"),
        (["sorted"], {"max_attempts": 3}, "cannot model option max_attempts of mode 'sorted'"),
        (["rhyme"], {"spec": {"min_draft": 2}}, "cannot model option spec.min_draft"),
        (["sorted"], {"oversubscription": "x"}, "mode 'sorted': option oversubscription must be a number"),
        (["baseline", "rhyme"], {"max_staleness": 2}, "no selected mode takes option max_staleness"),
        (["rhyme", "rhyme"], {}, "lists an entry twice"),
    ):
        with pytest.raises(UserError, match=message):
            parse_sim_modes(entries, options)
    labels = [p.name for p in parse_sim_modes(["rhyme:dispatch=round-robin", "sorted"], {"max_staleness": 0})]
    assert labels == ["baseline", "rhyme:dispatch=round-robin", "sorted"]  # plain baseline is the reference


def test_sorted_rhyme_now_discards_like_sorted_and_drafts():
    tr = heavy(steps=3, prompts=32)
    srt, both = run_policy("sorted", tr), run_policy("sorted+rhyme", tr)
    assert both["draft_len"] > 0 and srt["draft_len"] == 0
    # on-policy: the untrained groups' tokens are thrown away, as in the trainer's sorted strategy, where
    # the former meaning (partial rollouts kept without a staleness cap) wasted nothing
    assert both["wasted_token_share"] > 0.05 and srt["wasted_token_share"] > 0.05
    assert both["rollout_s"] < srt["rollout_s"]


def test_max_staleness_regenerates_old_partials():
    tr = heavy(steps=4, prompts=32)
    pred = workload.fill_predictions(tr, 0.9)
    acc = np.full(len(tr), 0.7)

    def run(staleness: int) -> dict:
        p = sim_mode("sorted-partial", {"max_staleness": staleness})
        return simulate_mode(p, tr, pred, acc, UnitCost(), 1, 64, 4)

    fresh, forever = run(0), run(1000)
    assert forever["wasted_token_share"] == 0.0 < fresh["wasted_token_share"]
    assert fresh["rollout_s"] > forever["rollout_s"]  # regenerating costs forwards


def test_placements_at_one_and_two_workers():
    # one group of two 50-token samples, one slot per worker
    tr = workload.LengthTrace(*(np.array(v) for v in ([0, 0], [0, 0], [0, 1], [4, 4], [50, 50])),
                              acceptance=np.full(2, np.nan), predicted=np.full(2, np.nan))  # fmt: skip
    pred = np.full(2, 50.0)

    def rollout(name: str, options: dict, workers: int) -> float:
        p = sim_mode(name, options)
        return simulate_mode(p, tr, pred, pred, UnitCost(), workers, 1, 1)["rollout_s"]

    # round-robin keeps the group on one worker; least-in-flight deals each request, as the trainer does
    assert (
        rollout("baseline", {}, 2)
        == rollout("baseline", {}, 1)
        > 1.9 * rollout("baseline", {"dispatch": "least-in-flight"}, 2)
    )
    # on one worker a policy has nothing to dispatch: histopipe is the baseline there, as in the trainer
    tr2 = heavy(steps=2, prompts=16)
    assert run_policy("histopipe", tr2)["step_time_s"] == run_policy("baseline", tr2)["step_time_s"]


# ---- the command line: the same names for train and simulate, and `rlbench modes` ------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_simulate_accepts_every_mode(mode, tmp_path):
    args = ("--synthetic", "--steps", "1", "--prompts", "4", "--group-size", "2", "--workers", "1,2")
    res = cli("simulate", *args, "--modes", mode, "--out", "sim", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "sim" / "simulate.json").read_text())
    replayed = {(r["mode"], r["workers"]) for r in doc["results"]}
    if MODES[mode].ahead:  # rollout and trainer as two pools: not on one device, and said so
        assert replayed >= {(mode, 2)} and {(n["mode"], n["workers"]) for n in doc["not_modelled"]} == {
            (mode, 1)
        }
    else:
        assert replayed >= {(mode, 1), (mode, 2)}


def test_unknown_mode_is_the_same_one_line_error_for_train_and_simulate(tmp_path):
    train = one_line_error(cli("train", "--mode", "turbo", tmp=tmp_path))
    sim = one_line_error(cli("simulate", "--synthetic", "--modes", "turbo", "--out", "o", tmp=tmp_path))
    assert train == sim == f"error: unknown mode 'turbo'; valid modes: {', '.join(MODES)}\n"
    bad = one_line_error(cli("simulate", "--synthetic", "--mode-option", "oversubscription=x", tmp=tmp_path))
    assert "mode 'sorted': option oversubscription must be a number, got 'x'" in bad


def test_modes_command_lists_every_mode(tmp_path):
    res = cli("modes", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [line.split()[0] for line in res.stdout.splitlines() if line and not line.startswith(" ")]
    assert [r for r in rows if r in MODES] == list(MODES)
    assert "simulator:" in res.stdout and "spec.max_draft" in res.stdout
    doc = json.loads(cli("modes", "--json", tmp=tmp_path).stdout)
    assert list(doc["modes"]) == list(MODES)
    assert doc["modes"]["sorted-partial"]["tis_cap"] == 2.0
    assert doc["modes"]["sorted"]["options"]["oversubscription"]["default"] == 2.0
    assert doc["modes"]["rhyme"]["options"]["dispatch"]["default"] == "histopipe"
