"""Which task settings are within a model's reach for RL: held-out greedy accuracy and pass@k at the training
temperature, per setting, before any training.

    python -m benchmarks.task_reach --model smollm2-135m-instruct [--problems 128] [--samples 8]
        [--temperature 1.0] [--max-tokens 256] [--setting arith:max_ops=1 ...] [--out FILE]

GRPO learns from groups whose samples disagree: a setting is within reach when greedy decoding already solves
some problems (held-out greedy accuracy >= 5%) and sampling at the training temperature (--temperature; the
trainer's default is 1) solves clearly more
of them (pass@k >= 2x greedy), so correct answers sit in the sampling distribution for RL to amplify. Each
setting is the task in the style the model's tokenizer gets in training (chat for a chat template), on the
trainer's held-out set (train/heldout.py), measured by the embedded model's card function (policy_card).
Prints a table and writes JSON (default benchmarks/results/task_reach_<model>.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from reference_trainer.model.loader import resolve_threads
from reference_trainer.modes import parse_option_pairs
from reference_trainer.tasks import get_task
from reference_trainer.trace.records import write_json
from reference_trainer.train.heldout import policy_card
from rlbench.models import load_model_and_tokenizer

DEFAULT_SETTINGS = (
    "arith:min_ops=1:max_ops=1",
    "arith:min_ops=1:max_ops=2",
    "arith:min_ops=2:max_ops=2",
    "kk:num_people=2",
)
GREEDY_FLOOR = 0.05  # greedy accuracy a setting needs
SAMPLING_GAIN = 2.0  # pass@k over greedy a setting needs


def parse_setting(text: str) -> tuple[str, dict]:
    """ "arith:min_ops=1:max_ops=2" -> ("arith", {"min_ops": 1, "max_ops": 2})."""
    task, *pairs = text.split(":")
    return task, parse_option_pairs(pairs, "--setting")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--setting", action="append", help="TASK[:KEY=VALUE...] (repeatable)")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(resolve_threads(args.threads))
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    model.eval()
    style = "chat" if getattr(tokenizer, "has_chat_template", False) else "compact"
    rows = []
    print(f"model {args.model}; style {style}; {args.problems} held-out problems; T={args.temperature}; "
          f"max_tokens {args.max_tokens}; {torch.get_num_threads()} threads", flush=True)  # fmt: skip
    print("| setting | greedy | pass@1 | pass@k | len p50 | len p99 | within reach | seconds |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for text in args.setting or DEFAULT_SETTINGS:
        name, options = parse_setting(text)
        task = get_task(name, style=style, **options)
        start = time.perf_counter()
        card = policy_card(
            model, tokenizer, task, args.problems, args.samples, args.max_tokens, args.temperature
        )
        greedy, pass_k = card["greedy_acc"], card[f"pass{args.samples}_t1"]
        reach = greedy >= GREEDY_FLOOR and pass_k >= SAMPLING_GAIN * greedy
        row = {"setting": text, **card, "within_reach": reach, "seconds": time.perf_counter() - start}
        rows.append(row)
        print(
            f"| {text} | {greedy:.3f} | {card['pass1_t1']:.3f} | {pass_k:.3f} | {card['len_p50']:.0f} | "
            f"{card['len_p99']:.0f} | {'yes' if reach else 'no'} | {row['seconds']:.0f} |",
            flush=True,
        )
    name = f"task_reach_{Path(str(args.model)).name}" + (
        "" if args.temperature == 1.0 else f"_t{args.temperature:g}"
    )
    out = args.out or Path(__file__).parent / "results" / f"{name}.json"
    doc = {"model": str(args.model), "style": style, "problems": args.problems, "samples": args.samples,
           "temperature": args.temperature, "max_tokens": args.max_tokens, "device": args.device,
           "threads": torch.get_num_threads(), "rows": rows}  # fmt: skip
    write_json(out, doc)
    print(json.dumps({"wrote": str(out)}))


if __name__ == "__main__":
    main()
