"""How to draw one token per row from counter-based uniforms: the choice behind engine/sampler.py `draw`.

    python benchmarks/sampler_draw.py [--vocabs 99,49152] [--batches 1,64,256] [--repeats 21]

Three ways to draw from a [batch, vocab] distribution, each the median of --repeats calls, interleaved:
- inverse CDF (the engine's): one hashed uniform per row, a float64 cumulative sum, a binary search;
- exponential race: argmax p / E with one hashed Exp(1) per (row, token), the same hash (SplitMix64);
- per-row generators (the engine's earlier draw): one torch.Generator and one exponential_ call per row.
Vocabulary 99 is the embedded model's, 49,152 SmolLM2's. Prints a table and writes
benchmarks/results/sampler_draw.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.sampler import GAMMA, SamplingBatch, _signed, draw, mix64, seed_key
from reference_trainer.trace.records import write_json


def race(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    rows = mix64(batch.keys + (batch.positions + 1) * _signed(GAMMA))
    tokens = torch.arange(1, probs.shape[1] + 1, dtype=torch.long, device=probs.device)
    bits = (mix64(rows[:, None] + tokens[None, :] * _signed(GAMMA)) >> 11) & (2**53 - 1)
    exp = -torch.log1p(-(bits.double() * 2.0**-53)).float()
    return (probs / exp).argmax(-1)


def generators(probs: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    """The earlier draw: each request's own generator (made once per request, so not timed here)."""
    noise = torch.empty_like(probs)
    for row, gen in enumerate(gens):
        noise[row].exponential_(generator=gen)
    return (probs / noise).argmax(-1)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", default="99,49152")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    names = ["inverse CDF", "exponential race", "per-row generators"]
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} (ms)")
    print("| vocab | batch | " + " | ".join(names) + " |\n|---:|---:|" + "---:|" * len(names))
    for vocab in map(int, args.vocabs.split(",")):
        for size in map(int, args.batches.split(",")):
            gen = torch.Generator().manual_seed(size)
            probs = torch.softmax(torch.randn(size, vocab, generator=gen) * 3, -1)
            batch = SamplingBatch.build(
                [SamplingParams()] * size, [seed_key(i) for i in range(size)], [100] * size, probs.device
            )
            gens = [torch.Generator().manual_seed(i) for i in range(size)]
            methods: dict[str, Callable[[], object]] = {
                "inverse CDF": lambda p=probs, b=batch: draw(p, b),
                "exponential race": lambda p=probs, b=batch: race(p, b),
                "per-row generators": lambda p=probs, g=gens: generators(p, g),
            }
            times: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(3):  # interleaved rounds: load drifts hit every method alike
                for name, fn in methods.items():
                    times[name].append(median_ms(fn, args.repeats))
            med = {name: statistics.median(t) for name, t in times.items()}
            rows.append({"vocab": vocab, "batch": size, "ms": med})
            print(f"| {vocab:,} | {size} | " + " | ".join(f"{med[n]:.3f}" for n in names) + " |")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    write_json(
        out / "sampler_draw.json",
        {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
