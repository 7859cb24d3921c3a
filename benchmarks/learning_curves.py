"""Proof that GRPO learns: reward curves on `arith` and on `kk` (3 people) with the embedded model.

    python benchmarks/learning_curves.py [--tasks arith,kk] [--minutes 15] [--steps 200]

Each task trains from the embedded default model (built on first use) until --steps or the --minutes
budget is reached, whichever comes first. The script prints the mean reward over windows of steps and
writes benchmarks/results/learning_curves.json, plus the run directories under runs/learning/.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_trainer.atomic import write_json  # noqa: E402
from reference_trainer.trainer import Trainer  # noqa: E402
from rlbench.training import build_config, ensure_default_model  # noqa: E402


class Budget(Exception):
    pass


def train(task: str, steps: int, minutes: float, seed: int, out: Path) -> list[dict]:
    config = build_config(task=task, mode="baseline", steps=steps, seed=seed)
    trainer = Trainer(config, out)
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
    return rows


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
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_default_model()
    results = {}
    for task in args.tasks.split(","):
        rows = train(task, args.steps, args.minutes, args.seed, Path("runs/learning") / task)
        size = max(1, len(rows) // 8)
        results[task] = {"steps": rows, "windows": windows(rows, size)}
        print(f"\n{task}: mean reward per window of {size} steps")
        print("| steps | reward | accuracy | minutes elapsed |\n|---|---:|---:|---:|")
        for w in results[task]["windows"]:
            print(f"| {w['steps']} | {w['reward']:.3f} | {w['accuracy']:.3f} | {w['minutes']:.1f} |")
        last = results[task]["windows"][-1]["reward"]
        print(f"step 0 reward {rows[0]['reward_mean']:.3f}; last window {last:.3f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    write_json(out / "learning_curves.json", results)


if __name__ == "__main__":
    main()
