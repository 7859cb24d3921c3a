"""Where the embedded model's K&K search breaks: per-claim accuracy under teacher forcing.

    python benchmarks/kk_claims.py [--model DIR] [--problems 100]

Feeds the model error-free search traces (sft_person_error = 0) of held-out puzzles with 2 and 3 people
and reads its greedy prediction at every check: the claim's truth (`t`/`f`, which needs the speaker's
statement from the prompt and the roles of the line) and the verdict (`ok`/`no`, which compares that with
the speaker's role). Accuracy is per statement form, beside the share of the majority answer (what always
writing the form's more common truth value would score). Prints a table and writes
benchmarks/results/kk_claims.json.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import resolve_model  # noqa: E402

from reference_trainer.model.loader import load_model  # noqa: E402
from reference_trainer.model.prompting import encode_prompt, encode_response  # noqa: E402
from reference_trainer.model.tokenizer import load_tokenizer  # noqa: E402
from reference_trainer.tasks import get_task  # noqa: E402
from reference_trainer.train.heldout import held_out_problems  # noqa: E402
from rlbench.records import write_json  # noqa: E402

CHECK = re.compile(r"(\w+) ([tf]) (ok|no)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory or name; default: the embedded model")
    parser.add_argument("--problems", type=int, default=100, help="held-out puzzles per people count")
    args = parser.parse_args()
    path, label = resolve_model(args.model)
    model, tokenizer = load_model(path).eval(), load_tokenizer(path)
    hits: dict[tuple[int, str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for people in (2, 3):
        task = get_task("kk", num_people=people, sft_person_error=0.0)
        for problem in held_out_problems(task, args.problems):
            response = task.sft_response(problem, random.Random(0))
            prompt = encode_prompt(tokenizer, problem.prompt)
            ids = prompt + encode_response(tokenizer, response)
            with torch.no_grad():
                predicted = model(torch.tensor([ids]))[0].argmax(-1).tolist()
            names, statements = problem.meta["names"], problem.meta["statements"]
            offset = 0
            for line in response.split("\n"):
                roles, sep, checks = line.partition(": ")
                for match in CHECK.finditer(checks) if sep else ():
                    form = statements[names.index(match.group(1))][0]
                    for group, what in ((2, "truth"), (3, "verdict")):
                        at = len(prompt) + offset + len(roles) + len(sep) + match.start(group)
                        got = tokenizer.decode([predicted[at - 1]])  # the prediction of token `at`
                        cell = hits[people, form, what]
                        cell[0] += got == match.group(group)[0]
                        cell[1] += 1
                    hits[people, form, "true"][0] += match.group(2) == "t"
                offset += len(line) + 1
    print(f"model: {label}; {args.problems} held-out puzzles per people count, teacher-forced correct traces")
    print(
        "| people | statement form | checks | claim truth (t/f) | majority answer | verdict (ok/no) |\n"
        "|---:|---|---:|---:|---:|---:|"
    )
    table = []
    for people, form in sorted({(p, f) for p, f, _ in hits}):
        truth, verdict = hits[people, form, "truth"], hits[people, form, "verdict"]
        true_share = hits[people, form, "true"][0] / truth[1]
        row = {
            "people": people,
            "form": form,
            "checks": truth[1],
            "truth_accuracy": truth[0] / truth[1],
            "majority_share": max(true_share, 1 - true_share),
            "verdict_accuracy": verdict[0] / verdict[1],
        }
        table.append(row)
        print(
            f"| {people} | {form} | {truth[1]} | {row['truth_accuracy']:.0%} | {row['majority_share']:.0%} "
            f"| {row['verdict_accuracy']:.0%} |"
        )
    write_json(Path(__file__).parent / "results" / "kk_claims.json", {"model": label, "rows": table})


if __name__ == "__main__":
    main()
