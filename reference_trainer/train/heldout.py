"""Held-out evaluation: how good a policy is on prompts it never trained on.

The trainer calls `HeldOut.evaluate` at step 0 and every `eval_every` steps (`val/heldout_greedy_acc`,
`val/heldout_pass1`); the embedded model's recipe uses `policy_card` to check its targets. Both decode with
their own engine over a copy of the weights in the rollout's inference dtype, so the training trace and the
policy's modules stay untouched.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import resolve_dtype
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.tasks.base import Problem, Task
from reference_trainer.train.config import HELD_OUT_SEED


def held_out_problems(task: Task, n: int, training_prompts: Sequence[str] = (), seed: int = HELD_OUT_SEED):
    """n problems of `seed`, skipping any whose prompt text is a training prompt, so the two sets share
    nothing even where short problems of different seeds coincide."""
    excluded, out, index = set(training_prompts), [], 0
    while len(out) < n:
        batch = task.problems(n, seed=seed, start=index)
        out.extend(p for p in batch if p.prompt not in excluded)
        index += n
    return out[:n]


def check_disjoint(held_out: Sequence[Problem], training_prompts: Sequence[str]) -> None:
    shared = {p.prompt for p in held_out} & set(training_prompts)
    if shared:
        raise ValueError(
            f"the held-out set shares {len(shared)} prompt(s) with the training pool; held-out accuracy "
            "would measure memorisation"
        )


@dataclass
class Decoded:
    texts: list[str]
    correct: list[bool]
    response_ids: list[list[int]]


class HeldOut:
    """A fixed held-out set decoded by a private engine whose weights follow the policy on each call."""

    def __init__(
        self,
        policy: DecoderLM,
        tokenizer: Any,
        task: Task,
        problems: list[Problem],
        max_tokens: int,
        max_model_len: int = 2048,  # capped by the model's context
        max_num_seqs: int = 128,
    ) -> None:
        self.policy, self.tokenizer, self.task, self.problems = policy, tokenizer, task, problems
        self.max_tokens = max_tokens
        self.prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
        device = next(policy.parameters()).device
        # In the rollout engine's inference dtype (rollout/engines.py makes its copy the same way) and at
        # its sizes (the trainer passes its max_num_seqs and max_model_len): then every static shape this
        # engine takes is one the rollout engine compiled, and on CUDA compiled flex reuses those compiles
        # instead of adding one per batch bucket (an fp32 copy added 8 to the compare's 8).
        model = copy.deepcopy(policy).requires_grad_(False).to(resolve_dtype("auto", device))
        config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, device=str(device))
        self.engine = Engine(model, config, eos_token_ids=tokenizer.eos_token_ids)

    def decode(self, temperature: float, samples: int = 1, seed: int = 0) -> Decoded:
        self.engine.update_weights(self.policy.state_dict())
        prompts, params, problems = [], [], []
        for i, (problem, prompt) in enumerate(zip(self.problems, self.prompts, strict=True)):
            for j in range(samples):
                prompts.append(prompt)
                problems.append(problem)
                draw = seed * 1_000_003 + i * 97 + j
                params.append(SamplingParams(temperature=temperature, max_tokens=self.max_tokens, seed=draw))
        seqs = self.engine.generate(prompts, params)
        texts = [self.tokenizer.decode(s.response_ids) for s in seqs]
        correct = [self.task.is_correct(p, t) for p, t in zip(problems, texts, strict=True)]
        return Decoded(texts, correct, [list(s.response_ids) for s in seqs])

    def evaluate(self, temperature: float, samples: int = 4, seed: int = 0) -> dict[str, float]:
        """Greedy accuracy, and pass@1 at `temperature` (mean over `samples` draws per problem)."""
        greedy = self.decode(0.0)
        sampled = self.decode(temperature, samples, seed)
        return {
            "val/heldout_greedy_acc": sum(greedy.correct) / len(greedy.correct),
            "val/heldout_pass1": sum(sampled.correct) / len(sampled.correct),
        }


def pass_at_k(correct: list[bool], samples: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) averaged over problems, from `samples` draws per problem."""
    total = 0.0
    groups = [correct[i : i + samples] for i in range(0, len(correct), samples)]
    for group in groups:
        c = sum(group)
        total += 1.0 - (comb(samples - c, k) / comb(samples, k) if samples - c >= k else 0.0)
    return total / len(groups)


@torch.no_grad()
def top_token_probs(model: DecoderLM, prompts: list[list[int]], responses: list[list[int]]) -> list[float]:
    """The probability of the most likely token at each response position (temperature 1)."""
    out: list[float] = []
    for prompt, response in zip(prompts, responses, strict=True):
        if not response:
            continue
        ids = torch.tensor([prompt + response[:-1]])
        probs = torch.softmax(model(ids)[0, len(prompt) - 1 :].float(), dim=-1)
        out.extend(probs.max(dim=-1).values.tolist())
    return out


def policy_card(
    policy: DecoderLM,
    tokenizer: Any,
    task: Task,
    n: int = 128,
    samples: int = 8,
    max_tokens: int | None = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """The recipe's targets on held-out problems: greedy accuracy, pass@1 and pass@k at `temperature` (the
    keys say t1: the recipe's cards are at T = 1), response length quantiles and the median per-token top
    probability at that temperature. max_tokens defaults to the task's response budget."""
    budget = task.max_response_tokens if max_tokens is None else max_tokens
    held = HeldOut(policy, tokenizer, task, held_out_problems(task, n), budget)
    greedy = held.decode(0.0)
    sampled = held.decode(temperature, samples)
    lengths = sorted(len(r) for r in sampled.response_ids)
    first = sampled.response_ids[::samples]
    tops = top_token_probs(held.engine.model, held.prompts, first)
    quantile = statistics.quantiles(lengths, n=100)
    return {
        "greedy_acc": sum(greedy.correct) / n,
        "pass1_t1": sum(sampled.correct) / len(sampled.correct),
        f"pass{samples}_t1": pass_at_k(sampled.correct, samples, samples),
        "len_p50": statistics.median(lengths),
        "len_p99": quantile[98],
        "len_p99_over_p50": quantile[98] / max(1.0, statistics.median(lengths)),
        "median_top_prob": statistics.median(tops),
    }
