"""One GRPO update before and after the update's host syncs were removed (fused/foreach AdamW, bf16 autocast
on CUDA), same model, same batch, same process, interleaved.

    python -m benchmarks.update_speed [--model smollm2-135m-instruct] [--sequences 64] [--length 128]
                                      [--micro-batch-size 32] [--repeats 5] [--threads 1] [--device cpu]
                                      [--before c624845]

"before" is `reference_trainer/train/grpo.py` as it was at the --before commit, loaded from git into this
process; "after" is the working tree's. Each repeat runs both sides (alternating which goes first) on a fresh
copy of the same float32 model: one update of --sequences synthetic sequences of --length tokens (half
prompt, half response, groups of 2 with rewards 0 and 1 so the gradient is not zero), with the trainer's
GRPO defaults (lr 1e-4, micro-batches of 32 and the 256 MiB logits budget). Reports the median seconds of
each side, their ratio, and the largest difference between the two sides' losses (on CPU the two compute the
same update; on CUDA "after" autocasts to bf16).
Writes benchmarks/results/update_speed_MODEL_DEVICE_mbMICRO_BATCH_SIZE.json.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from benchmarks.common import resolve_model
from reference_trainer.model.loader import load_model
from reference_trainer.trace.records import write_json
from reference_trainer.train import grpo
from reference_trainer.train.config import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]


def module_at(commit: str) -> ModuleType:
    """grpo.py as it was at `commit`, imported under another name."""
    source = subprocess.run(
        ["git", "show", f"{commit}:reference_trainer/train/grpo.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader(f"grpo_at_{commit}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, f"{commit}:reference_trainer/train/grpo.py", "exec"), module.__dict__)
    return module


def synthetic_batch(vocab: int, sequences: int, length: int) -> grpo.RolloutBatch:
    rng = random.Random(0)
    half = length // 2
    return grpo.RolloutBatch(
        [[1] + [rng.randrange(3, vocab) for _ in range(half - 1)] for _ in range(sequences)],
        [[rng.randrange(3, vocab) for _ in range(length - half)] for _ in range(sequences)],
        [float(i % 2) for i in range(sequences)],
        group_size=2,
    )


def timed_update(
    side: ModuleType, model: torch.nn.Module, batch: grpo.RolloutBatch, mbs: int
) -> tuple[float, float]:
    updater = side.GRPOUpdater(copy.deepcopy(model), GRPOConfig(lr=1e-4, micro_batch_size=mbs))
    if model.lm_head.weight.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    stats = updater.update(batch)
    if model.lm_head.weight.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, stats["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="a model name or directory; default: the embedded model"
    )
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--before", default="c624845", help="the commit whose updater is the baseline")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path, label = resolve_model(args.model)
    model = load_model(path, device=args.device, dtype="float32")
    batch = synthetic_batch(model.config.vocab_size, args.sequences, args.length)
    sides = {"before": module_at(args.before), "after": grpo}
    timed_update(sides["after"], model, batch, args.micro_batch_size)  # warm-up: allocators, kernels
    times: dict[str, list[float]] = {name: [] for name in sides}
    losses: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            seconds, loss = timed_update(sides[name], model, batch, args.micro_batch_size)
            times[name].append(seconds)
            losses[name].append(loss)
    before, after = (statistics.median(times[name]) for name in ("before", "after"))
    micro_batches = len(
        grpo.GRPOUpdater(model, GRPOConfig(micro_batch_size=args.micro_batch_size))._partition(batch)
    )
    loss_gap = max(abs(a - b) for a, b in zip(losses["before"], losses["after"], strict=True))
    setting = f"{args.sequences} x {args.length} tokens, {micro_batches} micro-batches"
    print(f"model: {label}; {args.device}, {args.threads} thread(s), torch {torch.__version__}")
    print("| model | batch | before | after | before / after | loss gap |\n|---|---|---:|---:|---:|---:|")
    print(
        f"| {label} | {setting} | {before:.3f} s | {after:.3f} s | {before / after:.2f}x | {loss_gap:.1e} |"
    )
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(args.model or "embedded").name)
    write_json(
        Path(__file__).parent
        / "results"
        / f"update_speed_{name}_{args.device}_mb{args.micro_batch_size}.json",
        {
            "model": label,
            "device": args.device,
            "threads": args.threads,
            "torch": torch.__version__,
            "before_commit": args.before,
            "sequences": args.sequences,
            "length": args.length,
            "micro_batches": micro_batches,
            "seconds": times,
            "median_s": {"before": before, "after": after},
            "speedup": before / after,
            "max_loss_gap": loss_gap,
        },
    )


if __name__ == "__main__":
    main()
