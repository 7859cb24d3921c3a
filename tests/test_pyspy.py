"""py-spy wrapper: real recordings of the current process and of a child command, and the failure paths."""

from __future__ import annotations

import json
import sys
import time

import pytest

from rlbench.profiling.pyspy import (
    PySpyRecorder,
    collapse_speedscope,
    find_py_spy,
    record_command,
    speedscope_to_svg,
)

needs_pyspy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed")


def _busy_marker_function(seconds: float) -> int:
    total, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        total += sum(range(2000))
    return total


def _skip_if_cannot_attach(result: dict) -> None:
    if not result["available"] and "ptrace" in (result["reason"] or ""):
        pytest.skip(result["reason"])


@needs_pyspy
def test_records_current_process(tmp_path):
    rec = PySpyRecorder(tmp_path, rate=200)
    assert rec.start(), rec.reason
    _busy_marker_function(1.0)
    result = rec.stop()
    _skip_if_cannot_attach(result)
    assert result["available"], result
    assert result["samples"] > 0  # how many is py-spy's rate on a machine's load: the frames are the test
    stacks = collapse_speedscope(tmp_path / result["speedscope"])
    assert any("_busy_marker_function" in frame for stack in stacks for frame in stack)
    svg = (tmp_path / result["svg"]).read_text()
    assert svg.startswith("<svg") and "_busy_marker_function" in svg


@needs_pyspy
def test_records_child_command_and_keeps_exit_code(tmp_path):
    code = (
        "import time\n"
        "def child_hot_loop():\n t=time.time()\n while time.time()-t<0.8: sum(range(1000))\n"
        "child_hot_loop()\nraise SystemExit(3)"
    )
    exit_code, result = record_command([sys.executable, "-c", code], tmp_path, rate=200)
    assert exit_code == 3
    _skip_if_cannot_attach(result)
    assert result["available"], result
    assert "child_hot_loop" in (tmp_path / result["svg"]).read_text()


def test_missing_py_spy_is_one_line(tmp_path):
    rec = PySpyRecorder(tmp_path, exe=str(tmp_path / "no-such-py-spy"))
    assert rec.start() is False
    result = rec.stop()
    assert result == {"available": False, "reason": "py-spy is not installed (pip install py-spy)"}


@needs_pyspy
def test_cannot_attach_is_one_line(tmp_path):
    import subprocess

    sleeper = subprocess.Popen(["sleep", "10"])  # not a Python process: py-spy refuses at once
    try:
        rec = PySpyRecorder(tmp_path, pid=sleeper.pid)
        assert rec.start() is False
        result = rec.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result["available"] is False
    assert result["reason"].startswith("py-spy could not record:") and "\n" not in result["reason"]


def test_svg_from_hand_written_speedscope(tmp_path):
    prof = {
        "shared": {
            "frames": [
                {"name": "main", "file": "a.py", "line": 1},
                {"name": "hot", "file": "a.py", "line": 9},
                {"name": "cold", "file": "a.py", "line": 5},
            ]
        },
        "profiles": [{"type": "sampled", "samples": [[0, 1], [0, 1], [0, 1], [0, 2]], "weights": [0.01] * 4}],
    }
    src = tmp_path / "p.json"
    src.write_text(json.dumps(prof))
    stacks = collapse_speedscope(src)
    assert stacks == {
        ("main (a.py:1)", "hot (a.py:9)"): pytest.approx(3),
        ("main (a.py:1)", "cold (a.py:5)"): pytest.approx(1),
    }
    assert speedscope_to_svg(src, tmp_path / "p.svg") == 4
    svg = (tmp_path / "p.svg").read_text()
    assert "hot (a.py:9) — 3 samples (75.0%)" in svg and "cold (a.py:5) — 1 samples (25.0%)" in svg
