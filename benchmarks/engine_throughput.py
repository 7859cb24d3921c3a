"""rlbench's engine vs transformers' generate: same weights, same 64 prompts, sampling, equal max tokens.

    python benchmarks/engine_throughput.py [--model DIR] [--prompts 64] [--max-tokens 256] [--repeats 3]

Two settings, each the median of --repeats interleaved runs:
- fixed length: EOS ignored, both sides generate exactly max_tokens per prompt (raw decode speed);
- rollout: generation stops at EOS (as in RL rollouts); tokens/s counts tokens up to and including each
  row's EOS. transformers' static batch keeps computing finished rows until the longest is done;
  continuous batching drops them. Samples differ between engines (different RNG streams), so token counts
  differ slightly; each side's own count is used.
The model is the embedded default when it is built, else a random model of the same shape. Prints a table
and writes benchmarks/results/engine_throughput.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import resolve_model  # noqa: E402

from reference_trainer.engine import Engine  # noqa: E402
from reference_trainer.engine.config import EngineConfig, SamplingParams  # noqa: E402
from reference_trainer.model.loader import load_model  # noqa: E402
from reference_trainer.model.prompting import encode_prompt  # noqa: E402
from reference_trainer.model.tokenizer import CharTokenizer  # noqa: E402
from reference_trainer.tasks import get_task  # noqa: E402
from rlbench.records import write_json  # noqa: E402


def run_rlbench(path: Path, prompts: list[list[int]], max_tokens: int, eos: bool) -> float:
    model = load_model(path)
    engine = Engine(
        model,
        EngineConfig(max_num_seqs=len(prompts), max_model_len=max_tokens + 256),
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
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding for batched generate
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=0 if eos else max_tokens,
            eos_token_id=CharTokenizer().eos_id,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    generated = out[:, width:]
    if not eos:
        assert generated.shape[1] == max_tokens
        return len(prompts) * max_tokens / elapsed
    eos_id = CharTokenizer().eos_id
    # tokens up to and including each row's first EOS (the rest is padding of a finished row)
    lengths = [
        (row == eos_id).nonzero()[0].item() + 1 if (row == eos_id).any() else len(row) for row in generated
    ]
    return sum(lengths) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path, label = resolve_model(args.model)
    tokenizer = CharTokenizer()
    task = get_task("arith")
    prompts = [encode_prompt(tokenizer, p.prompt) for p in task.problems(args.prompts, seed=123)]
    settings = {"fixed length (EOS ignored)": False, "rollout (stop at EOS)": True}
    results: dict[str, dict[str, list[float]]] = {k: {"rlbench": [], "transformers": []} for k in settings}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both sides alike
        for name, eos in settings.items():
            results[name]["rlbench"].append(run_rlbench(path, prompts, args.max_tokens, eos))
            results[name]["transformers"].append(run_transformers(path, prompts, args.max_tokens, eos))
    print(
        f"model: {label}; {args.prompts} prompts, max {args.max_tokens} new tokens, sampling T=1, "
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
