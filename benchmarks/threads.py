"""torch threads on a CPU that other jobs share: the same short profile run with 1..N threads, alone and
beside a competing job, interleaved.

    python -m benchmarks.threads [--threads 1,2] [--repeats 2] [--steps 3] [--out FILE]

Each cell runs `rlbench profile --mode sorted --steps S --eval-every 0 --threads T` in a fresh process and
takes its wall time; "shared" runs it while another process keeps one core busy (a Python loop: the other
job of a shared runner). Runs are interleaved (threads x load, repeated), so a drift in the machine's own
load hits every cell alike. Prints the median per cell and writes JSON (default
benchmarks/results/threads.json). This is what `--threads`' default (every core but one) rests on.
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

from reference_trainer.trace.records import write_json

BUSY = "while True: pass"


def run_once(threads: int, steps: int, shared: bool) -> float:
    other = subprocess.Popen([sys.executable, "-c", BUSY]) if shared else None
    try:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "rlbench.cli", "profile", "--mode", "sorted", "--steps", str(steps),
                 "--eval-every", "0", "--threads", str(threads), "--device", "cpu", "--out", out],
                check=True, capture_output=True,
            )  # fmt: skip
            return time.perf_counter() - start
    finally:
        if other is not None:
            other.kill()
            other.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "threads.json")
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for shared in (False, True):
            for threads in counts:
                key = f"{threads} {'shared' if shared else 'alone'}"
                times.setdefault(key, []).append(run_once(threads, args.steps, shared))
                print(f"  {key}: {times[key][-1]:.1f} s", file=sys.stderr, flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"`rlbench profile --mode sorted --steps {args.steps} --eval-every 0`, {cores} cores, median of "
          f"{args.repeats}, load average before {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| threads | alone (s) | beside one busy process (s) |")
    print("|---:|---:|---:|")
    for threads in counts:
        alone, shared = (statistics.median(times[f"{threads} {w}"]) for w in ("alone", "shared"))
        print(f"| {threads} | {alone:.1f} | {shared:.1f} |")
    write_json(args.out, {"cores": cores, "steps": args.steps, "repeats": args.repeats, "seconds": times})


if __name__ == "__main__":
    main()
