"""The what-if: what each mode would buy on a run's response lengths, replayed through the simulator on a
preset cost model (a GPU and a model size). One function for every reader of lengths that were not run by
rlbench's own trainer: an observed server (`rlbench observe`) and another framework's run (`rlbench import`).
A prediction, labelled as one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlbench.simulate import simulate
from rlbench.simulate.cost import preset
from rlbench.simulate.workload import LengthTrace

LABEL = "a replay through rlbench simulate's engine and cost model, not a measurement"


def whatif(
    trace: LengthTrace,
    slots: int,
    workers: Sequence[int],
    modes: Sequence[str],
    gpu: str = "h100",
    model_size: str = "7b",
    steps: int | None = None,
    groups_per_worker: int | None = None,
) -> dict[str, Any]:
    """Every mode of `modes` at every worker count of `workers` (`slots` per worker): its predicted bubble,
    worker idle share, step time and speed-ups over the baseline, with the workload replayed."""
    cost = preset(gpu, model_size)
    doc = simulate(trace, cost, list(workers), list(modes), slots, steps=steps,
                   groups_per_worker=groups_per_worker)  # fmt: skip
    results = [
        {"workers": r["workers"], "mode": r["policy"], "bubble_ratio": _clean(r["bubble_ratio"]),
         "worker_idle_share": _clean(r["worker_idle_share"]), "step_time_s": r["step_time_s"],
         "speedup": r["speedup"], "rollout_speedup": r["rollout_speedup"]}
        for r in doc["results"]
    ]  # fmt: skip
    return {
        "available": True,
        "label": LABEL,
        "cost_model": f"{gpu.upper()} {cost.describe()['kind']}, {model_size} model (simulate presets)",
        "workload": doc["workload"],
        "results": results,
    }


def _clean(x: float | None) -> float | None:  # the simulator's float noise (-2e-16) is 0
    return None if x is None else (0.0 if abs(x) < 1e-9 else x)
