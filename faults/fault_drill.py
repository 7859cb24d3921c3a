"""The fault drill: rlbench driven as an operator meets faults, with a table of what held.

    python -m faults.fault_drill [--out faults/results/fault_drill.json] [--only GROUP]

Groups (each case is one command, or a kill and a resume, judged by what it must do):
- kill/resume: `train` killed (SIGKILL) after k finished steps, in start-up and in its final held-out
  evaluation, then resumed; `eval` killed mid-run, then rerun; the run must end with every step once, the
  rows finished before the kill kept byte for byte, no temp checkpoint left, and an eval equal to an
  uninterrupted one.
- signals: Ctrl-C (SIGINT) in start-up, in `train` and in `profile`, and a rerun of the interrupted profile.
- concurrency: two writers of one run directory at once (train+train, eval+eval, train+profile).
- disk: a full disk and a read-only one under train (its first checkpoint), eval, report, trace export and
  models import-gguf. On a tmpfs mounted for the drill when this process may mount one (root in a container
  with CAP_SYS_ADMIN), else by patching os.write/os.replace in process.
- inputs: model directories whose config.json lies, refused chat templates, bad suite rows, wrongly typed
  traces, run configs and saved results.
- servers: `rlbench observe` against hostile metrics servers on 127.0.0.1 (a byte at a time, endless, huge,
  garbage, silent, bad histogram labels, a success counter 1e9 higher on every scrape), beside a readable
  one.
- fuzz: every numeric option of every command fed 0, -3, nan, inf, 1e999 and 2**70; a value that passes the
  checks up front is then run for real.
- hostile: run files that are symlinks, folders holding another command's run, damaged checkpoints and
  weights, sampling values that vanish in float32, JSON the interpreter refuses, shapes and sizes past any
  run, unbounded claims of servers and files, saved numbers a report would print wrongly, paths.
- surfaces: each case in a process under a deadline and a memory cap: the TRL callback's
  folder and arguments, suite files and groups (names and paths leaving their roots, YAML alias bombs,
  FIFOs and devices, graders that fail to import, sampling values), length logs, verl logs and TRL parquet
  files past any run (values, workers, steps, rows, a million lines), lookahead and suffix modes, an empty
  observation.
- async: a rollout run ahead whose rollout process is killed (SIGKILL, SIGTERM), whose trainer gets SIGTERM,
  whose resume lacks its run-ahead weights, whose max_staleness cannot fit: one line, no ring left behind.
- outputs: `--out` over the command's own input, inside another run or over an earlier run; two suites on one
  data file; the TRL callback's overwrite given as 'false'.
- engines: a Ray actor (a rollout engine of `sorted` at W = 2) killed mid-step: the step ends on the other,
  the trace names the lost engine, each sample trains once; a W = 2 run resumed with `--workers 1`; async at
  W = 2 whose rollout process, the driver of its local Ray, is SIGKILLed: that Ray's processes and folder go.

The first four groups are in fault_runs.py, the inputs in fault_inputs.py, servers and fuzz in fault_fuzz.py,
hostile input in fault_hostile.py, the surfaces in fault_surfaces.py, async and outputs in
fault_supervision.py, the engines in fault_engines.py.

A case fails when the command does not end as it must; a traceback is any "Traceback" a command printed (or an
exception escaping it in process); "lost" counts finished work or intact data that did not survive the fault.
Writes the cases and totals as JSON (faults/results/fault_drill.json).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

from faults.fault_engines import engine_cases
from faults.fault_fuzz import hostile_servers, option_fuzz
from faults.fault_hostile import hostile_round3
from faults.fault_inputs import Check, Outcome, corrupt_inputs
from faults.fault_runs import ROOT, concurrency, disks, kill_resume, signals
from faults.fault_supervision import async_supervision, output_cases
from faults.fault_surfaces import surfaces
from reference_trainer.errors import printable
from reference_trainer.trace.records import write_json

RESULT = ROOT / "faults" / "results" / "fault_drill.json"


GROUPS: dict[str, Callable[[Path], Iterator[tuple[str, Check]]]] = {
    "kill/resume": kill_resume,
    "signals": signals,
    "concurrency": concurrency,
    "disk": disks,
    "inputs": corrupt_inputs,
    "servers": hostile_servers,
    "fuzz": option_fuzz,
    "hostile": hostile_round3,
    "surfaces": surfaces,
    "async": async_supervision,
    "outputs": output_cases,
    "engines": engine_cases,
}


def drill(only: list[str] | None) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="rlbench-drill-") as tmp:
        work = Path(tmp)
        for group, cases in GROUPS.items():
            if only and group not in only:
                continue
            (work / group.replace("/", "-")).mkdir()
            for n, (name, check) in enumerate(cases(work / group.replace("/", "-"))):
                d = work / group.replace("/", "-") / f"{n:03d}"
                d.mkdir()
                t0 = time.perf_counter()
                try:
                    outcome = check(d)
                except Exception as err:  # a fault of the drill itself: a failure, said as such
                    outcome = Outcome(False, f"drill error: {type(err).__name__}: {err}")
                seconds = time.perf_counter() - t0
                results.append({"group": group, "case": name, **vars(outcome), "seconds": round(seconds, 2)})
                mark = "ok " if outcome.ok and not outcome.traceback and not outcome.lost else "BAD"
                line = f"{mark} {group:12} {name[:70]:70} {seconds:5.1f}s  {outcome.detail[:90]}"
                print(printable(line), flush=True)  # a case's detail quotes what a command printed
    return results


def totals(results: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "cases": len(results),
        "failures": sum(not r["ok"] for r in results),
        "tracebacks": sum(r["traceback"] for r in results),
        "lost": sum(r["lost"] for r in results),
        **{
            f"failed: {kind}": n
            for kind, n in Counter(r.get("failure") for r in results if r.get("failure")).items()
        },
    }


def main() -> None:
    # Started in the background (`cmd &`, nohup) this process ignores SIGINT, and so would every command it
    # starts: the Ctrl-C drills would then measure nothing. A handler here makes the commands' own default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--only", action="append", choices=list(GROUPS), help="Run only these groups.")
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = drill(args.only)
    by_group = {
        g: totals([r for r in results if r["group"] == g]) for g in dict.fromkeys(r["group"] for r in results)
    }
    print(f"\n{'group':14}{'cases':>7}{'failures':>10}{'tracebacks':>12}{'lost':>6}")
    for group, t in {**by_group, "all": totals(results)}.items():
        print(f"{group:14}{t['cases']:>7}{t['failures']:>10}{t['tracebacks']:>12}{t['lost']:>6}")
    elapsed = time.perf_counter() - t0
    print(f"{elapsed:.0f} s")
    doc = {
        "command": "python -m faults.fault_drill" + "".join(f" --only {g}" for g in args.only or []),
        "date": date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "system": platform.platform(),
        },
        "seconds": round(elapsed, 1),
        "totals": totals(results),
        "groups": by_group,
        "cases": results,
    }
    write_json(args.out, doc)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
