"""The acceptance an oracle one-token drafter would get: the policy's mean top-token probability.

    python -m benchmarks.acceptance_ceiling [--prompts 16] [--samples 8] [--max-tokens 400]

With the exact point-mass rule a draft token d is accepted with probability p(d), so no drafter can beat
E[max_t p(t)] per token on the model's own rollouts. Samples `--prompts` arith prompts x `--samples` at
T=1 and T=0.6, recomputes every response position's distribution with a full forward, and prints the mean
top-token probability and the mean probability of the sampled token (= sum p^2: what an independent
sample from the same policy, used as a draft, would get).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import resolve_model
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.loader import load_model
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir, label = resolve_model(args.model)
    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
    problems = get_task("arith").problems(args.prompts, seed=0, start=0)
    print(f"model: {label}; {args.prompts} arith prompts x {args.samples} samples")
    print("| temperature | tokens | mean top-token p (oracle acceptance) | mean p(sampled) |")
    print("|---:|---:|---:|---:|")
    for temperature in (1.0, 0.6):
        engine = Engine(
            load_model(model_dir), EngineConfig(max_num_seqs=128), tokenizer.eos_token_ids, tokenizer
        )
        prompts, params = [], []
        for i, problem in enumerate(problems):
            for k in range(args.samples):
                prompts.append(encode_prompt(tokenizer, problem.prompt))
                params.append(
                    SamplingParams(temperature=temperature, max_tokens=args.max_tokens, seed=i * 100 + k)
                )
        top = sampled = count = 0.0
        with torch.no_grad():
            for seq in engine.generate(prompts, params):
                ids = torch.tensor([seq.prompt_ids + seq.response_ids])
                probs = (model(ids)[0, len(seq.prompt_ids) - 1 : -1].float() / temperature).softmax(-1)
                top += probs.max(-1).values.sum().item()
                sampled += probs[torch.arange(probs.shape[0]), torch.tensor(seq.response_ids)].sum().item()
                count += probs.shape[0]
        print(f"| {temperature} | {count:.0f} | {top / count:.3f} | {sampled / count:.3f} |")


if __name__ == "__main__":
    main()
