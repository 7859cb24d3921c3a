"""Proof that GRPO learns: reward curves on `arith` and on `kk` (3 people) with the embedded model.

    python benchmarks/learning_curves.py [--tasks arith,kk] [--minutes 10] [--pool 128]

Each task trains from the embedded default model (built on first use) for epochs over a fixed pool of
--pool training prompts (as GRPO runs iterate over a dataset), until --steps or the --minutes budget is
reached. It prints the mean training reward per epoch, and greedy accuracy on 256 held-out problems
before and after training. Results: benchmarks/results/learning_curves.json and runs/learning/<task>/.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_trainer.train.trainer import Trainer  # noqa: E402
from rlbench.records import write_json  # noqa: E402
from rlbench.training import build_config, ensure_default_model  # noqa: E402


class Budget(Exception):
    pass


HELD_OUT_SEED = 999  # never used for training prompts


def held_out_accuracy(trainer: Trainer, n: int = 256) -> float:
    """Greedy accuracy on fresh problems, with a separate engine over the trainer's rollout weights (so the
    training trace stays clean)."""
    from reference_trainer.engine import Engine
    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.model.prompting import encode_prompt

    problems = trainer.task.problems(n, seed=HELD_OUT_SEED)
    engine = Engine(
        trainer.engine.model,
        EngineConfig(max_num_seqs=128, max_model_len=1024),
        eos_token_ids=trainer.tokenizer.eos_token_ids,
    )
    prompts = [encode_prompt(trainer.tokenizer, p.prompt) for p in problems]
    seqs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=trainer.config.max_tokens))
    texts = [trainer.tokenizer.decode(s.response_ids) for s in seqs]
    return sum(trainer.task.is_correct(p, t) for p, t in zip(problems, texts, strict=True)) / n


def train(task: str, steps: int, minutes: float, seed: int, pool: int, out: Path) -> tuple[list[dict], dict]:
    config = build_config(task=task, mode="baseline", steps=steps, seed=seed)
    config.prompt_pool = pool
    trainer = Trainer(config, out)
    held_out = {"before": held_out_accuracy(trainer)}
    start, rows = time.perf_counter(), []

    def on_step(row: dict) -> None:
        rows.append(row)
        print(
            f"{task} step {row['step']:3d} reward {row['reward_mean']:.3f} acc {row['accuracy']:.3f} "
            f"len {row['response_len_mean']:.0f} {row['step_time_s']:.1f}s",
            flush=True,
        )
        if time.perf_counter() - start > minutes * 60:
            raise Budget

    with contextlib.suppress(Budget):  # the time budget ends the run early; finished steps are kept
        trainer.run(on_step)
    held_out["after"] = held_out_accuracy(trainer)
    return rows, held_out


def windows(rows: list[dict], size: int) -> list[dict]:
    out = []
    for lo in range(0, len(rows), size):
        chunk = rows[lo : lo + size]
        out.append(
            {
                "steps": f"{chunk[0]['step']}-{chunk[-1]['step']}",
                "reward": sum(r["reward_mean"] for r in chunk) / len(chunk),
                "accuracy": sum(r["accuracy"] for r in chunk) / len(chunk),
                "minutes": sum(r["step_time_s"] for r in rows[: lo + len(chunk)]) / 60,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="arith,kk")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pool", type=int, default=128, help="training prompts, cycled per epoch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_default_model()
    results = {}
    for task in args.tasks.split(","):
        rows, held_out = train(
            task, args.steps, args.minutes, args.seed, args.pool, Path("runs/learning") / task
        )
        size = max(1, args.pool // 16)  # one epoch: pool / prompts_per_step
        results[task] = {
            "steps": rows,
            "windows": windows(rows, size),
            "held_out_greedy_accuracy": held_out,
            "pool": args.pool,
        }
        print(f"\n{task}: mean training reward per epoch ({size} steps over {args.pool} prompts)")
        print("| steps | reward | accuracy | minutes elapsed |\n|---|---:|---:|---:|")
        for w in results[task]["windows"]:
            print(f"| {w['steps']} | {w['reward']:.3f} | {w['accuracy']:.3f} | {w['minutes']:.1f} |")
        first, last = results[task]["windows"][0]["reward"], results[task]["windows"][-1]["reward"]
        print(
            f"first epoch {first:.3f}; last epoch {last:.3f}; held-out greedy accuracy "
            f"{held_out['before']:.3f} -> {held_out['after']:.3f}"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    write_json(out / "learning_curves.json", results)


if __name__ == "__main__":
    main()
