"""Does GRPO learn, and do the modes learn equally? Held-out accuracy against samples consumed.

    python benchmarks/learning_curves.py --task kk --mode sorted --seed 1 --out DIR   # one curve
    python benchmarks/learning_curves.py --out DIR                                    # the whole table

Each curve trains from the embedded model with `rlbench train`'s defaults (a pool of 512 prompts cycled
per epoch, held-out evaluation on 128 problems of a disjoint seed at step 0 and every --eval-every steps)
until --minutes or --steps, then evaluates the final policy. Curves accumulate in DIR/learning_curves.json
(`runs`: {task, mode, seed, samples, wall_s, held_out_greedy_accuracy: {before, after}, curve}); a curve
already there is kept unless --force, so the table can be built by several invocations and resumed.

The table: baseline on arith and kk for --lift-minutes (the learning claim), and on --parity-task (kk, the
task of SortedRL's logic experiments, by default) baseline / sorted / sorted-partial with 3 seeds and
rhyme / sorted+rhyme with 1 seed for --parity-minutes. Per task it prints accuracy at equal samples (the
largest count every curve of the task reached) and the samples each mode needed to reach --target
held-out greedy accuracy. Two invocations can run side by side (e.g. OMP_NUM_THREADS=1 each on 2 cores):
they share the results file under a lock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlbench.records import read_json, write_json  # noqa: E402

LIFT = [("arith", "baseline", 0), ("kk", "baseline", 0)]


def parity_plan(task: str) -> list[tuple[str, str, int]]:
    return [
        *[(task, m, s) for m in ("baseline", "sorted", "sorted-partial") for s in (0, 1, 2)],
        (task, "rhyme", 0),
        (task, "sorted+rhyme", 0),
    ]


class Budget(Exception):
    pass


def run_curve(
    task: str, mode: str, seed: int, minutes: float, steps: int, eval_every: int, out: Path
) -> dict:
    from reference_trainer.train.trainer import Trainer
    from rlbench.records import read_jsonl
    from rlbench.training import build_config

    config = build_config(task=task, mode=mode, steps=steps, seed=seed, eval_every=eval_every)
    trainer = Trainer(config, out)
    start = time.perf_counter()

    def on_step(row: dict) -> None:
        val = f" held-out {row['val/heldout_greedy_acc']:.3f}" if "val/heldout_greedy_acc" in row else ""
        print(
            f"{task} {mode} s{seed} step {row['step']:3d} reward {row['reward_mean']:.3f} "
            f"len {row['response_len_mean']:.0f} {row['step_time_s']:.1f}s{val}",
            flush=True,
        )
        if time.perf_counter() - start > minutes * 60:
            raise Budget

    try:
        trainer.run(on_step)
    except Budget:  # the budget ends the run; finished steps are kept, and the final policy is evaluated
        trainer.write_heldout_summary()
    curve = read_json(out / "heldout.json")["curve"]
    rows = read_jsonl(out / "metrics.jsonl")
    for point in curve:  # training reward and response length over the steps since the previous point
        window = [r for r in rows if r["step"] < point["step"]][-eval_every:]
        point["train_reward"] = statistics.fmean(r["reward_mean"] for r in window) if window else None
        point["response_len"] = statistics.fmean(r["response_len_mean"] for r in window) if window else None
    trainer.close()
    return {
        "task": task,
        "mode": mode,
        "seed": seed,
        "steps": trainer.step,
        "samples": curve[-1]["samples"],
        "wall_s": round(time.perf_counter() - start, 1),
        "held_out_greedy_accuracy": {"before": curve[0]["greedy_acc"], "after": curve[-1]["greedy_acc"]},
        "held_out_pass1": {"before": curve[0]["pass1"], "after": curve[-1]["pass1"]},
        "curve": curve,
    }


def save_run(results: Path, run: dict, target: float) -> list[dict]:
    """Merge `run` into the results file under a lock: several invocations may run curves in parallel."""
    import fcntl

    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        runs = read_json(results)["runs"] if results.is_file() else []
        key = (run["task"], run["mode"], run["seed"])
        runs = [r for r in runs if (r["task"], r["mode"], r["seed"]) != key] + [run]
        write_json(results, {"target": target, "runs": runs})
    return runs


def accuracy_at(curve: list[dict], samples: float) -> float:
    """Held-out greedy accuracy at `samples` consumed, linear between evaluations."""
    for a, b in zip(curve, curve[1:], strict=False):
        if a["samples"] <= samples <= b["samples"]:
            w = (samples - a["samples"]) / max(1, b["samples"] - a["samples"])
            return a["greedy_acc"] + w * (b["greedy_acc"] - a["greedy_acc"])
    return curve[-1]["greedy_acc"]


def samples_to_reach(curve: list[dict], target: float) -> int | None:
    return next((p["samples"] for p in curve if p["greedy_acc"] >= target), None)


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
        parity = [r for r in runs if r["task"] == task]
        if len({r["mode"] for r in parity}) < 2:
            continue
        common = min(r["samples"] for r in parity)
        lines += ["", f"{task} parity at {common} samples; samples to reach {target:.2f} held-out accuracy",
                  "| mode | seeds | accuracy at equal samples (mean ± sd) | samples to target (mean) |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for mode in dict.fromkeys(r["mode"] for r in parity):
            mine = [r for r in parity if r["mode"] == mode]
            accs = [accuracy_at(r["curve"], common) for r in mine]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            reach = [samples_to_reach(r["curve"], target) for r in mine]
            reached = [x for x in reach if x is not None]
            to_target = (
                f"{statistics.fmean(reached):.0f} ({len(reached)}/{len(reach)} reached)"
                if reached
                else "not reached"
            )
            lines.append(f"| {mode} | {len(mine)} | {statistics.fmean(accs):.3f} ± {sd:.3f} | {to_target} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task")
    parser.add_argument("--mode")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "learning")
    parser.add_argument("--lift-minutes", type=float, default=20.0)
    parser.add_argument("--parity-minutes", type=float, default=10.0)
    parser.add_argument("--minutes", type=float, help="budget of every curve run by this invocation")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--parity-task", default="kk", help="the task of the parity runs")
    parser.add_argument("--target", type=float, default=0.40, help="held-out accuracy for samples-to-target")
    parser.add_argument("--force", action="store_true", help="rerun curves already in the results")
    parser.add_argument("--summary", action="store_true", help="print the tables of the saved curves only")
    args = parser.parse_args()
    results = args.out / "learning_curves.json"
    if args.summary:
        print(summarise(read_json(results)["runs"], args.target) if results.is_file() else f"no {results}")
        return
    plan = [(*key, args.lift_minutes) for key in LIFT] + [
        (*key, args.parity_minutes) for key in parity_plan(args.parity_task)
    ]
    plan = [
        p
        for p in plan
        if args.task in (None, p[0]) and args.mode in (None, p[1]) and args.seed in (None, p[2])
    ]
    if not plan:  # a curve outside the table, e.g. --task arith --mode sorted
        plan = [(args.task or "kk", args.mode or "baseline", args.seed or 0, args.parity_minutes)]
    runs = read_json(results)["runs"] if results.is_file() else []
    for task, mode, seed, minutes in plan:
        key = (task, mode, seed)
        if not args.force and any((r["task"], r["mode"], r["seed"]) == key for r in runs):
            print(f"{task} {mode} seed {seed}: already in {results} (--force reruns it)")
            continue
        run = run_curve(task, mode, seed, args.minutes or minutes, args.steps, args.eval_every,
                        args.out / "runs" / f"{task}-{mode}-s{seed}")  # fmt: skip
        runs = save_run(results, run, args.target)  # after every curve: a kill loses at most one
    print(summarise(runs, args.target))


if __name__ == "__main__":
    main()
