"""The rollout's host work counted as CPU seconds by part (reference_trainer/engine/hostclock.py): parts are
exclusive, and a rollout phase records what its engine and controller spent."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli

from reference_trainer.engine import hostclock
from reference_trainer.engine.hostclock import HOST_PARTS, HostClock
from reference_trainer.trace.schema import read_trace


def test_a_part_nested_in_another_is_counted_once_in_the_inner(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 1.0, 3.0, 6.0, 10.0, 15.0])  # thread CPU seconds at each enter / leave
    monkeypatch.setattr(hostclock.time, "thread_time", lambda: next(ticks))
    clock = HostClock()
    before = clock.snapshot()
    with clock.controller, clock.engine, clock.forwards:  # entered at 0, 1, 3; left at 6, 10, 15
        pass
    added = clock.since(before)
    assert added == {"controller": 1.0 + 5.0, "engine": 2.0 + 4.0, "forwards": 3.0, "sampling": 0.0}
    assert sum(added.values()) == 15.0  # every CPU second inside the outer part, once


def test_a_rollout_records_its_host_cpu_seconds_by_part(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = cli("train", "--mode", "sorted", "--steps", "2", "--model", str(tiny_model_dir),
              "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "12", "--eval-every", "0",
              "--device", "cpu", "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    rollouts = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "rollout"]
    assert len(rollouts) == 2
    for e in rollouts:
        assert set(e["host_cpu_s"]) == set(HOST_PARTS) and all(v >= 0 for v in e["host_cpu_s"].values())
        # The engine stepped and the controller admitted: both spent CPU time, and the forwards most of it
        # is not asserted (machine speed); that each part was reached is.
        assert e["host_cpu_s"]["engine"] > 0 and e["host_cpu_s"]["controller"] > 0 and e["forward_cpu_s"] > 0
