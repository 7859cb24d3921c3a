"""A rollout run ahead is supervised: its rollout process killed by any signal ends the run with one line
and the weight ring removed; a resume that cannot give the rollout side its weights is one line; a ring
left by a trainer killed outright is removed by the next; a ring file cut mid-run is one line, not a
SIGBUS; a ring that cannot fit is refused with the settings, before anything is written. Every case runs
under a generous deadline, so a hang fails instead of stalling the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, cli
from test_trainer import tiny_config

from faults.fault_inputs import damage as damage_file
from faults.fault_supervision import rings, rollout_children
from reference_trainer.errors import UserError
from reference_trainer.model.embedded import default_model_dir
from reference_trainer.rollout import ring as ring_module
from reference_trainer.rollout.ahead import check_history
from reference_trainer.rollout.gate import Signal, death_line
from reference_trainer.rollout.ring import WeightRing, model_copy_bytes, remove_orphans
from reference_trainer.train.checkpoint import HISTORY, latest_checkpoint
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer

DEADLINE_S = 300  # a hang, not a slow machine: these runs take seconds


def _rings(pid: int) -> list[Path]:
    return rings(pid, tempfile.gettempdir())


def _train(model_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    args = ["--model", str(model_dir), "--task", "arith", "--mode", "async", "--threads", "2",
            "--steps", "40", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "8",
            "--eval-every", "0", "--mode-option", "max_staleness=1", "--out", str(out), *extra]  # fmt: skip
    code = "from rlbench.cli import app; app()"
    return subprocess.Popen([sys.executable, "-c", code, "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for_a_step(proc: subprocess.Popen, out: Path) -> None:
    start = time.monotonic()
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < DEADLINE_S, "no step finished"
        time.sleep(0.2)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_rollout_process_ends_the_run_with_one_line(tiny_model_dir, tmp_path, sig):
    proc = _train(tiny_model_dir, tmp_path / "run")
    try:
        _wait_for_a_step(proc, tmp_path / "run")
        assert _rings(proc.pid)  # the ring is there while the run is
        (child,) = rollout_children(proc.pid)  # the rollout process
        os.kill(child, sig)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    resume = f"--resume {tmp_path / 'run'}`"
    assert len(lines) == 1 and f"killed by {sig.name}" in lines[0] and resume in lines[0], err
    assert _rings(proc.pid) == []
    assert (tmp_path / "run" / "metrics.jsonl").read_text().strip()  # the finished steps are kept


CUT_STAMPS = """
import os, threading, torch
from reference_trainer.rollout.ring import RingCut, WeightRing
ring = WeightRing({"w": torch.zeros(4, 4)}, 2, threading.Condition())
ring.publish({"w": torch.ones(4, 4)}, 0)
os.truncate(os.path.join(ring.folder, "stamps"), 0)
for touch in (lambda: ring.publish({"w": torch.ones(4, 4)}, 1), ring.versions, lambda: ring.read(0)):
    try:
        touch()
    except RingCut as err:
        print(err)
