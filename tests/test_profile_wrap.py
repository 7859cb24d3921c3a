"""`rlbench profile -- CMD` end to end, wrap_command with a fake NVML, the trainer-driven ProfileSession."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cli

from reference_trainer.errors import UserError
from reference_trainer.modes import MODES
from reference_trainer.train.config import TrainConfig
from rlbench.profiling.pyspy import find_py_spy
from rlbench.profiling.session import run_profile
from rlbench.profiling.wrap import WrapConfig, wrap_command

ROOT = Path(__file__).resolve().parents[1]


def test_cli_wraps_a_python_command(tmp_path):
    res = cli("profile", "--out", str(tmp_path), "--", sys.executable, "-c", "import time; time.sleep(0.3)")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "metrics.json").read_text())
    s = doc["summary"]
    assert s["exit_code"] == 0 and s["wall_time_s"] >= 0.3  # its whole life: a load cannot shorten it
    assert doc["run"]["command"][1:] == ["-c", "import time; time.sleep(0.3)"]
    if not doc["gpu"]["available"]:  # this machine has no NVIDIA driver: no invented numbers
        assert s["gpu_idle_share"] is None and s["gpu_note"].startswith("no GPU: NVML unavailable (")
        assert "no GPU: NVML unavailable" in (tmp_path / "report.html").read_text()
    assert "report:" in res.stdout


def test_cli_propagates_failure_exit_code_and_still_reports(tmp_path):
    res = cli("profile", "--out", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(5)")
    assert res.returncode == 5
    assert "command exited with 5" in res.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["summary"]["exit_code"] == 5
    assert (tmp_path / "report.html").exists()


def test_cli_missing_command_is_one_line(tmp_path):
    res = cli("profile", "--out", str(tmp_path), "--", "no-such-program-rlbench")
    assert res.returncode == 2 and res.stderr.startswith("error: cannot run 'no-such-program-rlbench'")
    assert res.stderr.count("\n") == 1


def test_cli_unknown_mode_lists_valid_ones(tmp_path):
    res = cli("profile", "--mode", "fastest", "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: unknown mode 'fastest'; valid modes: {', '.join(MODES)}"


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed")
def test_cli_wrap_with_py_spy(tmp_path):
    code = "import time\ndef wrapped_hot():\n t=time.time()\n while time.time()-t<0.6: sum(range(500))\n"
    code += "wrapped_hot()"
    res = cli("profile", "--py-spy", "--out", str(tmp_path), "--", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    pyspy = json.loads((tmp_path / "metrics.json").read_text())["pyspy"]
    if not pyspy["available"] and "ptrace" in pyspy["reason"]:
        pytest.skip(pyspy["reason"])
    assert pyspy["available"], pyspy
    assert "wrapped_hot" in (tmp_path / pyspy["svg"]).read_text()
    assert f'href="{pyspy["svg"]}"' in (tmp_path / "report.html").read_text()


class ConstantNVML:
    """One GPU at a constant 25% utilisation."""

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "Fake"

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=25, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=2**30, used=2**29, free=2**29)

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1000


def test_wrap_gpu_idle_share_from_timeline(tmp_path):
    cmd = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    code, doc = wrap_command(WrapConfig(cmd, tmp_path, sample_interval_s=0.02), nvml=ConstantNVML())
    assert code == 0
    assert doc["summary"]["gpu_idle_share"] == pytest.approx(0.75)
    assert len(doc["gpu"]["samples"]) >= 5
    assert "GPU utilisation (NVML" in (tmp_path / "report.html").read_text()


def fake_trainer(config, out_dir, trace):
    """Writes a contract-shaped trace: per step one rollout with 2 decode steps, reward and update."""
    for step in range(config.steps):
        trace.step = step
        with trace.phase("rollout", policy_version=step):
            # real clock readings, so engine steps lie inside the rollout phase as in a real engine
            t0 = trace.now()
            time.sleep(0.01)
            t1 = trace.now()
            trace.engine_step("decode", t0, t1, {"0": f"a{step}", "1": f"b{step}"}, capacity=2, tokens=2)
            time.sleep(0.01)
            t2 = trace.now()
            trace.engine_step("decode", t1, t2, {"0": f"a{step}"}, capacity=2, tokens=1)
            for sid, n, t_fin in ((f"a{step}", 2, t2), (f"b{step}", 1, t1)):
                trace.add(
                    {
                        "kind": "sequence",
                        "id": sid,
                        "prompt_id": "p",
                        "sample": 0,
                        "prompt_tokens": 3,
                        "response_tokens": n,
                        "t_admit": t0,
                        "t_finish": t_fin,
                        "policy_versions": [step] * n,
                        "drafted": 0,
                        "accepted": 0,
                        "status": "finished",
                    }
                )
        with trace.phase("reward", reward_mean=0.5, accuracy=0.5):
            pass
        with trace.phase("update", policy_version=step, loss=1.0):
            pass
        trace.flush_to(out_dir / "trace.jsonl")  # trainers may stream; the session must not duplicate events


def test_run_profile_with_trainer_hook(tmp_path):
    doc = run_profile(
        TrainConfig(eval_every=0, mode="baseline", steps=2, seed=1), tmp_path, train_fn=fake_trainer
    )
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["run"]["mode"] == "baseline" and saved["run"]["status"] == "ok"
    assert [s["step"] for s in saved["steps"]] == [0, 1]
    assert saved["summary"]["rollout_tokens"] == 6  # 3 per step, no duplicated events from the stream
    assert saved["summary"]["staleness"] == {"0": 6}
    assert saved["summary"]["bubble_ratio"] is not None and 0 <= saved["summary"]["bubble_ratio"] < 1
    assert doc["summary"] == saved["summary"]
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert len(lines) == 2 * (1 + 2 + 2 + 2)  # per step: rollout, 2 decode, 2 sequences, reward, update
    assert "Slot occupancy" in (tmp_path / "report.html").read_text()


def test_run_profile_failure_still_writes_results(tmp_path):
    def broken(config, out_dir, trace):
        fake_trainer(TrainConfig(eval_every=0, steps=1), out_dir, trace)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_profile(TrainConfig(eval_every=0, steps=2), tmp_path, train_fn=broken)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["run"]["status"] == "failed: RuntimeError: boom" and len(saved["steps"]) == 1


def test_run_profile_validates_mode_and_task():
    from rlbench.training import build_config

    with pytest.raises(UserError, match="unknown mode 'turbo'; valid modes: baseline"):
        build_config(mode="turbo", task="arith")
    with pytest.raises(UserError, match="unknown task 'chess'; valid tasks: arith, kk"):
        build_config(mode="baseline", task="chess")
