"""The what-if: what each mode would buy on a run's response lengths, replayed through the simulator on a
preset cost model (a GPU and a model size). One function for every reader of lengths that were not run by
rlbench's own trainer: an observed server (`rlbench observe`) and another framework's run (`rlbench import`).
A prediction, labelled as one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_trainer.trace.schema import SEQUENCE, UPDATE
from rlbench.simulate import simulate
from rlbench.simulate.cost import CostModel, preset
from rlbench.simulate.modes import dispatch_entries
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
    update_s_per_token: float | None = None,
    dispatch_workers: int | None = None,
) -> dict[str, Any]:
    """Every mode of `modes` at every worker count of `workers` (`slots` per worker): its predicted bubble,
    worker idle share, step time and speed-ups over the baseline, with the workload replayed; and the
    baseline's best dispatch policy at `dispatch_workers` (default: the largest of `workers`).
    `update_s_per_token`: the trainer's measured seconds per trained token for the logged batch on one
    worker (`logged_update_cost`), in place of the preset's update; an async mode's trainer pool runs it."""
    cost: CostModel = preset(gpu, model_size)
    said = f"{gpu.upper()} {cost.describe()['kind']}, {model_size} model (simulate presets)"
    if update_s_per_token is not None:
        cost = LoggedUpdate(cost, update_s_per_token)
        said += f"; the update at the log's {1000 * update_s_per_token:.3g} s per 1,000 trained tokens"
    doc = simulate(
        trace, cost, list(workers), list(modes), slots, steps=steps, groups_per_worker=groups_per_worker
    )
    results = [
        {"workers": r["workers"], "mode": r["policy"], "bubble_ratio": _clean(r["bubble_ratio"]),
         "worker_idle_share": _clean(r["worker_idle_share"]), "step_time_s": r["step_time_s"],
         "speedup": r["speedup"], "rollout_speedup": r["rollout_speedup"],
         **{k: r[k] for k in ("trainer_workers",) if k in r}}
        for r in doc["results"]
    ]  # fmt: skip
    best = best_dispatch(trace, cost, slots, dispatch_workers or max(workers), steps, groups_per_worker)
    return {
        "available": True,
        "label": LABEL,
        "cost_model": said,
        "workload": doc["workload"],
        "results": results,
        "not_modelled": doc["not_modelled"],
        "best_dispatch": best,
    }


def best_dispatch(
    trace: LengthTrace,
    cost: CostModel,
    slots: int,
    workers: int,
    steps: int | None = None,
    groups_per_worker: int | None = None,
    mode: str = "baseline",
) -> dict[str, Any]:
    """`mode` replayed at `workers` engines under every dispatch policy it takes: the policy with the least
    simulated step time, and its speed-up over round-robin (the mode's default where it has none)."""
    entries = dispatch_entries(mode)
    if workers < 2 or len(entries) < 2:
        why = "one engine: nothing to dispatch" if workers < 2 else f"mode {mode} takes no dispatch policy"
        return {"available": False, "reason": why, "workers": workers}
    labels = [mode, *entries[1:]]  # the default policy as the plain mode: the simulator's reference
    doc = simulate(trace, cost, [workers], labels, slots, steps=steps, groups_per_worker=groups_per_worker)
    policy = {label: entry.split("=", 1)[1] for label, entry in zip(labels, entries, strict=True)}
    rows = [{"policy": policy[r["policy"]], "step_time_s": r["step_time_s"],
             "bubble_ratio": _clean(r["bubble_ratio"]), "worker_idle_share": _clean(r["worker_idle_share"])}
            for r in doc["results"]]  # fmt: skip
    best = min(rows, key=lambda r: r["step_time_s"])
    reference = next((r for r in rows if r["policy"] == "round-robin"), rows[0])
    speedup = reference["step_time_s"] / best["step_time_s"] if best["step_time_s"] else None
    return {
        "available": True,
        "mode": mode,
        "workers": workers,
        "policies": rows,
        "best": best["policy"],
        "reference": reference["policy"],
        "best_speedup": speedup,
        "line": f"{mode} at W={workers}: least step time under dispatch {best['policy']} "
        f"({best['step_time_s']:.3g} s, {speedup:.2f}x over {reference['policy']}'s "
        f"{reference['step_time_s']:.3g} s)",
    }


@dataclass
class LoggedUpdate(CostModel):
    """A cost model whose update is a run's own (seconds per trained token, prompt and response, for one
    worker's batch), data parallel over the workers; everything else is `base`'s."""

    base: CostModel
    update_per_token: float

    def __post_init__(self) -> None:
        self.gap, self.rollout_fixed, self.name = self.base.gap, self.base.rollout_fixed, self.base.name

    def decode(self, batch: np.ndarray, ctx: np.ndarray, q: float = 1.0) -> np.ndarray:
        return self.base.decode(batch, ctx, q)

    def prefill(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        return self.base.prefill(n_seqs, tokens, tokens_sq)

    def riding(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        return self.base.riding(n_seqs, tokens, tokens_sq)

    def update(self, tokens: float, workers: int) -> float:
        return self.update_per_token * tokens / max(1, workers)

    def describe(self) -> dict[str, Any]:
        return {**self.base.describe(), "update_s_per_token": self.update_per_token, "update_from": "the log"}


def logged_update_cost(events: Sequence[dict[str, Any]]) -> float | None:
    """A run's update seconds per trained token (prompt and response tokens of the sequences its updates
    consumed), over the steps whose update phase took time; None when no step did (a length log has no
    clock, and no update)."""
    timed: dict[int, float] = {}
    for e in events:
        if e.get("kind") == UPDATE and float(e["t_end"]) > float(e["t_start"]):
            timed[int(e["step"])] = timed.get(int(e["step"]), 0.0) + float(e["t_end"]) - float(e["t_start"])
    tokens = sum(
        int(e.get("prompt_tokens") or 0) + int(e.get("response_tokens") or 0)
        for e in events
        if e.get("kind") == SEQUENCE and e.get("status") == "finished" and int(e.get("step", -1)) in timed
    )
    return sum(timed.values()) / tokens if tokens else None


def _clean(x: float | None) -> float | None:  # the simulator's float noise (-2e-16) is 0
    return None if x is None else (0.0 if abs(x) < 1e-9 else x)