ring.close()
"""


def test_a_cut_stamps_file_is_one_line_not_a_sigbus():
    # in a process of its own: touching the cut mapping is a SIGBUS, which would end pytest itself
    ran = subprocess.run(
        [sys.executable, "-c", CUT_STAMPS], capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert ran.returncode == 0, (ran.returncode, ran.stderr)
    lines = ran.stdout.splitlines()
    assert len(lines) == 3 and all(
        "stamps was cut to 0 bytes (of 16) while the run used it" in x for x in lines
    )


@pytest.mark.e2e
def test_a_stamps_file_cut_mid_run_ends_it_in_one_line_and_it_resumes(tiny_model_dir, tmp_path):
    proc = _train(tiny_model_dir, tmp_path / "run", "--checkpoint-every", "1")
    try:
        _wait_for_a_step(proc, tmp_path / "run")
        (ring,) = _rings(proc.pid)
        os.truncate(ring / "stamps", 0)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "was cut to 0 bytes" in lines[0], err
    assert f"--resume {tmp_path / 'run'}`" in lines[0] and _rings(proc.pid) == []
    done = len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    code = "from rlbench.cli import app; app()"
    args = ["train", "--resume", str(tmp_path / "run"), "--steps", str(done + 1)]
    resumed = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert resumed.returncode == 0, resumed.stderr
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == done + 1


@pytest.mark.e2e
def test_a_terminated_trainer_removes_its_ring(tiny_model_dir, tmp_path):
    proc = _train(tiny_model_dir, tmp_path / "run")
    try:
        _wait_for_a_step(proc, tmp_path / "run")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert _rings(proc.pid) == []


def test_a_ring_whose_trainer_is_gone_is_removed_by_the_next(tmp_path, monkeypatch):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # exited: what a SIGKILL leaves
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ring_module, "SHM", str(tmp_path / "no-shm"))
    left = tmp_path / f"rlbench-ring-{pid}-abc"
    left.mkdir()
    (left / "slot0").write_bytes(b"x" * 64)
    mine = tmp_path / f"rlbench-ring-{os.getpid()}-abc"  # a live trainer's: kept
    mine.mkdir()
    ring = WeightRing({"a": torch.zeros(4)}, 2, threading.Condition())
    try:
        assert not left.exists() and mine.exists()
        assert Path(ring.folder).parent == tmp_path
    finally:
        ring.close()
    assert remove_orphans() == []


def test_a_ring_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ring_module, "SHM", str(tmp_path / "no-shm"))
    with pytest.raises(UserError, match=r"max_staleness \+ 1 = 2147483648 copies"):
        WeightRing({"a": torch.zeros(1024)}, 2**31, threading.Condition())
    assert list(tmp_path.iterdir()) == []


def test_a_staleness_the_machine_cannot_hold_is_refused_with_the_settings(tmp_path, monkeypatch):
    # before any folder is made: the corrected command then finds no run claimed in --out
    res = cli("train", "--mode", "async", "--mode-option", "max_staleness=2147483647", "--out", "run",
              tmp=tmp_path)  # fmt: skip
    assert_one_line_error(res, "max_staleness + 1 = 2147483648 copies of the weights")
    assert not (tmp_path / "run").exists()
    # the room is what the machine has, not a fixed cap: 4 copies of the shipped model where 3 fit
    copy = model_copy_bytes(default_model_dir(), "cpu")
    monkeypatch.setattr(ring_module, "_free", lambda folder: 3 * copy + 1)
    TrainConfig(mode="async", mode_options={"max_staleness": 2}).check()
    with pytest.raises(UserError, match=r"max_staleness \+ 1 = 4 copies"):
        TrainConfig(mode="async", mode_options={"max_staleness": 3}).check()
    TrainConfig(mode="baseline").check()  # a synchronous mode keeps no ring


def _layout() -> list:
    ring = WeightRing({"w": torch.zeros(2, 3)}, 1, threading.Condition())
    ring.close()
    return ring.layout


def test_a_resume_checks_the_weights_its_rollout_needs():
    layout, w = _layout(), {"w": torch.zeros(2, 3)}
    assert check_history({3: w, 4: w}, layout, 5, 5, 2, "ck") == [3, 4]
    assert check_history({3: w, 4: w}, layout, 5, 5, 1, "ck") == [4]  # a smaller k: honoured
    assert check_history({4: w}, layout, 5, 5, 0, "ck") == []
    with pytest.raises(UserError, match=r"ck: .*max_staleness 3 .*missing \[2\]"):
        check_history({3: w, 4: w}, layout, 5, 5, 3, "ck")  # a larger k: refused
    with pytest.raises(UserError, match="keeps none"):
        check_history({}, layout, 5, 5, 1, "ck")  # the history file deleted
    with pytest.raises(UserError, match="policy_version 0 does not match step 5"):
        check_history({4: w}, layout, 0, 5, 1, "ck")
    with pytest.raises(UserError, match="not this model's"):
        check_history({4: {"w": torch.zeros(3, 2)}}, layout, 5, 5, 1, "ck")


@pytest.mark.e2e
@pytest.mark.parametrize("damage", ["deleted", "folder", "fifo", "dev-zero"])
def test_a_resume_with_a_damaged_history_is_one_line(tiny_model_dir, tmp_path, damage):
    config = tiny_config(tiny_model_dir, 2, mode="async", threads=2, mode_options={"max_staleness": 1})
    trainer = Trainer(config, tmp_path)
    try:
        trainer.run()
    finally:
        trainer.close()
    damage_file(latest_checkpoint(tmp_path / "checkpoints") / "trainer" / HISTORY, damage)
    config.steps = 4
    with pytest.raises(UserError) as err:
        Trainer(config, tmp_path, resume=True).close()
    assert HISTORY in str(err.value) or "keeps none" in str(err.value)


def test_a_lock_held_by_a_dead_side_is_not_waited_for():
    class Gone(Exception):
        pass

    held = Signal("thread")
    held._lock.acquire()  # as a process killed inside its critical section leaves it

    def check():
        raise Gone

    held.check = check
    with pytest.raises(Gone):
        held.__enter__()


def test_the_death_line_names_the_signal():
    assert "killed by SIGKILL during step 3" in death_line(-9, 3)
    assert "exited with code 1" in death_line(1, None)
