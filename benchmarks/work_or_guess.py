"""The embedded model's first decision: work the problem out, or guess at once.

    python -m benchmarks.work_or_guess [--model DIR] [--problems 128] [--out FILE]

The recipe's lazy demonstrator answers at once (`answer:` first); the careful one starts its work
(train/recipe.py). So the first response token decides whether a response works or guesses, and greedy
accuracy is set by where that decision falls. On held-out problems of each task, as RL runs use them,
this measures: the model's probability of the first work token and of the guess (`a`) after the prompt,
the share of problems on which greedy decoding works, greedy accuracy, and greedy accuracy with the first
token forced to the work's (what greedy would score if it always worked). Prints a table and writes
JSON (default benchmarks/results/work_or_guess.json).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import torch

from benchmarks.common import resolve_model
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.loader import load_model
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.tasks import (
    RUN_TASK_OPTIONS,
    get_task,
)
from reference_trainer.tasks.base import ANSWER_MARKER
from reference_trainer.trace.records import write_json
from reference_trainer.train.heldout import held_out_problems


def measure(model, tokenizer, task_name: str, options: dict, n: int) -> dict:
    task = get_task(task_name, **options)
    problems = held_out_problems(task, n)
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
    # the careful demonstrator's first character opens the work (deterministic: its slips come later)
    work_first = [tokenizer.encode(task.sft_response(p, random.Random(0))[:1])[-1] for p in problems]
    guess_first = tokenizer.encode(ANSWER_MARKER[:1])[-1]
    p_work, p_guess = [], []
    with torch.no_grad():
        for prompt, work in zip(prompts, work_first, strict=True):
            probs = torch.softmax(model(torch.tensor([prompt]))[0, -1].float(), dim=-1)
            p_work.append(float(probs[work]))
            p_guess.append(float(probs[guess_first]))
    engine = Engine(model, EngineConfig(max_num_seqs=n, max_model_len=model.config.max_position_embeddings),
                    eos_token_ids=tokenizer.eos_token_ids)  # fmt: skip
    greedy = [SamplingParams(temperature=0.0, max_tokens=task.max_response_tokens) for _ in problems]
    plain = [tokenizer.decode(s.response_ids) for s in engine.generate(prompts, greedy)]
    forced_seqs = engine.generate([p + [w] for p, w in zip(prompts, work_first, strict=True)], greedy)
    forced = [tokenizer.decode([w, *s.response_ids]) for w, s in zip(work_first, forced_seqs, strict=True)]

    def accuracy(texts: list[str]) -> float:
        return sum(task.is_correct(p, t) for p, t in zip(problems, texts, strict=True)) / len(problems)

    return {
        "task": task_name,
        "options": options,
        "problems": n,
        "p_work_median": statistics.median(p_work),
        "p_guess_median": statistics.median(p_guess),
        "greedy_works_share": sum(not t.startswith(ANSWER_MARKER) for t in plain) / n,
        "greedy_acc": accuracy(plain),
        "greedy_acc_forced_work": accuracy(forced),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory or name; default: the embedded model")
    parser.add_argument("--problems", type=int, default=128, help="held-out problems per task")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "work_or_guess.json")
    args = parser.parse_args()
    path, label = resolve_model(args.model)
    model, tokenizer = load_model(path).eval(), load_tokenizer(path)
    rows = [measure(model, tokenizer, name, o, args.problems) for name, o in RUN_TASK_OPTIONS.items()]
    print(f"{label}: {path}")
    print("| task | P(work first), median | P(guess first), median | greedy works on | greedy accuracy "
          "| greedy accuracy, work forced |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for r in rows:
        print(
            f"| {r['task']} | {r['p_work_median']:.3f} | {r['p_guess_median']:.3f} "
            f"| {r['greedy_works_share']:.1%} | {r['greedy_acc']:.3f} | {r['greedy_acc_forced_work']:.3f} |"
        )
    write_json(args.out, {"model": label, "torch": torch.__version__, "tasks": rows})


if __name__ == "__main__":
    main()
