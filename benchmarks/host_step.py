"""Host work per decode step: the engine's step with the model's forward and the sampler replaced by
nothing, so what is timed is what runs on the CPU in series with a GPU (scheduling, the step's input lists
and upload, the read-back, appending tokens and the stop rules, the trace event), per batch size, against
another checkout's engine in the same run, interleaved.

    python -m benchmarks.host_step [--before CHECKOUT] [--path graph|eager] [--batches 1,64,256]
                                   [--steps 200] [--repeats 5] [--out FILE]

--path graph (the default) times the path a GPU takes with CUDA graphs (runner.decode into the static
forward, graphs.py, with its replay replaced by nothing); --path eager the own-shape forward a CPU (or a
GPU without graphs) takes, whose per-step input tensors (CachedBatch's masks) are the forward's own tensor
work, counted here although a GPU would run it as kernels. Each (side, batch, repeat) runs in a process of
its own (PYTHONPATH = that side's checkout), one thread, on the CPU: B requests are prefilled, then --steps
decode steps are timed and the mean per step reported; the median over repeats, sides alternating within
each repeat so that a change in machine load hits both. The forward returns a preallocated [B, V] logits
tensor and the sampler preallocated tokens, so the per-step cost does not depend on the model. Target
(issue 49): at most 0.06 / 0.15 / 0.4 ms at batch 1 / 64 / 256 on an idle CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = {1: 0.06, 64: 0.15, 256: 0.4}

# The side's own process: only the engine API every checkout since d990e15 shares.
CHILD = r"""
import json, sys, time, torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
from reference_trainer.engine import engine as engine_module
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM

batch, steps = spec["batch"], spec["steps"]
config = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
model = DecoderLM(config)
engine = Engine(model, EngineConfig(max_num_seqs=batch, max_model_len=steps + 64), eos_token_ids=[])
logits = torch.zeros(batch * 32, config.vocab_size)
tokens, logprobs = torch.full((batch,), 5), torch.zeros(batch)

def forward_cached(ids, *args, select=None, **kwargs):
    width = 1 if select is not None else ids.shape[1]
    return logits[: ids.shape[0] * width].view(ids.shape[0], width, -1)

model.forward_cached = forward_cached
engine_module.sample = lambda scored_logits, batch_params: (tokens[: scored_logits.shape[0]],
                                                             logprobs[: scored_logits.shape[0]])
if spec["path"] == "graph":  # the static forward a GPU replays as a graph, run as nothing
    from reference_trainer.engine.graphs import StaticForward
    static = StaticForward(model, engine.slots, engine.config.max_verify_tokens, False, "matmul",
                           sampling=engine.sampling)
    static._forward = lambda *args: None
    engine.runner.static = static
params = SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=True, seed=0)
try:  # this checkout's request record; a checkout from before it took the request's fields
    from reference_trainer.engine.sequence import Request
    submit = lambda ids: engine.add_request(Request(ids, params))
except ImportError:
    submit = lambda ids: engine.add_request(ids, params)
for i in range(batch):
    submit([1] + [3 + i % 50] * 16)
engine.step()  # prefill
for _ in range(5):
    engine.step()  # warm
start = time.perf_counter()
for _ in range(steps):
    engine.step()
print(json.dumps({"ms": (time.perf_counter() - start) / steps * 1e3}))
"""


def run_side(path: Path, batch: int, steps: int, engine_path: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    spec = json.dumps({"batch": batch, "steps": steps, "path": engine_path})
    done = subprocess.run(
        [sys.executable, "-c", CHILD, spec], env=env, capture_output=True, text=True, check=False, cwd=path
    )  # in the side's checkout: `python -c` imports from the working directory before PYTHONPATH
    if done.returncode != 0:
        raise SystemExit(f"error: the engine of {path} failed at batch {batch}:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, help="another checkout (e.g. `git worktree add ../before HEAD~1`)"
    )
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument(
        "--path", choices=("graph", "eager"), default="graph",
        help="graph: the static forward a GPU replays (the default there); eager: the own-shape forward",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.before is not None and not (args.before / "reference_trainer").is_dir():
        sys.exit(f"error: --before {args.before} holds no reference_trainer/ (an rlbench checkout)")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        sys.exit(f"error: --batches wants comma-separated integers, got {args.batches!r}")
    sides = {"engine": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    runs: dict[str, dict[int, list[float]]] = {side: {b: [] for b in batches} for side in sides}
    for repeat in range(args.repeats):
        for batch in batches:
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))  # alternate who goes first
            for side in order:
                runs[side][batch].append(run_side(sides[side], batch, args.steps, args.path))
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    rows: list[dict[str, Any]] = []
    print("| batch | engine ms/step | before ms/step | before / engine | target |")
    print("|---:|---:|---:|---:|---:|")
    for batch in batches:
        row: dict[str, Any] = {"batch": batch, "target_ms": TARGET_MS.get(batch)}
        for side in sides:
            row[side] = {"median_ms": statistics.median(runs[side][batch]), "runs_ms": runs[side][batch]}
        ratio = row["before"]["median_ms"] / row["engine"]["median_ms"] if "before" in row else None
        row["before_over_engine"] = ratio
        before = f"{row['before']['median_ms']:.3f}" if "before" in row else ""
        print(f"| {batch} | {row['engine']['median_ms']:.3f} | {before} | "
              f"{'' if ratio is None else f'{ratio:.2f}x'} | {row['target_ms'] or ''} |")  # fmt: skip
        rows.append(row)
    if args.out:
        from reference_trainer.trace.records import write_json
        from rlbench.reproduce.runner import source_commit

        write_json(args.out, {"command": " ".join(["python -m benchmarks.host_step", *sys.argv[1:]]),
                              "commit": source_commit(), "before": str(args.before) if args.before else None,
                              "path": args.path,
                              "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                              "steps": args.steps, "repeats": args.repeats, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
