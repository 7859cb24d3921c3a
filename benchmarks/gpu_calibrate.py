"""A model shape's GPU calibration (rlbench/simulate/calibration.py), measured through the engine's own
forwards and the GRPO updater; the prefill stage and the calibration stage of benchmarks/gpu_run.py:

    python -m benchmarks.gpu_calibrate --terms prefill --models smollm2,embedded --out DIR
    python -m benchmarks.gpu_calibrate --terms decode,verify,update --models smollm2,embedded --out DIR
                                       [--device cuda|cpu] [--repeats 3] [--quick]

- prefill: t_prefill, one admission forward of 1, 16 and 128 new sequences x 64 and 256 prompt tokens each
  (`time_prefill`), written to DIR/prefill/<model>.json as each cell finishes;
- decode: the engine's own decode step (`time_engine_step`: forward, sampling, read-back and its host work)
  over 1, 16, 64, 128 and 256 running sequences at about 256 cached tokens;
- verify: `Engine.time_forwards` at those rows x widths 1, 2, 4, 8 and 16 (1 + drafts) continuing 256 cached
  tokens, each width as a multiple of the decode forward over as many rows (CUDA graphs on CUDA);
- update: one GRPO update (fp32 policy, the trainer's defaults) of synthetic batches of 16 x 128, 64 x 128 and
  64 x 256 tokens, the fastest of --repeats after a warm-up.
After each term DIR/<gpu>-<model>.json is rewritten (`write_calibration`), the prefill table of an earlier
`--terms prefill` run in DIR folded in and whatever is missing swept, so a run cut off keeps what finished.
Models: `smollm2` (SmolLM2-135M's shape, random weights: its speed is the real model's), `embedded` (the
shipped weights), `tiny` (a toy shape: `--device cpu --models tiny` is the rehearsal, tests/test_gpu_run.py).
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_step import TINY_SHAPE, record
from benchmarks.gpu import SMOLLM2_SHAPE
from benchmarks.update_speed import synthetic_batch
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.fingerprint import engine_fingerprint
from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.engine.timing import PROBE_TOKEN, synchronize
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.embedded import default_model_dir, label
from reference_trainer.model.loader import load_model, resolve_threads, save_model
from reference_trainer.trace.records import make_dir, read_json, write_json
from reference_trainer.train.config import GRPOConfig
from reference_trainer.train.grpo import GRPOUpdater
from rlbench.simulate.calibration import SHAPE_KEYS, Calibration, fit_update, model_shape, write_calibration


@dataclass(frozen=True)
class Sizes:
    prefill_rows: tuple[int, ...] = (1, 16, 128)
    prefill_tokens: tuple[int, ...] = (64, 256)
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # every batch bucket a run's decode takes
    admitted_tokens: tuple[int, ...] = (32, 256)  # tokens of one admission riding in a decode step
    widths: tuple[int, ...] = (1, 2, 4, 8, 16)
    context: int = 256
    steps: int = 16  # engine steps per timed run
    update_batches: tuple[tuple[int, int], ...] = ((16, 128), (64, 128), (64, 256))  # sequences x tokens


QUICK = Sizes((1, 4), (16, 32), (1, 4), (8,), (1, 2), 32, 4, ((2, 16), (4, 16)))  # --quick: the CPU rehearsal
MODELS = {"smollm2": "smollm2-135m", "embedded": "embedded", "tiny": "tiny"}  # --models -> preset name
NOTES = [
    "decode: the engine's own decode step (time_engine_step: forward, sampling, read-back, host work)",
    "verify: forwards timed by the runner (Engine.time_forwards), as a multiple of its decode forward",
    "prefill: the runner's prefill forward alone (time_prefill), not the admission's sampling and uploads",
    "update: one GRPO update of synthetic batches (fp32 policy, the trainer's defaults)",
]


def gpu_name(device: str) -> str:
    """The preset name of a device ("NVIDIA H200" -> h200; the CPU: cpu)."""
    if device == "cpu":
        return "cpu"
    found = re.search(r"\b([a-z]\d{2,3})\b", device.lower())
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def time_engine_step(
    engine: Engine, rows: int, context: int, steps: int, repeats: int
) -> tuple[float, float]:
    """Seconds of one engine decode step over `rows` running sequences of about `context` cached tokens:
    `steps` calls of `Engine.step` once every sequence is admitted, the fastest of `repeats` such runs after
    a warm-up run. Each step reads its tokens back, so it ends when the device is done. With it, the host CPU
    seconds per step of the timed runs outside the forwards (the engine's bookkeeping, sampling parameters
    and uploads: its host clock's parts, engine/hostclock.py)."""
    budget = (repeats + 1) * steps + 8
    for i in range(rows):
        params = SamplingParams(temperature=1.0, max_tokens=budget, ignore_eos=True, seed=i)
        engine.add_request(Request([PROBE_TOKEN] * context, params))
    while engine.waiting:
        engine.step()
    engine.step()  # the step the last admissions rode in, or their first decode: not timed
    times = []
    before = engine.host_clock.snapshot()
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        times.append((time.perf_counter() - start) / steps)
    added = engine.host_clock.since(before)
    engine.close()  # abort them: their slots free for the next cell
    return min(times[1:]), (added["engine"] + added["sampling"]) / ((repeats + 1) * steps)


@torch.inference_mode()
def time_prefill(engine: Engine, rows: int, tokens: int, repeats: int) -> float:
    """Seconds of one admission forward of `rows` new sequences of `tokens` prompt tokens each: the fastest
    of `repeats` after a warm-up, through the runner's own prefill on probe sequences in free slots (as
    reference_trainer/engine/timing.py times decode and verify). The forward only: the admission's sampling
    and uploads are not in it. The one place to point at the engine's own admission timing."""
    probes = [Sequence(f"prefill-probe-{i}", [PROBE_TOKEN] * tokens, SamplingParams()) for i in range(rows)]
    for probe in probes:
        probe.slot = engine.slots.allocate()
    times = []
    try:
        for _ in range(repeats + 1):  # the first run warms up
            for probe in probes:
                probe.num_cached = 0
            synchronize(engine.runner.device)
            start = time.perf_counter()
            engine.runner.prefill(probes)
            synchronize(engine.runner.device)
            times.append(time.perf_counter() - start)
    finally:
        for probe in probes:
            engine.slots.release(probe.slot)  # type: ignore[arg-type]
    return min(times[1:])


def time_update(
    model_dir: Path, device: str, batches: tuple[tuple[int, int], ...], repeats: int
) -> list[tuple[float, float]]:
    """(tokens, seconds) of one GRPO update per (sequences, tokens each) batch."""
    policy = load_model(model_dir, device=device, dtype="float32")
    points = []
    for sequences, length in batches:
        batch = synthetic_batch(policy.config.vocab_size, sequences, length)
        updater = GRPOUpdater(policy, GRPOConfig(lr=1e-6))
        times = []
        for _ in range(repeats + 1):  # the first run warms up (allocator, kernels, autocast)
            synchronize(torch.device(device))
            start = time.perf_counter()
            updater.update(batch)
            synchronize(torch.device(device))
            times.append(time.perf_counter() - start)
        points.append((float(sequences * length), min(times[1:])))
        print(f"  update {sequences} x {length} tokens: {1e3 * points[-1][1]:.1f} ms", flush=True)
    return points


def model_dir(model: str, tmp: Path) -> tuple[Path, str]:
    """The model's directory and label (random weights for the shapes, written into `tmp`)."""
    if model == "embedded":
        return default_model_dir(), label()
    torch.manual_seed(0)
    shape = SMOLLM2_SHAPE if model == "smollm2" else TINY_SHAPE
    save_model(DecoderLM(shape), tmp / model)
    return tmp / model, "SmolLM2-135M shape, random weights" if model == "smollm2" else "tiny shape"


def calibrate(
    model: str, terms: set[str], out: Path, device: str, sizes: Sizes, repeats: int, info: dict[str, Any]
) -> None:
    name = MODELS[model]
    prefill_path = out / "prefill" / f"{name}.json"
    with tempfile.TemporaryDirectory() as tmp:
        path, model_label = model_dir(model, Path(tmp))
        generated = (repeats + 1) * sizes.steps + 8  # time_engine_step's tokens per sequence
        longest = max(sizes.context + max(sizes.widths, default=1) + generated, max(sizes.prefill_tokens)) + 1
        slots = max(*sizes.rows, *sizes.prefill_rows)
        config = EngineConfig(max_num_seqs=slots, max_model_len=longest, device=device)
        engine = Engine(load_model(path, device=device), config, eos_token_ids=[])
        if "prefill" in terms:
            cells: list[dict[str, Any]] = []
            for rows in sizes.prefill_rows:
                for tokens in sizes.prefill_tokens:
                    seconds = time_prefill(engine, rows, tokens, repeats)
                    cells.append({"rows": rows, "tokens": tokens, "s": seconds})
                    print(f"  {name} prefill {rows} x {tokens}: {1e3 * seconds:.2f} ms", flush=True)
                    write_json(make_dir(prefill_path.parent) / prefill_path.name,
                               {**info, "model": model_label, "cells": cells})  # fmt: skip
        if not terms & {"decode", "verify", "update"}:
            return
        timed = {b: time_engine_step(engine, b, sizes.context, sizes.steps, repeats) for b in sizes.rows}
        steps, host = {b: s for b, (s, _) in timed.items()}, {b: h for b, (_, h) in timed.items()}
        # What one admission adds to a decode step, in plain decode steps, by admitted tokens and running rows
        # (on CUDA both steps replay graphs: engine/graphs.py, engine/mixed.py).
        by_tokens = {
            t: engine.measure_admission_overhead(batches=sizes.rows, tokens=t, repeats=repeats)
            for t in sizes.admitted_tokens
        }
        admission = by_tokens[min(by_tokens, key=lambda t: abs(t - 32))]  # the gate's: about 32 tokens
        print(
            f"  {name} decode: " + ", ".join(f"{b}: {1e3 * s:.2f} ms" for b, s in steps.items()), flush=True
        )
        table = engine.time_forwards(sizes.rows, sizes.widths, context=sizes.context, repeats=repeats)
        widths: dict[int, dict[int, float]] = {}
        for (b, w), seconds in table.items():  # the engine caps rows and widths at what it holds
            widths.setdefault(b, {})[w] = seconds
        prefill = None
        if prefill_path.is_file():  # an earlier prefill stage of this run
            prefill = {}
            for cell in read_json(prefill_path)["cells"]:
                prefill.setdefault(cell["rows"], {})[cell["tokens"]] = cell["s"]
        measured = Calibration(
            gpu=gpu_name(str(info["device"])), model=name, model_label=model_label,
            shape={k: v for k, v in (model_shape(path) or {}).items() if k in SHAPE_KEYS},
            provenance={**info, "driver": info.get("driver") or "none (CPU)", "engine": engine_fingerprint(),
                        "command": "python -m benchmarks.gpu_calibrate " + " ".join(sys.argv[1:])},
            context=sizes.context, decode=steps,
            verify={b: {w: s / ws[1] for w, s in ws.items()} for b, ws in widths.items()}, prefill=prefill,
            notes=NOTES, decode_scope="engine_step",
            host={"s_per_step": max(statistics.median(host.values()), 1e-9),
                  "by_rows": {str(b): h for b, h in host.items()}},
            admission_overhead=admission, admission_overhead_by_tokens=by_tokens,
        )  # fmt: skip
        print(f"  wrote {write_calibration(out, measured)}", flush=True)
        if "update" in terms:
            del engine  # its KV pool, before the policy and its optimizer state take their memory
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            points = time_update(path, device, sizes.update_batches, repeats)
            measured = replace(measured, update=fit_update(points))
            print(f"  wrote {write_calibration(out, measured)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", default="prefill,decode,verify,update")
    parser.add_argument("--models", default="smollm2,embedded")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes: the CPU rehearsal")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    terms, models = set(args.terms.split(",")), args.models.split(",")
    if unknown := sorted(terms - {"prefill", "decode", "verify", "update"}) + sorted(
        set(models) - set(MODELS)
    ):
        sys.exit(f"error: --terms takes prefill, decode, verify, update; --models {', '.join(MODELS)}; "
                 f"not {', '.join(unknown)}")  # fmt: skip
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda needs a CUDA GPU (--device cpu --models tiny is the rehearsal)")
    make_dir(args.out)
    if args.device == "cpu":
        torch.set_num_threads(resolve_threads(None))  # the trainer's: more threads than free cores stall
    info = record(args.device)
    print(info, flush=True)
    if not info.get("commit"):  # a calibration names what it measured: checked before anything is timed
        sys.exit("error: no commit to name: set RLBENCH_COMMIT (a copied tree has no git history)")
    for model in models:
        calibrate(model, terms, args.out, args.device, QUICK if args.quick else Sizes(), args.repeats, info)


if __name__ == "__main__":
    main()
