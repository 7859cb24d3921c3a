"""The engine's decode step against transformers', per batch size, on SmolLM2-135M's shape: the table the
engine's GPU targets are stated in, with a before column from another checkout measured in the same run.

    python -m benchmarks.decode_step [--batches 1,64,256] [--engine-path OLD_CHECKOUT] [--steps 64]
                                     [--repeats 3] [--device cuda|cpu] [--shape smollm2|tiny] [--out DIR]

A decode step is measured by difference: each side generates 8 and 8 + --steps tokens per row (fixed
length, EOS ignored, T = 1) for the same B prompts of 32 random tokens, and the step is the time between
them over --steps, so prefill, setup and the first steps' graph captures cancel out; the median of
--repeats pairs after one untimed run of each length. Each side runs in its own process (a fresh CUDA
context and its own memory; benchmarks/decode_step_runs.py): the engine at every B first, then the other
sides B by B, OUT/decode_step.json rewritten as each cell finishes:
- engine: this checkout's engine with its defaults (CUDA graphs on CUDA);
- before: the engine of --engine-path (e.g. a checkout of d990e15), on the same model and prompts;
- hf-static: transformers' `generate` with `cache_implementation="static"` (on CUDA it compiles the decode
  step; its cache is sized per call, 8 positions longer for the longer run);
- hf-eager: transformers' `generate` with its default dynamic cache.
On CUDA the engine sides are also profiled (torch.profiler) over both lengths, and the difference per step
gives the GPU's kernel time (busy share = kernel time / step time), the host's kernel launches (a captured
graph's launch counted apart) and device-to-host copies per decode step.

The model has random weights in SmolLM2-135M's shape (bf16 on CUDA, float32 on CPU): its speed is the real
model's, the arithmetic does not depend on the values. `--shape tiny --device cpu` is the smoke test.
Prints a table and writes OUT/decode_step.json with the device, driver, torch version, commit and date.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu import SMOLLM2_SHAPE, device_record
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import save_model
from reference_trainer.trace.records import write_json

ROOT = Path(__file__).resolve().parent.parent
RUNS = Path(__file__).with_name("decode_step_runs.py")  # one side in a process of its own
SHORT = 8  # tokens of the shorter run; the longer one adds --steps
PROMPT_TOKENS = 32
TINY_SHAPE = dataclasses.replace(
    SMOLLM2_SHAPE, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
)  # fmt: skip
# The issue's targets on an H100 (decode step ms per batch; engine vs transformers' static cache; busy share)
STEP_TARGET_MS = {1: 1.5, 64: 2.0, 256: 4.0}
STATIC_RATIO_TARGET, BUSY_TARGET = 2.0, 0.8


def prompts(batch: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return [[1, *torch.randint(3, vocab, (PROMPT_TOKENS - 1,), generator=gen).tolist()] for _ in range(batch)]


def run_side(side: str, spec: dict[str, Any], engine_path: str | None) -> dict[str, Any]:
    """One side in its own process: this checkout's code, or --engine-path's for `before`."""
    path = engine_path if side == "before" else str(ROOT)
    out = subprocess.run(
        [sys.executable, str(RUNS), json.dumps({**spec, "side": side})],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": path or "", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    if out.returncode != 0:  # recorded, not fatal: the other sides (an eager fall-back) still run
        print(f"{side} at batch {len(spec['prompts'])} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return {"side": side, "error": out.stderr[-3000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(batch: int, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One table row: each side's step in ms, the engine's ratios, busy share, launches, and the targets."""
    ms = {side: cell["step_s"] * 1e3 for side, cell in cells.items() if "step_s" in cell}
    row: dict[str, Any] = {"batch": batch, "step_ms": ms}
    if "engine" not in ms:
        return row
    engine = ms["engine"]
    if "hf-static" in ms:
        row["static_over_engine"] = ms["hf-static"] / engine  # >= 2: the engine twice as fast
    if "before" in ms:
        row["before_over_engine"] = ms["before"] / engine
    for side in ("engine", "before"):
        per_step = cells.get(side, {}).get("per_step")
        if per_step:
            row[f"{side}_busy"] = per_step["kernel_s"] * 1e3 / ms[side]
            row[f"{side}_per_step"] = per_step
    target = STEP_TARGET_MS.get(batch)
    row["targets"] = {
        "step": None if target is None else engine <= target,
        "vs_static": None if "hf-static" not in ms else row["static_over_engine"] >= STATIC_RATIO_TARGET,
        "busy": None if "engine_busy" not in row or batch < 64 else row["engine_busy"] >= BUSY_TARGET,
    }
    return row


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: float | None, fmt: str, unit: str = "") -> str:
        return "" if value is None else format(value, fmt) + unit

    lines = [
        "| batch | engine ms | before ms | hf static ms | hf eager ms | static / engine | before / engine "
        "| GPU busy (engine / before) | launches per step (engine / before) | DtoH copies per step |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        ms = r["step_ms"]
        if "engine" not in ms:
            lines.append(f"| {r['batch']} | failed | | | | | | | | |")
            continue
        eng, bef = r.get("engine_per_step", {}), r.get("before_per_step", {})
        busy = launches = ""  # profiled on CUDA only
        if eng:
            busy = f"{r['engine_busy']:.0%} / {cell(r.get('before_busy'), '.0%')}"
            launches = f"{eng['launches']:.0f} + {eng['graph_launches']:.0f} graphs / "
            launches += cell(bef.get("launches"), ".0f")
        lines.append(
            f"| {r['batch']} | {ms['engine']:.3f} | {cell(ms.get('before'), '.3f')} | "
            f"{cell(ms.get('hf-static'), '.3f')} | {cell(ms.get('hf-eager'), '.3f')} | "
            f"{cell(r.get('static_over_engine'), '.2f', 'x')} | "
            f"{cell(r.get('before_over_engine'), '.2f', 'x')} | "
            f"{busy} | {launches} | {cell(eng.get('dtoh_copies'), '.1f')} |"
        )
    return "\n".join(lines)


def batch_sizes(text: str) -> list[int]:
    """--batches: comma-separated positive integers."""
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"want comma-separated batch sizes such as 1,64,256, got {text!r}")
    return sizes


