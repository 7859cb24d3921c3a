"""Where the embedded model's K&K search breaks: per-check accuracy under teacher forcing.

    python -m benchmarks.kk_claims [--model DIR] [--problems 100]

Feeds the model error-free search traces (sft_person_error = 0) of held-out puzzles with 2 and 3 people
and reads its greedy prediction at every token of every check that is a decision (tasks/kk.py shows the
format): the role each atom of the claim names (copied from the speaker's statement in the prompt), the
role that person has on the candidate line (a lookup), the atom's truth, the claim's truth and the verdict
(ok/no: the claim's truth against the speaker's role). Accuracy is per statement form, beside the share of
the majority claim truth (what always writing the form's more common value would score). Prints a table
and writes benchmarks/results/kk_claims.json.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
from pathlib import Path

import torch

from benchmarks.common import resolve_model
from reference_trainer.model.loader import load_model
from reference_trainer.model.prompting import encode_prompt, encode_response
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.tasks import get_task
from reference_trainer.trace.records import write_json
from reference_trainer.train.heldout import held_out_problems

CHECK = re.compile(r" (\w+) ([TF]): (.*) = ([tf]) (ok|no)")
ATOM = re.compile(r"(\w+)=([TF]):([TF]) ([tf])")
SAYS = re.compile(r"(\w+):([TF]) says")
WHAT = ("claimed role", "actual role", "atom truth", "claim truth", "verdict")


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
                check = CHECK.fullmatch(line)
                if check is not None:
                    form = statements[names.index(check.group(1))][0]
                    claim_at = check.start(3)
                    scored = [
                        (claim_at + m.start(g), w)
                        for m in ATOM.finditer(check.group(3))
                        for g, w in ((2, "claimed role"), (3, "actual role"), (4, "atom truth"))
                    ]
                    scored += [(claim_at + m.start(2), "actual role") for m in SAYS.finditer(check.group(3))]
                    scored += [(check.start(4), "claim truth"), (check.start(5), "verdict")]
                    for pos, what in scored:
                        at = len(prompt) + offset + pos
                        got = tokenizer.decode([predicted[at - 1]])  # the prediction of token `at`
                        cell = hits[people, form, what]
                        cell[0] += got == line[pos]
                        cell[1] += 1
                    hits[people, form, "true"][0] += check.group(4) == "t"
                offset += len(line) + 1
    print(f"model: {label}; {args.problems} held-out puzzles per people count, teacher-forced correct traces")
    print(
        "| people | statement form | checks | " + " | ".join(WHAT) + " | majority claim truth |\n"
        "|---:|---|---:|" + "---:|" * (len(WHAT) + 1)
    )
    table = []
    for people, form in sorted({(p, f) for p, f, _ in hits}):
        checks = hits[people, form, "verdict"][1]
        row: dict[str, object] = {"people": people, "form": form, "checks": checks}
        for what in WHAT:
            right, total = hits[people, form, what]
            row[what.replace(" ", "_") + "_accuracy"] = right / total
        true_share = hits[people, form, "true"][0] / checks
        row["majority_share"] = max(true_share, 1 - true_share)
        table.append(row)
        cells = " | ".join(f"{row[w.replace(' ', '_') + '_accuracy']:.0%}" for w in WHAT)
        print(f"| {people} | {form} | {checks} | {cells} | {row['majority_share']:.0%} |")
    write_json(Path(__file__).parent / "results" / "kk_claims.json", {"model": label, "rows": table})


if __name__ == "__main__":
    main()
