"""The single-GPU GRPO step-time table in NeMo-RL's metric definitions (benchmarks/grpo_table.py), and the
controllers' host seconds per engine step it folds into a calibration for the GPU replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_run import stages
from benchmarks.grpo_table import controller_host, fold_into, markdown, table
from rlbench.simulate.calibration import (
    Calibration,
    model_shape,
    read_calibration,
    with_sweeps,
    write_calibration,
)


def step(n: int, step_s: float, gen: float, update: float, generated: int, trained: int) -> dict:
    return {"step": n, "step_time_s": step_s, "timing_s/gen": gen, "timing_s/update": update,
            "timing_s/sync": 0.01, "rollout_tokens": generated, "update_tokens": trained}  # fmt: skip


def compare_folder(tmp_path: Path, model: Path) -> Path:
    """A compare of two modes, two steps each (step 0 slower), their traces and run configs."""
    runs = [
        {"mode": "baseline", "steps": [step(0, 9.0, 5.0, 3.0, 100, 400), step(1, 4.0, 2.0, 1.5, 200, 800)]},
        {"mode": "sorted", "steps": [step(0, 9.0, 5.0, 3.0, 100, 400), step(1, 2.0, 1.0, 0.5, 300, 600)]},
    ]
    folder = tmp_path / "cmp"
    for run, controller in zip(runs, (0.001, 0.006), strict=True):
        (folder / run["mode"]).mkdir(parents=True)
        (folder / run["mode"] / "train_config.json").write_text(json.dumps({"model": str(model)}))
        events = [{"kind": "decode", "step": 1, "t_start": float(i), "t_end": i + 0.5, "active_slots": 2,
                   "capacity": 4, "tokens": 2, "worker": 0, "slots": {}} for i in range(3)]  # fmt: skip
        events.append({"kind": "rollout", "step": 1, "t_start": 0.0, "t_end": 3.0,
                       "host_cpu_s": {"engine": 0.01, "controller": controller}})  # fmt: skip
        (folder / run["mode"] / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "compare.json").write_text(json.dumps({"runs": runs}))
    return folder


def test_the_table_is_nemo_rls_step_time_and_stage_rates_without_step_0(tmp_path, tiny_model_dir):
    rows = {r["mode"]: r for r in table(compare_folder(tmp_path, tiny_model_dir), gpus=2)}
    base = rows["baseline"]
    assert base["steps"] == 1 and base["step_s"] == 4.0 and base["generation_s"] == 2.0
    assert base["training_s"] == 1.5 and base["weight_sync_s"] == 0.01
    assert base["generation_tok_s_gpu"] == pytest.approx(200 / (2.0 * 2))  # tokens / (stage s x GPUs)
    assert base["training_tok_s_gpu"] == pytest.approx(800 / (1.5 * 2))
    assert rows["sorted"]["step_tok_s_gpu"] == pytest.approx(300 / (2.0 * 2))
    assert base["logprob_s"] is None and "| in training |" in markdown(list(rows.values()))
    every = {r["mode"]: r for r in table(tmp_path / "cmp", skip_first=False)}
    assert every["baseline"]["steps"] == 2 and every["baseline"]["step_s"] == pytest.approx(6.5)


def test_each_modes_controller_host_per_engine_step_goes_into_the_calibration_of_its_shape(
    tmp_path, tiny_model_dir
):
    folder = compare_folder(tmp_path, tiny_model_dir)
    assert controller_host(folder) == pytest.approx({"baseline": 0.001 / 3, "sorted": 0.006 / 3})
    provenance = {"device": "d", "driver": "0", "torch": "0", "commit": "abc", "date": "2026-01-01",
                  "command": "c"}  # fmt: skip
    base = dict(gpu="g", model="tiny", model_label="tiny", provenance=provenance, context=64,
                decode={1: 1e-3}, verify={1: {1: 1.0}}, host={"s_per_step": 1e-4})  # fmt: skip
    cals = tmp_path / "cals"
    write_calibration(cals, with_sweeps(Calibration(shape=model_shape(tiny_model_dir), **base)))
    other = {**model_shape(tiny_model_dir), "hidden_size": 4096}
    write_calibration(cals, with_sweeps(Calibration(**{**base, "gpu": "h"}, shape=other)))
    assert fold_into(cals, folder) == ["g-tiny.json"]  # the other shape's is left as it was
    host = read_calibration(cals / "g-tiny.json").host
    assert host["controller_s_per_step"] == pytest.approx({"baseline": 0.001 / 3, "sorted": 0.006 / 3})
    assert "controller_s_per_step" not in read_calibration(cals / "h-tiny.json").host


def test_gpu_run_times_the_grpo_table_after_calibrating(tmp_path):
    plan = stages(tmp_path / "out", tmp_path / "work", True, None)
    names = [s.name for s in plan]
    assert names.index("grpo") == names.index("calibrate") + 1
    grpo = plan[names.index("grpo")]
    assert grpo.argv[grpo.argv.index("--shape") + 1] == "tiny" and "--calibrations" in grpo.argv
    assert grpo.outputs == ("grpo_table.json",)