def record(device: str) -> dict[str, Any]:
    if device == "cuda":
        return device_record()
    from rlbench.reproduce.runner import source_commit

    date = time.strftime("%Y-%m-%d")
    return {"device": "cpu", "torch": torch.__version__, "commit": source_commit(), "date": date}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=batch_sizes, default="1,64,256")
    parser.add_argument("--engine-path", help="a checkout whose engine is the before column (e.g. d990e15)")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--sides", default="engine,before,hf-static,hf-eager")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per side (0: torch's own)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda needs a CUDA GPU (--device cpu --shape tiny is the smoke test)")
    if args.steps < 1 or args.repeats < 1:
        sys.exit("error: --steps and --repeats must be at least 1")
    sides = [s for s in args.sides.split(",") if s != "before" or args.engine_path]
    unknown = set(sides) - {"engine", "engine-eager", "before", "hf-static", "hf-eager"}
    if unknown or "engine" not in sides:
        sys.exit(f"error: --sides takes engine (required), engine-eager, before, hf-static and hf-eager; "
                 f"not {unknown}")  # fmt: skip
    if args.engine_path and not (Path(args.engine_path) / "reference_trainer").is_dir():
        sys.exit(f"error: --engine-path {args.engine_path} holds no reference_trainer/ (an rlbench checkout)")
    shape = SMOLLM2_SHAPE if args.shape == "smollm2" else TINY_SHAPE
    info = record(args.device)
    print(info)
    cells: dict[int, dict[str, dict[str, Any]]] = {batch: {} for batch in args.batches}

    def write() -> list[dict[str, Any]]:
        """decode_step.json with every cell so far: a run cut off by a time limit keeps what finished."""
        rows = [{**summarise(batch, got), "cells": got} for batch, got in cells.items() if got]
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "decode_step.json", {**info, "shape": args.shape, "steps": args.steps,
                   "repeats": args.repeats, "engine_path": args.engine_path, "rows": rows})  # fmt: skip
        return rows

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        save_model(DecoderLM(shape), Path(tmp) / "model")
        # the engine at every batch first (what the targets are about), then the other sides batch by batch
        for side, batch in [("engine", b) for b in args.batches] + [
            (side, b) for b in args.batches for side in sides if side != "engine"
        ]:
            spec = {"model": str(Path(tmp) / "model"), "device": args.device, "repeats": args.repeats,
                    "prompts": prompts(batch, shape.vocab_size), "lengths": [SHORT, SHORT + args.steps],
                    "threads": args.threads}  # fmt: skip
            cell = cells[batch][side] = run_side(side, spec, args.engine_path)
            if side == "engine" and "step_s" not in cell and "engine-eager" not in sides:  # the fall-back
                cell = cells[batch]["engine-eager"] = run_side("engine-eager", spec, args.engine_path)
            if "step_s" in cell:
                print(
                    f"  batch {batch} {cell['side']}: {cell['step_s'] * 1e3:.3f} ms per decode step",
                    flush=True,
                )
            rows = write()
    print(table(rows))


if __name__ == "__main__":
    main()
