"""HistoPipe vs round-robin vs least-in-flight placement over W Ray rollout workers.

    python -m benchmarks.histopipe [--workers 2] [--epochs 4] [--pool 32] [--prompts-per-step 8]
                                   [--group-size 8] [--max-tokens 400] [--slots 32] [--model DIR|random]

Four trainers (round-robin, least-in-flight, histopipe, histopipe-lpt; see VARIANTS in
rlbench/reproduce/histopipe.py, which holds the workload's code and is also `rlbench reproduce
histopipe-balance`) train from the same weights on the same heavy-tailed `arith` pool of `--pool` prompts,
cycled for `--epochs` epochs, with the same per-request seeds, so they generate the same samples (checked per
step; a warning if not). Each worker is a Ray actor with one CPU thread and `--slots` KV slots. The trainers
take their steps round-robin, so a drift in machine load hits all alike.

Per step, from the trace (reference_trainer.trace.metrics): `worker_idle_share[w]` = 1 - busy_w / busiest
worker's busy time; the table's idle share is its mean over workers, averaged over the epoch's steps. Rollout
time is the rollout phase's wall time. Prints a table per epoch and writes benchmarks/results/histopipe.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.common import resolve_model
from reference_trainer.trace.records import write_json
from rlbench.reproduce.histopipe import PLACEMENTS, Workload, ray_session, run_placements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir, or 'random' (default: the embedded model when built)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--pool", type=int, default=32, help="prompts per epoch")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--slots", type=int, default=32, help="KV slots per worker")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "histopipe.json")
    args = parser.parse_args()
    if args.pool % args.prompts_per_step:
        parser.error("--pool must be a multiple of --prompts-per-step")
    w = Workload(
        workers=args.workers,
        epochs=args.epochs,
        pool=args.pool,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        slots=args.slots,
        lr=args.lr,
        seed=args.seed,
        placements=PLACEMENTS,
    )

    path, label = resolve_model(args.model)
    runs = Path(tempfile.mkdtemp(prefix="rlbench-histopipe-"))
    start = time.perf_counter()
    with ray_session(w.workers * len(PLACEMENTS)):
        results, _ = run_placements(w, str(path), runs, progress=lambda line: print(line, flush=True))
    print(
        f"\nmodel: {label}; arith, {args.workers} Ray workers x {args.slots} slots, "
        f"pool {args.pool} prompts, {args.prompts_per_step} prompts x {args.group_size} samples per step, "
        f"max_tokens {args.max_tokens}, "
        f"{args.epochs} epochs, {time.perf_counter() - start:.0f}s total"
    )
    print("| epoch | " + " | ".join(f"{p} idle / rollout s" for p in PLACEMENTS) + " | histopipe idle ÷ rr |")
    print("|---:|" + "---:|" * (len(PLACEMENTS) + 1))
    for e in range(args.epochs):
        cells = [f"{results[p][e]['idle_share']:.3f} / {results[p][e]['rollout_s']:.2f}" for p in PLACEMENTS]
        rr, hp = results["round-robin"][e]["idle_share"], results["histopipe"][e]["idle_share"]
        ratio = f"{hp / rr:.2f}" if rr else "-"
        print(f"| {e + 1} | " + " | ".join(cells) + f" | {ratio} |")
    later = {p: [r["idle_share"] for r in results[p][1:]] for p in PLACEMENTS}
    means = {p: sum(v) / len(v) for p, v in later.items() if v}
    if means:
        print(
            "epochs 2+ mean idle share: "
            + ", ".join(f"{p} {v:.3f}" for p, v in means.items())
            + f"; histopipe / round-robin = {means['histopipe'] / means['round-robin']:.2f} (target <= 0.33)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out, {"model": label, "args": {k: str(v) for k, v in vars(args).items()}, "epochs": results}
    )
    print(f"results: {args.out}; traces: {runs}")


if __name__ == "__main__":
    main()
