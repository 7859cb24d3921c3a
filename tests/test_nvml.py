"""NvmlSampler against a fake NVML module (the pynvml API surface it uses) and the real no-driver path."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from reference_trainer.trace import metrics
from rlbench.observe.nvml import NvmlSampler, mean_util, no_gpu_note


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Two GPUs; GPU 1 does not support power readings (as some boards do not)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.calls = 0
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetName(self, h):
        return b"Fake H100" if h == "h0" else "Fake H200"

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        return SimpleNamespace(gpu=30 if h == "h0" else 70, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 1024**3, used=2 * 1024**3, free=78 * 1024**3)

    def nvmlDeviceGetPowerUsage(self, h):
        if h == "h1":
            raise FakeNVMLError("Not Supported")
        return 350_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {1: 1980, 2: 2619}[clock]


def test_sample_values_units_and_unsupported_fields():
    clock = iter([1.25, 2.5])
    s = NvmlSampler(now=lambda: next(clock), nvml=FakeNVML())
    s._init()
    s.sample_once()
    r = s.result()
    assert r["available"] is True
    assert [d["name"] for d in r["devices"]] == ["Fake H100", "Fake H200"]
    assert r["devices"][0]["memory_total_mib"] == 80 * 1024
    g0, g1 = r["samples"]
    assert g0 == {
        "t": 1.25,
        "gpu": 0,
        "util": 30.0,
        "mem_util": 10.0,
        "mem_used_mib": 2048.0,
        "power_w": 350.0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
    }
    assert g1["t"] == 1.25 and g1["util"] == 70.0 and g1["power_w"] is None
    assert "Not Supported" in r["errors"]["power"]


def test_background_thread_samples_on_given_clock():
    fake = FakeNVML()
    t0 = time.perf_counter()
    with NvmlSampler(now=lambda: 1000.0 + time.perf_counter() - t0, interval_s=0.02, nvml=fake) as s:
        time.sleep(0.1)
    r = s.result()
    assert fake.shutdown
    per_gpu = [x for x in r["samples"] if x["gpu"] == 0]
    assert len(per_gpu) >= 2  # the first sample at the start, the closing one at the stop
    ts = [x["t"] for x in per_gpu]
    assert ts == sorted(ts) and ts[0] >= 1000.0  # the caller's clock, not the sampler's own
    assert mean_util(r) == pytest.approx(50.0)


def test_the_schedule_keeps_the_rate_when_a_query_is_slow(monkeypatch):
    """The sampling loop on a virtual clock (no sleeps, so no machine load in it): queries of 15 ms keep the
    20 ms period; one of 50 ms makes the next sample start at once, and the period holds from there."""
    clock, costs, starts = [1000.0], [0.015, 0.015, 0.05, 0.015, 0.015], []

    def sample_once() -> None:
        starts.append(clock[0])
        clock[0] += costs.pop(0)

    class Stop:  # the sampler's stop event: waiting moves the clock on; set once every query has run
        def is_set(self) -> bool:
            return not costs

        def wait(self, delay: float) -> None:
            clock[0] += delay

    monkeypatch.setattr("rlbench.observe.nvml.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    sampler = NvmlSampler(now=lambda: clock[0], interval_s=0.02, nvml=FakeNVML())
    monkeypatch.setattr(sampler, "sample_once", sample_once)
    monkeypatch.setattr(sampler, "_stop", Stop())
    sampler._run()
    assert starts == pytest.approx([1000.0, 1000.02, 1000.04, 1000.09, 1000.11])


def test_default_rate_is_at_least_10_hz():
    assert NvmlSampler().interval_s <= 0.1


def test_init_error_is_recorded_not_raised():
    with NvmlSampler(nvml=FakeNVML(fail_init=True)) as s:
        pass
    r = s.result()
    assert r["available"] is False and r["samples"] == []
    assert "Library Not Found" in r["reason"]
    assert mean_util(r) is None
    assert no_gpu_note(r) == "no GPU: NVML unavailable (FakeNVMLError: NVML Shared Library Not Found)"


def test_real_pynvml_without_driver_is_unavailable():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    with NvmlSampler() as s:
        pass
    assert s.result()["available"] is False and s.result()["reason"]


def test_gpu_bubble_uses_sampler_output():
    clock = iter([0.5, 5.0])
    s = NvmlSampler(now=lambda: next(clock), nvml=FakeNVML())
    s._init()
    s.sample_once()  # t=0.5 inside the rollout: GPUs at 30 and 70 -> mean 50
    s.sample_once()  # t=5.0 after it: ignored
    trace = [{"kind": "rollout", "step": 0, "t_start": 0.0, "t_end": 1.0}]
    assert metrics.compute(trace, s.result())["summary"]["bubble_ratio_gpu"] == pytest.approx(0.5)
