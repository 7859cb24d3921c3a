"""SortedRL vs the synchronous baseline: bubble ratio, rollout throughput, wall time and reward per sample.

    python -m benchmarks.sorted [--steps 4] [--prompts-per-step 8] [--group-size 8] [--max-tokens 320]
                                [--oversubscription 2] [--max-staleness 2] [--model DIR|random] [--threads 1]

`baseline`, `sorted` and `sorted-partial` train from the same weights on the same heavy-tailed `arith` prompt
stream with the same seeds, each for `--steps` updates of prompts_per_step x group_size samples, so every mode
consumes the same number of trained samples. Engine capacity = prompts_per_step x group_size, so the baseline
admits exactly one update's worth of samples and idles its slots while the longest sample of the step runs.
The three trainers take their steps round-robin in one process, so a drift in machine load hits all alike.
Every metric is recomputed by `reference_trainer.trace.metrics` from each run's trace.jsonl. The model is the
embedded default when it is built, else a random model of the same shape. Prints a table and writes
benchmarks/results/sorted.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import resolve_model
from reference_trainer.trace.records import read_jsonl, write_json
from reference_trainer.train.trainer import Trainer
from rlbench.reproduce.sortedrl import MODES, Workload, mode_config
from rlbench.reproduce.sortedrl import summarize as trace_summary
from rlbench.training import interleave, open_trainers


def config(args: argparse.Namespace, mode: str, model: Path) -> Any:
    """The reproduction's configuration (rlbench/reproduce/sortedrl.py) with this script's sizes."""
    w = Workload(steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
                 max_tokens=args.max_tokens, oversubscription=args.oversubscription,
                 max_staleness=args.max_staleness, lr=args.lr, seed=args.seed)  # fmt: skip
    cfg = mode_config(w, mode, str(model), args.device)
    if args.max_prefill_tokens:
        cfg.max_prefill_tokens = args.max_prefill_tokens
    return cfg


def summarize(trainer: Trainer, out: Path) -> dict[str, Any]:
    """The reproduction's figures of merit, trained-token throughput, update time, the strategy's counters."""
    rows = read_jsonl(out / "metrics.jsonl")
    trained_tokens = sum(r["response_len_mean"] * r["samples"] for r in rows)
    base = trace_summary(out)
    return {
        **base,
        "trained_tokens_per_rollout_s": trained_tokens / base["rollout_time_s"],
        "trained_tokens": trained_tokens,
        "update_time_s": sum(r["timing_s/update"] for r in rows),
        "accuracy": sum(r["accuracy"] * r["samples"] for r in rows) / base["trained_samples"],
        "tis_weight_mean": [r.get("tis_weight_mean") for r in rows],
        "controller": getattr(trainer.strategy, "stats", {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir, or 'random' (default: the embedded model when built)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--oversubscription", type=float, default=2.0)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="engine tokens per prefill forward (default capacity x max_model_len: a step's admissions "
        "prefill in one forward, not in chunks that leave the other slots idle; 8192 is the engine's own)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared box)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sorted.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path, label = resolve_model(args.model)
    runs = Path(tempfile.mkdtemp(prefix="rlbench-sorted-"))
    start = time.perf_counter()
    with open_trainers({m: config(args, m, path) for m in MODES}, {m: runs / m for m in MODES}) as trainers:
        interleave(trainers, args.steps)  # one step of each mode in turn
        results = {m: summarize(t, runs / m) for m, t in trainers.items()}
    base = results["baseline"]
    for r in results.values():
        r["speedup_wall"] = base["wall_time_s"] / r["wall_time_s"]
        r["speedup_rollout_tokens_per_s"] = r["rollout_tokens_per_s"] / base["rollout_tokens_per_s"]
    print(
        f"\nmodel: {label}; arith, {args.steps} steps x {args.prompts_per_step} prompts x {args.group_size} "
        f"samples, max_tokens {args.max_tokens}, engine capacity {args.prompts_per_step * args.group_size}, "
        f"oversubscription {args.oversubscription}, max_staleness {args.max_staleness}, "
        f"{args.threads} thread(s), {time.perf_counter() - start:.0f}s total"
    )
    print(
        "| mode | bubble ratio | rollout tok/s | trained tok per rollout-s | wall to consume (s) | "
        "speed-up (wall) | tail share | reward/sample | staleness mean |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        stale = f"{r['staleness_mean']:.2f}" if r["staleness_mean"] is not None else "-"
        print(
            f"| {mode} | {100 * r['bubble_ratio']:.1f}% | {r['rollout_tokens_per_s']:,.0f} "
            f"({r['speedup_rollout_tokens_per_s']:.2f}x) | {r['trained_tokens_per_rollout_s']:,.0f} | "
            f"{r['wall_time_s']:.1f} | {r['speedup_wall']:.2f}x | {r['tail_time_share']:.3f} | "
            f"{r['reward_per_sample']:.4f} | {stale} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out, {"model": label, "args": {k: str(v) for k, v in vars(args).items()}, "runs": results}
    )
    print(f"results: {args.out}; traces: {runs}")


if __name__ == "__main__":
    main()
