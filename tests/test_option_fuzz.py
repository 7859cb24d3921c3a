"""Every numeric option of every command, fed 0, -3, nan, inf, 1e999 and 2**70: a one-line error, or the value
is accepted and the command reaches its work with it. Never a traceback.

The commands are found by walking the Typer app, so a new option is fuzzed without touching this file. The
work itself (training, profiling, evaluating, generating, simulating, observing, building) is stubbed where it
starts: what this test checks is that validation happens up front, in one place per command; the fault drill
(faults/fault_drill.py) runs accepted values for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

from faults.fault_inputs import FUZZ_STUBS, FUZZ_VALUES, fuzz_base_args
from rlbench.cli import app_
from rlbench.options import numeric_options


class Accepted(Exception):
    """The command reached its work with the value."""


def _accept(*args, **kwargs):
    raise Accepted


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory) -> dict[str, tuple[str, ...]]:
    """Valid, cheap arguments for each command, beside which one option at a time is fuzzed."""
    data = tmp_path_factory.mktemp("data")
    (data / "amc23.jsonl").write_text(
        json.dumps({"id": "a", "problem": "What is 1 + 1?", "answer": "2"}) + "\n"
    )
    return fuzz_base_args(str(tiny_model_dir), data)


OPTIONS = numeric_options(app_)


def test_the_walk_finds_every_command_with_numbers():
    assert {" ".join(path) for path, _, _ in OPTIONS} == set(FUZZ_STUBS)
    assert len(OPTIONS) > 40


@pytest.mark.parametrize(("path", "flag", "kind"), OPTIONS, ids=[f"{' '.join(p)} {f}" for p, f, _ in OPTIONS])
def test_every_numeric_option_is_checked_up_front(path, flag, kind, setup, tmp_path, monkeypatch):
    name = " ".join(path)
    monkeypatch.setattr(FUZZ_STUBS[name], _accept)
    outcomes = {}
    for value in FUZZ_VALUES:
        out = () if name in ("generate",) else ("--out", str(tmp_path / f"out{len(outcomes)}"))
        try:
            res = cli(*path, *setup[name], *out, f"{flag}={value}", tmp=tmp_path)
        except Accepted:
            outcomes[value] = "accepted"
            continue
        assert res.returncode == 2 and res.stderr.startswith("error: "), (flag, value, res.stderr, res.stdout)
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, (flag, value, res.stderr)
        outcomes[value] = "refused"
    for value in ("nan", "inf", "1e999"):  # never a number anything can use
        assert outcomes[value] == "refused", (name, flag, value)
    if kind is int:  # past every count, size and seed (a float that large is finite: a huge --lr is allowed,
        assert outcomes[str(2**70)] == "refused", (name, flag)  # and the trainer stops it once non-finite)


def test_a_value_that_passes_is_really_used(setup, tmp_path, monkeypatch):
    """The stub is reached with the value given (the fuzz is not refusing everything for another reason)."""
    seen = {}
    monkeypatch.setattr(
        "rlbench.training.run_training", lambda config, out, **kw: seen.update(steps=config.steps)
    )
    res = cli("train", *setup["train"], "--out", str(tmp_path / "r"), "--steps=3", tmp=tmp_path)
    assert res.returncode == 0 and seen == {"steps": 3}, res.stderr
    assert Path(tmp_path / "r").is_dir()
