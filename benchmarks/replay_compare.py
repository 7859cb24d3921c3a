"""A finished `rlbench compare` replayed through a given GPU calibration (rlbench/simulate/gpu_replay.py):
one measured after the comparison ran (benchmarks/gpu_run.py's calibrate stage), or another GPU's.

    python -m benchmarks.replay_compare RUNS_DIR --calibration FILE [--out FILE]

Prints what `rlbench compare` prints of its replay, and writes the doc (default:
RUNS_DIR/gpu_replay_<calibration>.json). The calibration is used whatever model shape it was measured for:
compare itself refuses another shape's, so a replay through one says so on its first line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reference_trainer.model.embedded import default_model_dir
from reference_trainer.trace.records import read_json, write_json
from reference_trainer.trace.schema import read_trace
from rlbench.report.replay_summary import comparison_lines
from rlbench.simulate.calibration import model_shape, read_calibration
from rlbench.simulate.gpu_replay import GpuReplay


def compared_shape(compare: dict[str, Any]) -> dict[str, int] | None:
    """The compared model's shape, where its directory (or the embedded model) is on this machine."""
    model = str((compare.get("workload") or {}).get("model") or "")
    if model.startswith("embedded"):
        return model_shape(default_model_dir())
    return model_shape(model) if model and Path(model).is_dir() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a compare's --out folder (compare.json, <mode>/trace.jsonl)")
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    compare = read_json(args.runs / "compare.json")
    calibration = read_calibration(args.calibration)
    traces = {run["mode"]: read_trace(args.runs / run["mode"] / "trace.jsonl") for run in compare["runs"]}
    doc = GpuReplay(calibration, calibration.shape).comparison(traces, compare["baseline"])
    if compared_shape(compare) != calibration.shape:
        said = f"{calibration.name} ({calibration.model_label})"
        print(f"note: {said} was measured on another shape than the compared model's")
    for line in comparison_lines(doc):
        print(line)
    out = args.out or args.runs / f"gpu_replay_{calibration.name}.json"
    write_json(out, doc)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
