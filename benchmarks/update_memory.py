"""Peak memory of one GRPO update on a real model, with and without the logits budget, same batch.

    python -m benchmarks.update_memory [--model smollm2-135m-instruct] [--sequences 16] [--length 300]

Each setting runs in a fresh process (its peak RSS is its own): load the model in float32, build the
updater (AdamW), and run one update on a synthetic batch of --sequences sequences of --length tokens (half
prompt, half response, groups of 2 with rewards 0 and 1 so the gradient is not zero). `max_logits_mib` = 256
is the default; 1e9 turns the cap off (micro-batches of `micro_batch_size` = 32 sequences, as before).
Prints a table and writes benchmarks/results/update_memory_MODEL.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

BUDGETS = {"logits budget 256 MiB (default)": 256.0, "no budget (before)": 1e9}


def one_update(model: str, sequences: int, length: int, budget: float) -> dict:
    import random

    from common import resolve_model

    from reference_trainer.model.loader import load_model
    from reference_trainer.train.config import GRPOConfig
    from reference_trainer.train.grpo import GRPOUpdater, RolloutBatch

    path, _ = resolve_model(model)
    policy = load_model(path, dtype="float32")
    vocab = policy.config.vocab_size
    rng = random.Random(0)
    half = length // 2
    batch = RolloutBatch(
        [[rng.randrange(vocab) for _ in range(half)] for _ in range(sequences)],
        [[rng.randrange(vocab) for _ in range(length - half)] for _ in range(sequences)],
        [float(i % 2) for i in range(sequences)],
        group_size=2,
    )
    updater = GRPOUpdater(policy, GRPOConfig(lr=1e-6, micro_batch_size=32, max_logits_mib=budget))
    start = time.perf_counter()
    updater.update(batch)
    return {
        "seconds": time.perf_counter() - start,
        "micro_batches": len(updater._partition(batch)),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=300)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a child process: one setting
    args = parser.parse_args()
    if args.run:
        print(json.dumps(one_update(args.model, args.sequences, args.length, float(args.run))))
        return
    rows = {}
    for name, budget in BUDGETS.items():
        cmd = [sys.executable, __file__, "--model", args.model, "--sequences", str(args.sequences)]
        out = subprocess.run([*cmd, "--length", str(args.length), "--run", str(budget)], capture_output=True,
                             text=True, check=True)  # fmt: skip
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    size = f"{args.sequences} sequences of {args.length} tokens"
    print(f"model: {args.model}; one GRPO update, {size}, float32")
    print("| setting | micro-batches | update time | peak RSS |\n|---|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['micro_batches']} | {r['seconds']:.1f} s | {r['peak_rss_gb']:.2f} GB |")
    from reference_trainer.trace.records import write_json

    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(args.model).name)
    out_file = Path(__file__).parent / "results" / f"update_memory_{name}.json"
    write_json(out_file, {"model": args.model, "sequences": args.sequences, "length": args.length, **rows})


if __name__ == "__main__":
    main()
