"""GPU calibrations (rlbench/simulate/calibration.py) built from a committed GPU run's results, for runs that
predate the calibration stage of benchmarks.gpu_run:

    python -m benchmarks.calibration_from_results benchmarks/results/gpu/run-2026-11-26-h200-2a83ee8 \
        [--out rlbench/simulate/calibrations]

What that run measured, and nothing else:
- decode and verify: the runner's own forwards at 256 cached tokens per row (`measure_cost_model`, the
  fastest of 5 after a warm-up, CUDA graphs): verify_cost.json (batch 1 and 64, widths 1-16, both models)
  and, for SmolLM2's shape, attention.json's row of the attention the engine picked (batch 1, 64, 256,
  widths 1 and 8); verify as a multiple of the decode forward over as many rows, measured beside it;
- update, embedded model only: each step of the compare stage (gpu_run.json: the update phase's seconds and
  its tokens), the process's first update (its warm-up) left out.
Prefill was never timed there, nor SmolLM2's update: the writer leaves them swept.
"""

from __future__ import annotations

import argparse
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
    measured_by = _stage_commands(results / "gpu_run.log", ("attention", "compare"))
    provenance = {
        **{k: verify_doc[k] for k in ("device", "driver", "torch", "cuda", "commit", "date")},
        "command": f"python3 -m benchmarks.gpu_run ({measured_by}); read by {command}",
        "sources": [str(results / name) for name in ("verify_cost.json", "attention.json", "gpu_run.json")],
    }
    models = {m["model"]: _cells(m["ms"]) for m in verify_doc["models"]}
    picked = next(r for r in attention["rows"] if r["attention"] == attention["auto_picks"])
    smol = _cells(picked["ms"])  # SmolLM2's shape, in the attention the engine picked then
    embedded = models[label()]  # the shipped model is the one that run measured
    note = (
        "decode_step.json of the same run times the whole engine step by difference (forward, sampling and "
        "the host's scheduling) at 32-72 cached tokens: 2.56 / 3.59 / 5.35 ms at batch 1 / 64 / 256; here "
        "the forward alone at 256 cached tokens, as a replay adds the host time a run measured itself"
    )
    return [
        Calibration(gpu="h200", model="smollm2-135m", model_label=SMOLLM2_LABEL,
                    shape={k: getattr(SMOLLM2_SHAPE, k) for k in SHAPE_KEYS},
                    provenance={**provenance, "attention": picked["attention"], "layout": picked["layout"]},
                    context=attention["context"], decode={rows: w[1] for rows, w in smol.items()},
                    verify={**_ratios(smol), **_ratios(models[SMOLLM2_LABEL])}, notes=[note]),
        Calibration(gpu="h200", model="embedded", model_label=label(), shape=model_shape(default_model_dir()),
                    provenance=provenance, context=verify_doc["context"],
                    decode={rows: w[1] for rows, w in embedded.items()}, verify=_ratios(embedded),
                    update=fit_update(_update_points(run)),
                    notes=["update: the compare stage's steps, the process's first update left out"]),
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
