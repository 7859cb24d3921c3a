"""Does the GPU replay's figure hold still when this machine's load changes? The README's compare run twice
with the same seed, as it is and beside busy-loop processes, and sorted's replayed rollout speed-up over the
baseline's (free admissions) read from each, with its host time from CPU seconds (the replay's source when the
trace has them) and, for reference, from wall time outside the forwards (the source before CPU seconds).

    python -m benchmarks.replay_stability [--steps 4] [--busy 2] [--seed 0] [--out FILE]

Prints a table: per run, the load average around it, the replayed figure and sorted's host share of its
replayed rollout under both sources, and the spread between the runs. The machine's other users load it
too: the load recorded is what it was, not what was asked for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json, write_json
from reference_trainer.trace.schema import read_trace
from rlbench.simulate.calibration import packaged
from rlbench.simulate.gpu_replay import comparison, replay

DEFAULT_OUT = Path(__file__).with_name("results") / "replay_stability.json"
BUSY_LOOP = "while True: pass"


def run_compare(out: Path, steps: int, seed: int, busy: int) -> dict[str, Any]:
    """One `rlbench compare --modes baseline,sorted` beside `busy` busy loops; the load around it."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    load_before, start = os.getloadavg()[0], time.perf_counter()
    try:
        cmd = [sys.executable, "-m", "rlbench.cli", "compare", "--modes", "baseline,sorted", "--steps",
               str(steps), "--seed", str(seed), "--out", str(out)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        load_after = os.getloadavg()[0]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if done.returncode != 0:
        raise SystemExit(f"compare failed: {done.stderr.strip().splitlines()[-1:]}")
    return {"busy_loops": busy, "load_before": load_before, "load_after": load_after,
            "wall_s": time.perf_counter() - start, "figures": figures(out)}  # fmt: skip


def figures(out: Path) -> dict[str, Any]:
    """Sorted's replayed rollout speed-up at free admissions and its host share, per host source."""
    doc = read_json(out / "compare.json")["gpu_replay"]
    cal = next(c for c in packaged() if c.name == doc["calibration"]["name"])
    traces = {m: read_trace(out / m / "trace.jsonl") for m in ("baseline", "sorted")}
    wall = {m: [{k: v for k, v in e.items() if k != "host_cpu_s"} for e in t] for m, t in traces.items()}
    found = {}
    for source, runs in (("cpu", traces), ("wall", wall)):
        replays = {m: replay(events, cal) for m, events in runs.items()}
        comp = comparison(replays, "baseline")
        free = next(p for p in comp["speedup"]["sorted"] if not any(p["assumed"].values()))
        host = comp["runs"]["sorted"]["host"]
        base = comp["runs"]["baseline"]["host"]
        found[source] = {"speedup": free["rollout"], "sorted_host_ms": 1e3 * host["s_per_rl_step"],
                         "sorted_host_share": host["share_of_rollout"][0],
                         "baseline_host_ms": 1e3 * base["s_per_rl_step"]}  # fmt: skip
    return found


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| busy loops | load (before / after) | source | sorted vs baseline (replayed) "
        "| sorted host ms / RL step "
        "| its share | baseline host ms |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        for source, f in r["figures"].items():
            lines.append(
                f"| {r['busy_loops']} | {r['load_before']:.1f} / {r['load_after']:.1f} | {source} | "
                f"{f['speedup']:.3f}x | {f['sorted_host_ms']:.1f} | {100 * f['sorted_host_share']:.0f}% | "
                f"{f['baseline_host_ms']:.1f} |"
            )
    for source in ("cpu", "wall"):
        values = [r["figures"][source]["speedup"] for r in runs]
        lines.append(f"spread ({source}): {100 * (max(values) / min(values) - 1):.1f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the second run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replay-stability-") as tmp:
        runs = [run_compare(Path(tmp) / f"busy{b}", args.steps, args.seed, b) for b in (0, args.busy)]
    print(table(runs))
    command = " ".join(["python -m benchmarks.replay_stability", *sys.argv[1:]])
    write_json(args.out, {"command": command, "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                          "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
