"""How far can the engine get ahead of transformers on a CPU? A decode step's time against its matmul floor.

    python -m benchmarks.decode_bound [--model smollm2-135m-instruct] [--batches 1,8,32] [--dtype float32]

For each batch size B, on the same weights and prompts (the chat prompts of rollout_runs.py):
- step time: B rows decoding --tokens tokens with EOS ignored, engine (B slots) and transformers' generate
  (one static batch of B), wall time / tokens, median of --repeats;
- matmul floor: one pass of B rows through every weight matrix of a decode step (per layer q/k/v, o,
  gate/up, down; then the LM head), timed alone: the engine's packed oneDNN matmuls and F.linear (the MKL
  path transformers takes). No engine can decode a step faster than its matmuls, so
  `transformers step / engine matmul floor` bounds the speed-up any overhead removal could reach.
Prints a table and writes benchmarks/results/decode_bound_NAME.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import resolve_model
from benchmarks.rollout_runs import prompt_ids
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.loader import load_model
from reference_trainer.trace.records import write_json


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_floor(model, batch: int, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """Seconds for one decode step's matmuls at `batch` rows: (packed, F.linear)."""
    linears = model.inference_linears()
    inputs = [torch.randn(batch, m.weight.shape[1], dtype=dtype) for m in linears]

    def packed() -> None:
        for m, x in zip(linears, inputs, strict=True):
            m(x)

    def dense() -> None:
        for m, x in zip(linears, inputs, strict=True):
            F.linear(x, m.weight)

    with torch.no_grad():
        return median_time(packed, repeats), median_time(dense, repeats)


def engine_step(model, prompts: list[list[int]], tokens: int, repeats: int) -> float:
    engine = Engine(model, EngineConfig(max_num_seqs=len(prompts), max_model_len=1024), eos_token_ids=[])
    params = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True) for _ in prompts]
    return median_time(lambda: engine.generate(prompts, params), repeats) / tokens


def transformers_step(path: Path, prompts: list[list[int]], tokens: int, dtype, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run() -> None:
        with torch.no_grad():
            model.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens
            )

    return median_time(run, repeats) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=64, help="decode steps per timed generate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    path, label = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    model = load_model(path, dtype=args.dtype)
    rows = {}
    for b in (int(x) for x in args.batches.split(",")):
        prompts, _ = prompt_ids(str(path), b)
        engine_s = engine_step(model, prompts, args.tokens, args.repeats)
        hf_s = transformers_step(path, prompts, args.tokens, dtype, args.repeats)
        packed_s, dense_s = matmul_floor(model, b, dtype, max(20, args.repeats))
        rows[str(b)] = {
            "engine_step_ms": engine_s * 1e3,
            "transformers_step_ms": hf_s * 1e3,
            "packed_matmul_ms": packed_s * 1e3,
            "dense_matmul_ms": dense_s * 1e3,
            "ratio": hf_s / engine_s,
            "ratio_bound": hf_s / packed_s,
        }
        print(f"  batch {b}: {rows[str(b)]}", file=sys.stderr)
    print(
        f"model: {label}; {args.dtype}; decode steps with EOS ignored, {args.tokens} tokens; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| batch | engine step | its matmuls (packed) | transformers step | its matmuls (F.linear) "
        "| ratio | bound: transformers step / engine matmuls |\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    for b, r in rows.items():
        print(
            f"| {b} | {r['engine_step_ms']:.1f} ms | {r['packed_matmul_ms']:.1f} ms "
            f"| {r['transformers_step_ms']:.1f} ms | {r['dense_matmul_ms']:.1f} ms | {r['ratio']:.2f}x "
            f"| {r['ratio_bound']:.2f}x |"
        )
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(str(args.model)).name)
    out = Path(__file__).parent / "results" / f"decode_bound_{name}_{args.dtype}.json"
    write_json(out, {"model": label, "dtype": args.dtype, "tokens": args.tokens, "batches": rows})


if __name__ == "__main__":
    main()
