"""Does GRPO learn, and do the modes learn equally? Held-out accuracy against samples consumed.

    python -m benchmarks.learning_curves --study lift                       # baseline on arith and kk
    python -m benchmarks.learning_curves --study parity --mode sorted --seed 1   # one parity curve
    python -m benchmarks.learning_curves --study parity --summary              # the parity table

Each curve trains from the embedded model with `rlbench train`'s defaults (a pool of 512 prompts cycled
per epoch, held-out evaluation on 128 problems of a disjoint seed at step 0 and every eval_every steps).
Two studies, each with its own results file in --out (`runs`: {task, mode, seed, samples, wall_s,
held_out_greedy_accuracy: {before, after}, curve}); a curve already there is kept unless --force, so a
study can be built by several invocations and resumed:

- lift (`learning_curves.json`): baseline on arith and kk for --lift-minutes of training (the steps' own
  time; held-out evaluations come on top), held-out evaluation every 10 steps. The claim: GRPO lifts
  held-out greedy accuracy.
- parity (`parity_<task>.json`): on --parity-task (kk, the task of SortedRL's logic experiments) baseline /
  sorted / sorted-partial with 3 seeds and rhyme / sorted+rhyme with 1 seed, each for exactly
  --parity-steps steps (equal samples for every mode), evaluated every --parity-eval-every steps with one
  T = 1 draw per problem for pass@1 (greedy accuracy decides; the denser curve costs less). The table:
  accuracy at equal samples, and the samples each mode needed to reach --target held-out greedy accuracy
  (linear between evaluations), against baseline.

Two invocations can run side by side (e.g. OMP_NUM_THREADS=1 each on 2 cores): they share the results file
under a lock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reference_trainer.trace.records import read_json
from rlbench.reproduce.accuracy import Workload
from rlbench.reproduce.curves import parity, parity_plan, run_curve, save_run

LIFT = [("arith", "baseline", 0), ("kk", "baseline", 0)]


def summarise(runs: list[dict], target: float) -> str:
    lines = ["| task | mode | seed | steps | samples | minutes | held-out greedy before | after | lift |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        h = r["held_out_greedy_accuracy"]
        lines.append(
            f"| {r['task']} | {r['mode']} | {r['seed']} | {r['steps']} | {r['samples']} "
            f"| {r['wall_s'] / 60:.1f} | {h['before']:.3f} | {h['after']:.3f} "
            f"| {h['after'] - h['before']:+.3f} |"
        )
    for task in dict.fromkeys(r["task"] for r in runs):
        mine = [r for r in runs if r["task"] == task]
        if len({r["mode"] for r in mine}) < 2:
            continue
        table = parity(mine, target)
        reach = f"samples to reach {target:.2f} held-out greedy accuracy"
        title = f"{task} parity at {table['samples']} samples; {reach}"
        lines += ["", title,
                  "| mode | seeds | accuracy at equal samples (mean ± sd) | vs baseline | "
                  "samples to target (mean) | vs baseline | rollout tokens (mean) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for mode, row in table["modes"].items():
            delta = "" if row["accuracy_vs_baseline"] is None else f"{row['accuracy_vs_baseline']:+.3f}"
            n = len(row["seeds"])
            to_target = (
                "not reached"
                if row["samples_to_target"] is None
                else f"{row['samples_to_target']:.0f} ({row['reached']}/{n} reached)"
            )
            saved = row["fewer_samples_share"]
            fewer = "" if saved is None else f"{saved:.1%} fewer" if saved >= 0 else f"{-saved:.1%} more"
            accuracy = f"{row['accuracy']:.3f} ± {row['accuracy_sd']:.3f}"
            tokens = "" if row["rollout_tokens"] is None else f"{row['rollout_tokens']:,.0f}"
            if row["rollout_tokens_vs_baseline"] is not None:
                tokens += f" ({row['rollout_tokens_vs_baseline']:.2f}x)"
            lines.append(f"| {mode} | {n} | {accuracy} | {delta} | {to_target} | {fewer} | {tokens} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=("lift", "parity"), required=True)
    parser.add_argument("--task")
    parser.add_argument("--mode")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "learning")
    parser.add_argument("--lift-minutes", type=float, default=20.0)
    parser.add_argument("--parity-task", default="kk", help="the task of the parity study")
    parser.add_argument("--parity-steps", type=int, default=6)
    parser.add_argument("--parity-eval-every", type=int, default=2)
    parser.add_argument("--target", type=float, default=Workload.target,
                        help="held-out greedy accuracy for samples-to-target")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="rerun curves already in the results")
    parser.add_argument("--summary", action="store_true", help="print the tables of the saved curves only")
    args = parser.parse_args()
    if args.study == "lift":
        results = args.out / "learning_curves.json"
        plan = [(*key, args.lift_minutes, 1000, 10, 4) for key in LIFT]
    else:
        results = args.out / f"parity_{args.parity_task}.json"
        plan = [(*key, float("inf"), args.parity_steps, args.parity_eval_every, 1)
                for key in parity_plan(args.parity_task)]  # fmt: skip
    if args.summary:
        print(summarise(read_json(results)["runs"], args.target) if results.is_file() else f"no {results}")
        return
    plan = [
        p
        for p in plan
        if args.task in (None, p[0]) and args.mode in (None, p[1]) and args.seed in (None, p[2])
    ]
    if not plan:
        sys.exit(f"no {args.study} curve matches --task/--mode/--seed")
    runs = read_json(results)["runs"] if results.is_file() else []
    for task, mode, seed, minutes, steps, eval_every, eval_samples in plan:
        key = (task, mode, seed)
        if not args.force and any((r["task"], r["mode"], r["seed"]) == key for r in runs):
            print(f"{task} {mode} seed {seed}: already in {results} (--force reruns it)")
            continue
        run_dir = args.out / "runs" / f"{args.study}-{task}-{mode}-s{seed}"
        run = run_curve(run_dir, minutes, task=task, mode=mode, seed=seed, steps=steps, eval_every=eval_every,
                        eval_samples=eval_samples)  # fmt: skip
        runs = save_run(results, run, args.target)  # after every curve: a kill loses at most one
    print(summarise(runs, args.target))


if __name__ == "__main__":
    main()
