"""benchmarks/decode_step.py: the profiler counts per decode step, the table row's ratios and targets, and
the whole benchmark on a tiny CPU model (its GPU columns need CUDA)."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from benchmarks import decode_step
from benchmarks.decode_step_runs import count_events


def event(name: str, device: DeviceType = DeviceType.CPU, us: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_profiler_events_become_kernel_time_launches_and_copies():
    events = [
        event("cudaLaunchKernel"), event("cudaLaunchKernel"), event("cuLaunchKernelEx"),
        event("cudaGraphLaunch"), event("aten::mm"), event("cudaMemcpyAsync"),
        event("ampere_sgemm", DeviceType.CUDA, 30.0), event("triton_fused", DeviceType.CUDA, 12.5),
        event("Memcpy DtoH (Device -> Pinned)", DeviceType.CUDA, 2.0),
    ]  # fmt: skip
    counts = count_events(events)
    assert counts == {"kernel_s": pytest.approx(42.5e-6), "launches": 3, "graph_launches": 1,
                      "dtoh_copies": 1}  # fmt: skip


def test_a_row_gives_ratios_busy_share_and_the_targets():
    per_step = {"kernel_s": 1.6e-3, "launches": 0.0, "graph_launches": 1.0, "dtoh_copies": 1.0}
    cells = {
        "engine": {"step_s": 2.0e-3, "per_step": per_step},
        "before": {"step_s": 17.7e-3, "per_step": {**per_step, "kernel_s": 2.8e-3, "launches": 913.0}},
        "hf-static": {"step_s": 5.45e-3},
    }
    row = decode_step.summarise(64, cells)
    assert row["static_over_engine"] == pytest.approx(2.725)
    assert row["before_over_engine"] == pytest.approx(8.85)
    assert row["engine_busy"] == pytest.approx(0.8) and row["before_busy"] == pytest.approx(2.8 / 17.7)
    assert row["targets"] == {"step": True, "vs_static": True, "busy": True}
    slow = decode_step.summarise(256, {"engine": {"step_s": 5e-3}, "hf-static": {"step_s": 8.84e-3}})
    assert slow["targets"] == {"step": False, "vs_static": False, "busy": None}  # no profile: busy unknown
    text = decode_step.table([row, slow])
    assert "| 64 | 2.000 | 17.700 | 5.450 |  | 2.73x | 8.85x | 80% / 16% | 0 + 1 graphs / 913 | 1.0 |" in text
    assert "| 256 | 5.000 |  | 8.840 |  | 1.77x |  |  |  |  |" in text


@pytest.mark.e2e
def test_the_benchmark_runs_on_a_tiny_cpu_model(tmp_path, monkeypatch, capsys):
    # this checkout stands in for the before one: the side runs another checkout's code the same way
    argv = ["decode_step", "--device", "cpu", "--shape", "tiny", "--batches", "2", "--steps", "2",
            "--repeats", "1", "--threads", "1", "--sides", "engine,before,hf-eager",
            "--engine-path", str(decode_step.ROOT), "--out", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    decode_step.main()
    saved = json.loads((tmp_path / "decode_step.json").read_text())
    (row,) = saved["rows"]
    assert saved["device"] == "cpu" and row["batch"] == 2
    assert set(row["cells"]) == {"engine", "before", "hf-eager"}
    # two steps on a shared CPU: a difference of two timings, finite but of any sign; sizes are for GPUs
    assert all(math.isfinite(ms) for ms in row["step_ms"].values()) and "before_over_engine" in row
    assert all(len(cell["step_s_runs"]) == 1 for cell in row["cells"].values())
    assert "| 2 |" in capsys.readouterr().out
