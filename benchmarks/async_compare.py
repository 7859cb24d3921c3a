"""Does SortedRL beat plain async at the same staleness, and what does each trade for its speed?

    python -m benchmarks.async_compare [--seeds 3] [--budget-steps 6] [--eval-problems 64] [--work DIR]

The reduced version of the `sortedrl-time-to-accuracy` reproduction (rlbench/reproduce/time_to_accuracy.py,
`measure`) that fits a shared 2-core machine in about an hour: arith (the README's workload: 16 prompts x 8
samples per step, the embedded model), baseline / sorted / sorted-partial / async k = 1 / async k = 2 and the
baseline at one thread, interleaved in one process, --seeds seeds, each mode until its held-out greedy
accuracy (--eval-problems problems, one draw each for pass@1) gains 4 points over the start or
--budget-steps steps end. Every mode runs at 2 CPU threads (the async modes split them between rollout and
update), baseline-1t at 1. The machine's 1-minute load average is sampled every 30 s while it runs. Writes
benchmarks/results/async_compare.json (the rows, per seed, the load, device, date, commit, command); a
killed run resumes from the seeds it finished (--work).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
from pathlib import Path

from reference_trainer.trace.records import write_json
from rlbench.reproduce.base import Context
from rlbench.reproduce.runner import describe_device, source_commit
from rlbench.reproduce.time_to_accuracy import Workload, measure

MODES = ("baseline", "sorted", "sorted-partial", "async", "async-k2", "baseline-1t")
RESULTS = Path(__file__).parent / "results" / "async_compare.json"


class LoadSampler:
    """The 1-minute load average every `every_s` seconds, on a thread of its own."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s, self.samples, self._stop = every_s, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"mean": sum(s) / len(s), "min": min(s), "max": max(s), "samples": len(s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-steps", type=int, default=6)
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rlbench-async-compare"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    w = Workload(tasks=("arith",), budget_steps=args.budget_steps, seeds=args.seeds,
                 eval_problems=args.eval_problems, eval_samples=1, modes=MODES)  # fmt: skip
    ctx = Context(device="cpu", quick=False, model=None, work_dir=args.work)
    args.work.mkdir(parents=True, exist_ok=True)
    started, commit = time.time(), source_commit()  # the code the run starts with
    with LoadSampler() as load:
        outcome = measure(ctx, w)
    write_json(args.out, {
        "what": __doc__.split("\n")[0],
        "command": "python -m benchmarks.async_compare " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "device": describe_device("cpu"),
        "wall_s": time.time() - started,
        "load_average_1min": load.summary(),
        "workload": outcome.config,
        "measured": outcome.measured,
        "modes": outcome.data["arith"]["modes"],
        "per_seed": outcome.data["arith"]["per_seed"],
        "notes": outcome.notes,
    })  # fmt: skip
    print(outcome.measured["headline"])
    for mode, m in outcome.data["arith"]["modes"].items():
        print(f"{mode:>15}: {m}")


if __name__ == "__main__":
    main()
