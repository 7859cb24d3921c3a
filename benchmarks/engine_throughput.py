"""rlbench's engine vs transformers' generate: same weights, same 64 prompts, sampling, equal max tokens.

    python benchmarks/engine_throughput.py [--model DIR] [--prompts 64] [--max-tokens 256] [--repeats 3]

Both sides generate exactly max_tokens per prompt (EOS ignored), so tokens/s compare like for like. The
model is the embedded default when it is built, else a random model of the same shape. Prints a table and
writes benchmarks/results/engine_throughput.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_trainer.atomic import write_json  # noqa: E402
from reference_trainer.config import EngineConfig, SamplingParams  # noqa: E402
from reference_trainer.embedded import MODEL_CONFIG, default_model_dir  # noqa: E402
from reference_trainer.engine import Engine  # noqa: E402
from reference_trainer.loader import load_model, save_model  # noqa: E402
from reference_trainer.model import DecoderLM  # noqa: E402
from reference_trainer.prompting import encode_prompt  # noqa: E402
from reference_trainer.tasks import get_task  # noqa: E402
from reference_trainer.tokenizer import CharTokenizer  # noqa: E402


def model_dir(arg: str | None) -> tuple[Path, str]:
    if arg:
        return Path(arg), arg
    embedded = default_model_dir(build=False)
    if (embedded / "config.json").is_file():
        return embedded, "embedded default model"
    path = Path(tempfile.mkdtemp()) / "random"
    torch.manual_seed(0)
    save_model(DecoderLM(MODEL_CONFIG), path)
    CharTokenizer().save(path)
    return path, "random model with the embedded shape (embedded model not built yet)"


def run_rlbench(path: Path, prompts: list[list[int]], max_tokens: int) -> float:
    model = load_model(path)
    engine = Engine(model, EngineConfig(max_num_seqs=len(prompts), max_model_len=max_tokens + 256))
    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i)
        for i in range(len(prompts))
    ]
    start = time.perf_counter()
    seqs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(s.response_ids) == max_tokens for s in seqs)
    return len(prompts) * max_tokens / elapsed


def run_transformers(path: Path, prompts: list[list[int]], max_tokens: int) -> float:
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
            min_new_tokens=max_tokens,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    assert out.shape[1] - width == max_tokens
    return len(prompts) * max_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path, label = model_dir(args.model)
    tokenizer = CharTokenizer()
    task = get_task("arith")
    prompts = [encode_prompt(tokenizer, p.prompt) for p in task.problems(args.prompts, seed=123)]
    results: dict[str, list[float]] = {"rlbench": [], "transformers": []}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both sides alike
        results["rlbench"].append(run_rlbench(path, prompts, args.max_tokens))
        results["transformers"].append(run_transformers(path, prompts, args.max_tokens))
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["rlbench"] / med["transformers"]
    print(
        f"model: {label}; {args.prompts} prompts x {args.max_tokens} tokens, sampling T=1, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print("| engine | tokens/s (median) | runs |\n|---|---:|---|")
    for name in ("rlbench", "transformers"):
        runs = ", ".join(f"{v:,.0f}" for v in results[name])
        print(f"| {name} | {med[name]:,.0f} | {runs} |")
    print(f"| **ratio** | **{ratio:.2f}x** | target >= 5x |")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    write_json(
        out / "engine_throughput.json",
        {
            "model": label,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "runs": results,
            "median_tokens_per_s": med,
            "ratio": ratio,
        },
    )


if __name__ == "__main__":
    main()
