"""Kill drill: a real `rlbench eval` is killed while its grading workers exist; the workers must go with it
(they used to live on under PID 1, ~465 MB each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_tiny_char_model

pytestmark = pytest.mark.e2e  # whole commands in processes of their own

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
REPO = Path(__file__).resolve().parents[1]


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process from /proc, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0], int(fields[19])


def _children(parent: int) -> dict[int, int]:
    """{pid: start time} of the live children of `parent`."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[0] == parent and st[1] != "Z":
            found[int(entry)] = st[2]
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == start and st[1] != "Z"  # a zombie holds no memory; PIDs get reused


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "kill-TERM"])
def test_grading_workers_die_with_a_killed_eval(tmp_path: Path, sig: signal.Signals) -> None:
    model = write_tiny_char_model(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"id": f"k-{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2000)]
    (data / "amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "--suite", "amc23", "--model", str(model), "--data-dir", str(data)]
    args += ["--out", str(tmp_path / "o"), "--max-tokens", "8", "--temperature", "1.0", "--device", "cpu"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlbench.cli", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    workers: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            workers = _children(proc.pid)  # the pool forks its workers after the first chunk is generated
        assert workers, f"no grading workers appeared (exit {proc.poll()}): {proc.stderr.read()[-2000:]}"
        time.sleep(0.5)  # the pool starts all its workers at once; take the full set
        workers = _children(proc.pid)
        assert proc.poll() is None, "the eval finished before it could be killed"
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        t0 = time.monotonic()
        # a wait, not a timing: the loop ends as soon as they are gone (a loaded machine reaps them late)
        while any(_alive(p, s) for p, s in workers.items()) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        left = [p for p, s in workers.items() if _alive(p, s)]
        print(f"{sig.name}: {len(workers)} workers, gone after {time.monotonic() - t0:.2f} s")
        assert left == [], f"grading workers outlived the eval: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, start in workers.items():  # a failed drill leaves no orphans behind either
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)
