"""The embedded model's recipe: architecture, SFT data and schedule. `rlbench embedded build` runs it.

The SFT data mixes a careful demonstrator (the work, then the answer; its traces slip now and then) and a
lazy one (a guess at once) whose share grows with the problem's size, so that correct answers are in the
sampling distribution while greedy decoding guesses on large problems: something for RL to find. Why, and
what it measures: docs/embedded-model.md, "Why the SFT data mixes two demonstrators".
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reference_trainer.model.config import ModelConfig
from reference_trainer.model.prompting import encode_prompt, encode_response
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.tasks import get_task
from reference_trainer.tasks.arith import MAX_VALUE
from reference_trainer.tasks.base import ANSWER_MARKER, Problem
from reference_trainer.tasks.kk_answers import format_assignment
from reference_trainer.train.sft import SFTConfig

RECIPE_VERSION = 4


@dataclass(frozen=True)
class Recipe:
    model: ModelConfig
    sft: SFTConfig
    # (task name, constructor kwargs, share of SFT examples)
    mix: tuple[tuple[str, tuple[tuple[str, object], ...], float], ...]
    # lazy share by problem size: {task: (size at which it starts, growth per unit of size, cap)}
    lazy: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    data_seed: int = 1_000_000  # SFT prompts come from a seed no RL run or held-out set uses


RECIPE = Recipe(
    model=ModelConfig(
        vocab_size=99,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=1536,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    sft=SFTConfig(steps=4000, batch_size=20, lr=4e-3, warmup=50, seed=0),
    # 3-person kk puzzles drawn three times as often as 2-person ones: their search (the longest trace,
    # with role lookups on later candidates) is what the model learns last
    mix=(("arith", (), 0.4), ("kk", (("num_people", (2, 3)),), 0.3), ("kk", (("num_people", 3),), 0.3)),
    # kk guesses on 42% of 3-person puzzles (recipe v3: 50%). The model's first token leans to the guess
    # more often than its data does: at 50% greedy guessed on 84% of held-out puzzles (accuracy 10%), at
    # 46% on 73% (13%). At 38% greedy worked on 86% and started so high (31%) that RL, which ends near the
    # work's own accuracy, lifted it by only 7 points (benchmarks/work_or_guess.py, docs/embedded-model.md)
    lazy={"arith": (2, 0.2, 0.8), "kk": (2, 0.32, 0.6)},
)


# What the card (`rlbench embedded build`, train/heldout.py policy_card) must show on held-out problems of
# every task: (card key, lowest, highest), and the two that are not single values.
CARD_TARGETS: tuple[tuple[str, float, float], ...] = (
    ("greedy_acc", 0.15, 0.50),  # room to learn, and something to start from
    ("median_top_prob", 0.95, 1.0),  # near-deterministic text, uncertainty at the decision tokens
)
PASS8_OVER_PASS1 = 0.25  # correct answers are in the sampling distribution for RL to amplify
ARITH_P99_OVER_P50 = 4.0  # heavy-tailed lengths, so the bubble is real


def card_misses(tasks: dict[str, dict[str, float]]) -> list[str]:
    """The targets a measured card (task -> policy_card) misses, one line each; empty when all are met."""
    misses = []
    for task, card in tasks.items():
        for key, low, high in CARD_TARGETS:
            if not low <= card[key] <= high:
                misses.append(f"{task} {key} {card[key]:.3f} outside [{low}, {high}]")
        if card["pass8_t1"] - card["pass1_t1"] < PASS8_OVER_PASS1:
            misses.append(
                f"{task} pass@8 - pass@1 {card['pass8_t1'] - card['pass1_t1']:.3f} < {PASS8_OVER_PASS1}"
            )
    arith = tasks.get("arith")
    if arith is not None and arith["len_p99_over_p50"] < ARITH_P99_OVER_P50:
        misses.append(f"arith length p99/p50 {arith['len_p99_over_p50']:.1f} < {ARITH_P99_OVER_P50}")
    return misses


def lazy_share(recipe: Recipe, task_name: str, problem: Problem) -> float:
    start, growth, cap = recipe.lazy[task_name]
    size = int(problem.meta["num_ops"] if task_name == "arith" else problem.meta["num_people"])
    return min(cap, 0.1 + growth * (size - start))


def guess_response(task_name: str, problem: Problem, rng: random.Random) -> str:
    if task_name == "arith":
        return f"{ANSWER_MARKER} {rng.randint(0, MAX_VALUE)}"

    names = problem.meta["names"]
    return "\n".join([ANSWER_MARKER, format_assignment(names, [rng.random() < 0.5 for _ in names])])


def build(
    out_dir: Path,
    recipe: Recipe = RECIPE,
    steps: int | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Train the embedded model from scratch by the recipe and save it (config, safetensors, tokenizer)."""
    import torch

    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.train.sft import train_sft

    sft = recipe.sft if steps is None else dataclasses.replace(recipe.sft, steps=steps)
    tokenizer = CharTokenizer()
    tasks = [(name, get_task(name, **dict(kwargs)), share) for name, kwargs, share in recipe.mix]
    counter = iter(range(10**9))

    def sample_batch(rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
        rows = []
        for _ in range(n):
            name, task, _ = rng.choices(tasks, weights=[s for _, _, s in tasks])[0]
            problem = task.problems(1, seed=recipe.data_seed, start=next(counter))[0]
            if rng.random() < lazy_share(recipe, name, problem):
                response = guess_response(name, problem, rng)
            else:
                response = task.sft_response(problem, rng)
            rows.append((encode_prompt(tokenizer, problem.prompt), encode_response(tokenizer, response)))
        return rows

    torch.manual_seed(sft.seed)
    model = DecoderLM(recipe.model)
    train_sft(
        model, sample_batch, sft, None if on_step is None else lambda s, loss: on_step(s, sft.steps, loss)
    )
    save_model(model, out_dir)
    tokenizer.save(out_dir)
    return out_dir
