"""SortedRL across many rollout engines: which dispatch policy minimises the step time, for the baseline and
for sorted, and does sorted's gain over the baseline grow with the number of engines W?

    python -m benchmarks.multi_engine [--quick] [--workers 2[,4]] [--seeds 0,1,2] [--steps 4]
                                      [--sim-workers 8,64,512,4096] [--log FILE ...] [--no-cpu] [--no-sim]

(a) CPU: W Ray engines (one CPU thread each, the reference engine, the embedded model, arith); baseline and
sorted (where the trainer runs it on W engines at this commit; otherwise named as left out) under each
dispatch policy (round-robin and the count-based least-loaded one the mode takes), every (mode, policy, seed)
interleaved step by step in one run; step time over seeds (mean, sd, range; step 0, the warm-up, left out)
and each mode's ratio to the baseline under round-robin in the same seed.
(b) Simulator: each length log replayed at W = 8 ... 4,096 on the H200 calibration (weak scaling), baseline
and sorted under every policy: the best policy per (mode, W) and sorted's gain over the baseline.

Each engine has 32 slots (8 prompts x 8 per step fill them at W = 2). `--quick`: W = 2, 3 seeds of 3 steps
of 4 prompts x 8 (max 128 tokens, 16 slots); the simulator on 2 steps.
Prints the tables and writes benchmarks/results/multi_engine.json (`--out`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.common import resolve_model
from reference_trainer.trace.records import write_json
from rlbench.reproduce.multi_engine import (
    LENGTH_LOG,
    CpuRuns,
    Sweep,
    answer,
    cpu_table,
    measure_cpu,
    read_lengths,
    sweep,
)

ROOT = Path(__file__).resolve().parents[1]
TRL_LOG = ROOT / "benchmarks" / "results" / "trl_grpo_lengths.jsonl"  # a real TRL GRPOTrainer run's lengths


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the few-minute preset")
    p.add_argument("--workers", type=ints, default=None, help="CPU engine counts (default 2)")
    p.add_argument("--seeds", type=ints, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--prompts-per-step", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--modes", default=None, help="CPU modes, comma-separated (default: baseline,sorted)")
    p.add_argument("--policies", default=None,
                   help="CPU dispatch policies, comma-separated, or 'all' (default: round-robin and the "
                   "count-based least-loaded one the mode takes)")  # fmt: skip
    p.add_argument("--sim-workers", type=ints, default=(8, 64, 512, 4096))
    p.add_argument("--model-size", default="embedded", help="the H200 calibration's model (simulate presets)")
    p.add_argument("--log", type=Path, action="append", help="length log(s) (default: both committed ones)")
    p.add_argument("--model", help="model dir or name (default: the embedded model)")
    p.add_argument("--no-cpu", action="store_true")
    p.add_argument("--no-sim", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "multi_engine.json")
    return p.parse_args()


def cpu_runs(args: argparse.Namespace, workers: int) -> CpuRuns:
    c = CpuRuns(workers=workers)
    if args.quick:
        c = replace(c, steps=3, prompts_per_step=4, max_tokens=128, slots=16)
    policies = None if args.policies is None else tuple(args.policies.split(","))
    given = {"seeds": args.seeds, "steps": args.steps, "prompts_per_step": args.prompts_per_step,
             "max_tokens": args.max_tokens, "policies": policies,
             "modes": None if args.modes is None else tuple(args.modes.split(","))}  # fmt: skip
    return replace(c, **{k: v for k, v in given.items() if v is not None})


def print_cpu(workers: int, rows: list[dict], skipped: list[str]) -> None:
    print(
        f"\nCPU, W = {workers} Ray engines (step time over seeds; ratio to baseline/round-robin, same seed)"
    )
    print("| mode | dispatch | seeds | step time s (sd) [range] | vs baseline rr [range] | bubble | idle |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        lo, hi = r["step_time_range"]
        ratio = "-"
        if r["vs_baseline_rr"] is not None:
            a, b = r["vs_baseline_rr_range"]
            ratio = f"{r['vs_baseline_rr']:.3f} [{a:.3f}, {b:.3f}]"
        time_cell = f"{r['step_time_s']:.2f} ({r['step_time_sd']:.2f}) [{lo:.2f}, {hi:.2f}]"
        shares = f"{r['bubble_ratio']:.1%} | {r['cross_engine_idle']:.1%}"
        print(f"| {r['mode']} | {r['policy']} | {r['seeds']} | {time_cell} | {ratio} | {shares} |")
    print(
        "(idle: cross-engine idle, engine-seconds with no forward while another engine runs one, over W x"
        " the step's engine span: docs/metrics.md)"
    )
    for mode in skipped:
        print(
            f"{mode}: runs on one engine at this commit (the trainer refuses --workers {workers}); left out"
        )


def print_sim(log: str, model: str, rows: list[dict], ans: dict) -> None:
    print(f"\nSimulator, {log} (H200 {model} calibration; step time ms per (mode, policy), * = the W's best)")
    ws = sorted({r["workers"] for r in rows})
    print("| mode | dispatch | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|---|" + "---:|" * len(ws))
    for mode, policy in dict.fromkeys((r["mode"], r["policy"]) for r in rows):
        cells = []
        for w in ws:
            r = next(x for x in rows if (x["mode"], x["policy"], x["workers"]) == (mode, policy, w))
            star = "*" if ans["best_policy"][mode][w] == policy else ""
            cells.append(f"{1e3 * r['step_time_s']:.1f}{star} (bubble {r['bubble_ratio']:.0%})")
        print(f"| {mode} | {policy} | " + " | ".join(cells) + " |")
    if "sorted_gain" in ans:
        gains = ", ".join(f"W={w} {g:.3f}x" for w, g in ans["sorted_gain"].items())
        roll = ", ".join(f"W={w} {g:.3f}x" for w, g in ans["sorted_rollout_gain"].items())
        grows = f"{'yes' if ans['sorted_gain_grows'] else 'no'} ({ans['sorted_gain_growth']:+.3f})"
        print(f"sorted's step-time gain over the baseline (each under its best policy): {gains}; "
              f"grows from W={ws[0]} to W={ws[-1]}: {grows}; rollout-time gain: {roll}")  # fmt: skip


def main() -> None:
    args = parse()
    started, load = time.time(), os.getloadavg()
    doc: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_at_start": load,
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                          capture_output=True, text=True).stdout.strip(),
                 "cpu": {}, "simulator": {}}  # fmt: skip
    if not args.no_cpu:
        path, label = resolve_model(args.model)
        doc["model"] = label
        for w in args.workers or (2,):
            c = cpu_runs(args, w)
            runs = Path(tempfile.mkdtemp(prefix=f"rlbench-multi-engine-w{w}-"))
            measured = measure_cpu(c, str(path), runs, progress=lambda line: print(line, flush=True))
            rows = cpu_table(measured["runs"])
            doc["cpu"][str(w)] = {"workload": asdict(c), "rows": rows, **measured, "traces": str(runs)}
            print_cpu(w, rows, measured["skipped_modes"])
    if not args.no_sim:
        s = replace(
            Sweep(),
            workers=args.sim_workers,
            steps=2 if args.quick else Sweep.steps,
            model_size=args.model_size,
        )
        for log in args.log or [p for p in (LENGTH_LOG, TRL_LOG) if p.is_file()]:
            rows = sweep(read_lengths(log), s)
            ans = answer(rows)
            doc["simulator"][str(log)] = {"sweep": asdict(s), "rows": rows, "answer": ans}
            print_sim(str(log), s.model_size, rows, ans)
    doc.update(elapsed_s=time.time() - started, load_at_end=os.getloadavg())
    write_json(args.out, doc)
    print(f"\n{doc['elapsed_s']:.0f} s, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}; results: {args.out}")


if __name__ == "__main__":
    main()
