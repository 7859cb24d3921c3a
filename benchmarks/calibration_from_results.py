"""GPU calibrations (rlbench/simulate/calibration.py) built from a committed GPU run's results, for runs that
predate the calibration stage of benchmarks.gpu_run:

    python -m benchmarks.calibration_from_results benchmarks/results/gpu/run-2026-11-26-h200-2a83ee8 \
        [--out rlbench/simulate/calibrations]

What that run measured, and nothing else:
- decode, SmolLM2's shape: the engine's decode step by difference (decode_step.json: forward, sampling,
  read-back and the engine's host work, at 40-72 cached tokens) at batch 1, 64 and 256 (batch 256 from the
  run's log, gpu_run.log: the JSON lost it when a later side ran out of time);
- decode, embedded model (no engine step was timed for it): the runner's forward alone at 256 cached tokens
  (verify_cost.json, `measure_cost_model`), so the engine's host work per step is missing from it;
- verify: each width's forward as a multiple of the decode forward over as many rows, both timed by the
  runner at 256 cached tokens (verify_cost.json: batch 1 and 64, widths 1-16; for SmolLM2's shape also
  attention.json's batch 256, widths 1 and 8, in the attention the engine picked then);
- update, embedded model only: each step of the compare stage (gpu_run.json: the update phase's seconds and
  its tokens), the process's first update (its warm-up) left out.
Prefill was never timed there, nor SmolLM2's update: the writer leaves them swept.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu import SMOLLM2_SHAPE
from reference_trainer.model.embedded import default_model_dir, label
from reference_trainer.trace.records import read_json
from rlbench.simulate.calibration import (
    CALIBRATIONS,
    SHAPE_KEYS,
    Calibration,
    fit_update,
    model_shape,
    write_calibration,
)

SMOLLM2_LABEL = "SmolLM2-135M shape, random weights"
DECODE_CONTEXT = 56  # decode_step.json: 32 prompt tokens, steps timed between 8 and 40 generated


def _cells(ms: dict[str, float]) -> dict[int, dict[int, float]]:
    """{"BxQ": ms} -> {B: {Q: seconds}}."""
    table: dict[int, dict[int, float]] = {}
    for key, value in ms.items():
        rows, width = (int(n) for n in key.split("x"))
        table.setdefault(rows, {})[width] = value / 1e3
    return table


def _ratios(cells: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """Each width's forward as a multiple of the decode forward (width 1) over as many rows beside it."""
    return {rows: {w: s / widths[1] for w, s in widths.items()} for rows, widths in cells.items()}


def _update_points(run: dict[str, Any]) -> list[tuple[float, float]]:
    compare = next(iter(run["stages"]["compare"]["results"].values()))
    points = [
        (float(step["update_tokens"]), float(step["timing_s/update"]))
        for r in compare["runs"]
        for step in r["steps"]
        if step.get("update_tokens") and step.get("timing_s/update") is not None
    ]
    return points[1:]  # the first update of the process (interleaved: the first mode's step 0) warms up


def _engine_steps(results: Path) -> dict[int, float]:
    """decode_step.json's engine step by batch, and the log's where the JSON lost a batch."""
    steps = {
        r["batch"]: r["step_ms"]["engine"] / 1e3 for r in read_json(results / "decode_step.json")["rows"]
    }
    for line in (results / "gpu_run.log").read_text().splitlines():
        if found := re.fullmatch(r"\s*batch (\d+) engine: ([\d.]+) ms per decode step", line):
            steps.setdefault(int(found[1]), float(found[2]) / 1e3)
    return dict(sorted(steps.items()))


def _stage_commands(log: Path, stages: tuple[str, ...]) -> str:
    """The commands the run's log says its stages ran (`===== NAME: COMMAND (up to N s)`)."""
    said = {}
    for line in log.read_text().splitlines():
        if line.startswith("===== ") and ": " in line:
            name, command = line[6:].split(": ", 1)
            said[name] = command.rsplit(" (up to", 1)[0].replace("/opt/torch/.venv/bin/python3", "python3")
    return "; ".join(f"{name}: {said[name]}" for name in stages if name in said)


def build(results: Path, command: str) -> list[Calibration]:
    verify_doc = read_json(results / "verify_cost.json")
    attention = read_json(results / "attention.json")
    run = read_json(results / "gpu_run.json")
    sources = ("decode_step.json", "verify_cost.json", "attention.json", "gpu_run.json", "gpu_run.log")

    def provenance(stages: tuple[str, ...]) -> dict[str, Any]:
        measured_by = _stage_commands(results / "gpu_run.log", stages)
        return {
            **{k: verify_doc[k] for k in ("device", "driver", "torch", "cuda", "commit", "date")},
            "command": f"python3 -m benchmarks.gpu_run ({measured_by}); read by {command}",
            "sources": [str(results / name) for name in sources],
        }

    models = {m["model"]: _cells(m["ms"]) for m in verify_doc["models"]}
    picked = next(r for r in attention["rows"] if r["attention"] == attention["auto_picks"])
    smol = _cells(picked["ms"])  # SmolLM2's shape, in the attention the engine picked then (batch 256)
    embedded = models[label()]  # the shipped model is the one that run measured
    verify_note = (
        "verify: forwards timed by the runner at 256 cached tokens, as a multiple of its decode forward"
    )
    return [
        Calibration(gpu="h200", model="smollm2-135m", model_label=SMOLLM2_LABEL,
                    shape={k: getattr(SMOLLM2_SHAPE, k) for k in SHAPE_KEYS},
                    provenance={**provenance(("decode", "attention")), "attention": picked["attention"],
                                "layout": picked["layout"]},
                    context=DECODE_CONTEXT, decode=_engine_steps(results),
                    verify={**_ratios(smol), **_ratios(models[SMOLLM2_LABEL])},
                    notes=["decode: the engine's step by difference (decode_step.json, the log's batch 256), "
                           "40-72 cached tokens", verify_note]),
        Calibration(gpu="h200", model="embedded", model_label=label(), shape=model_shape(default_model_dir()),
                    provenance=provenance(("attention", "compare")), context=verify_doc["context"],
                    decode={rows: w[1] for rows, w in embedded.items()}, verify=_ratios(embedded),
                    update=fit_update(_update_points(run)),
                    notes=["decode: the runner's forward alone (no engine step was timed for this model): "
                           "the engine's host work per step is not in it", verify_note,
                           "update: the compare stage's steps, the process's first update left out"]),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a GPU run's folder under benchmarks/results/gpu/")
    parser.add_argument("--out", type=Path, default=CALIBRATIONS)
    args = parser.parse_args()
    command = f"python -m benchmarks.calibration_from_results {args.results}"
    for calibration in build(args.results, command):
        print(write_calibration(args.out, calibration))


if __name__ == "__main__":
    main()
