"""Does the GPU replay's figure hold still when this machine's load changes? The README's compare run twice
with the same seed, as it is and beside busy-loop processes (or compare folders already run, `--runs`), and
sorted's replayed rollout speed-up over the baseline's read from each at free admissions: as the replay
gives it (host work per engine step from the calibration, else swept: a count, not this machine's time) at
each swept host value, and, for reference, with this machine's CPU seconds as the host time (the replay's
source before, which moved with the load).

    python -m benchmarks.replay_stability [--steps 4] [--busy 2] [--seed 0] [--out FILE]
    python -m benchmarks.replay_stability --runs DIR[:LOAD] DIR[:LOAD] ... [--out FILE]

Prints a table: per run, the load average around it, the replayed figure per source, and the spread between
the runs. The machine's other users load it too: the load recorded is what it was, not what was asked for.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    return {"name": f"{busy} busy loops", "load_before": f"{load_before:.1f}",
            "load_after": f"{load_after:.1f}", "wall_s": time.perf_counter() - start,
            "figures": figures(out)}  # fmt: skip


def figures(out: Path) -> dict[str, Any]:
    """Sorted's replayed rollout speed-up at free admissions: the replay's (per swept host value, or the
    calibration's host) and, for reference, with this machine's CPU seconds as host time."""
    doc = read_json(out / "compare.json")["gpu_replay"]
    cal = next(c for c in packaged() if c.name == doc["calibration"]["name"])
    runs = {m: replay(read_trace(out / m / "trace.jsonl"), cal, m) for m in ("baseline", "sorted")}
    comp = comparison(runs, "baseline")
    free = [p for p in comp["speedup"]["sorted"] if not p["assumed"].get("prefill")]
    model = {str(p["assumed"].get("host", "calibration")): p["rollout"] for p in free}

    def with_this_cpu(run: Any) -> float:  # forwards at free admissions + this CPU's host seconds
        host0 = {**free[0]["assumed"], "host": 0.0}
        cpu = statistics.mean(sum((s.host_parts or {}).values()) for s in run.steps)
        return float(run.rollout_s(host0)) + cpu

    return {"model": model, "this_cpu": with_this_cpu(runs["baseline"]) / with_this_cpu(runs["sorted"])}


def table(runs: list[dict[str, Any]]) -> str:
    hosts = list(runs[0]["figures"]["model"])
    lines = [
        "| run | load (before / after) | "
        + " | ".join(f"replayed, host {float(h) * 1e3:g} ms/step" if h != "calibration" else "replayed"
                     for h in hosts)
        + " | with this CPU's host seconds |",
        "|---|---|" + "---:|" * (len(hosts) + 1),
    ]  # fmt: skip
    for r in runs:
        cells = [f"{r['figures']['model'][h]:.3f}x" for h in hosts] + [f"{r['figures']['this_cpu']:.3f}x"]
        lines.append(f"| {r['name']} | {r['load_before']} / {r['load_after']} | " + " | ".join(cells) + " |")
    for h in hosts:
        values = [r["figures"]["model"][h] for r in runs]
        lines.append(f"spread (replayed, host {h}): {100 * (max(values) / min(values) - 1):.1f}%")
    values = [r["figures"]["this_cpu"] for r in runs]
    lines.append(f"spread (this CPU's host seconds): {100 * (max(values) / min(values) - 1):.1f}%")
    return "\n".join(lines)


def read_runs(specs: list[str]) -> list[dict[str, Any]]:
    """Compare folders already run, each DIR or DIR:LOAD (the load average it ran at, as recorded)."""
    runs = []
    for spec in specs:
        folder, _, load = spec.partition(":")
        if not (Path(folder) / "compare.json").is_file():
            raise SystemExit(f"error: {folder}: no compare.json (a `rlbench compare` output folder)")
        said = load or "not recorded"
        runs.append(
            {"name": folder, "load_before": said, "load_after": said, "figures": figures(Path(folder))}
        )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the second run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", help="compare folders already run (DIR or DIR:LOAD) instead")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.runs:
        runs = read_runs(args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="replay-stability-") as tmp:
            runs = [run_compare(Path(tmp) / f"busy{b}", args.steps, args.seed, b) for b in (0, args.busy)]
    print(table(runs))
    command = " ".join(["python -m benchmarks.replay_stability", *sys.argv[1:]])
    write_json(args.out, {"command": command, "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                          "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()
