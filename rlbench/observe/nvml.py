"""NVML GPU timeline: a background thread sampling every GPU at >= 10 Hz on the Trace's clock.

Per sample and GPU: `util` (NVML "GPU utilization": the percent of the last sample period in which a kernel
ran on the GPU; NVML's stand-in for SM utilisation, the figure nvidia-smi shows), `mem_util`,
`mem_used_mib`, `power_w`, `sm_clock_mhz`, `mem_clock_mhz`. A field the GPU does not support is null.
Without a driver (`pynvml.NVMLError` at init, e.g. NVMLError_LibraryNotFound) the result is
`{"available": false, "reason": ...}` and no samples: nothing is invented.

The NVML module is a constructor argument, so tests pass a fake at the NVML boundary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

# NVML clock ids (pynvml.NVML_CLOCK_SM / NVML_CLOCK_MEM), repeated so a minimal fake need not define them.
_CLOCK_SM, _CLOCK_MEM = 1, 2
_MIB = 1024 * 1024


def _load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Sample all GPUs every `interval_s` seconds in a daemon thread; `result()` gives the JSON-able timeline.

    Use as a context manager, or call start()/stop(). `now` must be the Trace's clock (e.g. `trace.now`)
    so samples line up with rollout phases.
    """

    def __init__(
        self,
        now: Callable[[], float] | None = None,
        interval_s: float = 0.1,
        nvml: ModuleType | Any | None = None,
        max_samples: int = 2_000_000,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        t0 = time.perf_counter()
        self.now = now or (lambda: time.perf_counter() - t0)
        self.interval_s = interval_s
        self._nvml = nvml
        self.max_samples = max_samples  # bounds memory on very long runs; dropped samples are counted
        self.available = False
        self.reason: str | None = None
        self.devices: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.dropped = 0
        self.errors: dict[str, str] = {}
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._initialised = False

    def _init(self) -> None:
        try:
            nvml = self._nvml if self._nvml is not None else _load_pynvml()
            self._nvml = nvml
            nvml.nvmlInit()
            self._initialised = True
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except ImportError as err:
            self.reason = f"pynvml not installed ({err})"
            return
        except Exception as err:  # pynvml.NVMLError and its subclasses; the module may be a fake
            self.reason = f"{type(err).__name__}: {err}"
            return
        if not self._handles:
            self.reason = "NVML found no GPU"
            return
        self.available = True
        for i, h in enumerate(self._handles):
            info: dict[str, Any] = {"index": i}
            info["name"] = self._call("name", lambda h=h: _text(nvml.nvmlDeviceGetName(h)))
            info["memory_total_mib"] = self._call(
                "memory_total", lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).total / _MIB
            )
            self.devices.append(info)

    def _call(self, field: str, fn: Callable[[], Any]) -> Any:
        """One NVML query; an unsupported one (NVMLError_NotSupported on some boards) gives null, no crash."""
        try:
            return fn()
        except Exception as err:
            self.errors.setdefault(field, f"{type(err).__name__}: {err}")
            return None

    def sample_once(self) -> None:
        """Take one sample of every GPU now."""
        nvml = self._nvml
        t = self.now()
        for i, h in enumerate(self._handles):
            if len(self.samples) >= self.max_samples:
                self.dropped += 1
                continue
            util = self._call("util", lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h))
            mem = self._call("memory", lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h))
            power_mw = self._call("power", lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))
            sm_clock = self._call("sm_clock", lambda h=h: nvml.nvmlDeviceGetClockInfo(h, _CLOCK_SM))
            mem_clock = self._call("mem_clock", lambda h=h: nvml.nvmlDeviceGetClockInfo(h, _CLOCK_MEM))
            self.samples.append(
                {
                    "t": t,
                    "gpu": i,
                    "util": None if util is None else float(util.gpu),
                    "mem_util": None if util is None else float(util.memory),
                    "mem_used_mib": None if mem is None else mem.used / _MIB,
                    "power_w": None if power_mw is None else power_mw / 1000.0,  # NVML reports milliwatts
                    "sm_clock_mhz": sm_clock,
                    "mem_clock_mhz": mem_clock,
                }
            )

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            self.sample_once()
            # fixed-rate schedule: a slow query does not stretch the period for later samples
            next_t += self.interval_s
            delay = next_t - time.perf_counter()
            if delay < 0:
                next_t = time.perf_counter()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> NvmlSampler:
        self._init()
        if self.available:
            self._thread = threading.Thread(target=self._run, name="rlbench-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_once()  # a closing sample, so a short run still has its end on the timeline
        if self._initialised:
            self._initialised = False
            self._call("shutdown", self._nvml.nvmlShutdown)
        return self.result()

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def result(self) -> dict[str, Any]:
        """JSON-able timeline: {"available", "reason", "interval_s", "devices", "samples", ...}."""
        return {
            "available": self.available,
            "reason": self.reason,
            "interval_s": self.interval_s,
            "devices": self.devices,
            "samples": list(self.samples),
            "dropped_samples": self.dropped,
            "errors": dict(self.errors),
        }


def mean_util(
    gpu: dict[str, Any] | None, t_start: float | None = None, t_end: float | None = None
) -> float | None:
    """Mean `util` (0-100) over all GPUs' samples in [t_start, t_end]; None without samples."""
    if not gpu or not gpu.get("available"):
        return None
    vals = [
        float(s["util"])
        for s in gpu.get("samples", [])
        if s.get("util") is not None
        and (t_start is None or s["t"] >= t_start)
        and (t_end is None or s["t"] <= t_end)
    ]
    return sum(vals) / len(vals) if vals else None


def no_gpu_note(gpu: dict[str, Any] | None) -> str:
    """The one line reports show where there is no GPU timeline."""
    reason = (gpu or {}).get("reason") or "no samples"
    return f"no GPU: NVML unavailable ({reason})"
