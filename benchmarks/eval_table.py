"""One model on all six eval suites, greedy and avg@k, in minutes per suite: the README's eval table.

    python -m benchmarks.eval_table --model smollm2-135m-instruct --data-dir DIR [--out runs/eval_table]
                                    [--limit 100] [--avg-limit 10] [--k 4] [--max-tokens 512]

Runs `rlbench eval` per suite, twice: greedy (T = 0) on the first --limit problems (AIME 2024 and AMC 2023
whole), and k samples at T = 0.6, top-p 0.95 on the first --avg-limit (AIME 2024 whole). Each run is resumable
(OUT/SUITE_greedy, OUT/SUITE_avgK); a finished one is read back, with the wall time recorded when it ran.
Note that the first N of `kk` are its 3-person puzzles and the first 100 of `kk-ood` its 2-person ones.
Prints a table and writes benchmarks/results/eval_table_MODEL.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from reference_trainer.trace.records import read_json, write_json

SUITES = ("aime24", "amc23", "math500", "olympiadbench", "kk", "kk-ood")
WHOLE = ("aime24", "amc23")  # small enough to run whole greedy
WHOLE_SAMPLED = ("aime24",)
WALL_FILE = "wall_s.json"


def run_eval(args: argparse.Namespace, suite: str, name: str, limit: int | None, extra: list[str]) -> dict:
    out = Path(args.out) / name
    if not (out / "results.json").exists():
        flags = ["--suite", suite, "--model", args.model, "--data-dir", args.data_dir]
        flags += ["--max-tokens", str(args.max_tokens), "--out", str(out), *extra]
        cmd = [str(Path(sys.executable).with_name("rlbench")), "eval", *flags]
        cmd += [] if limit is None else ["--limit", str(limit)]
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        write_json(out / WALL_FILE, {"wall_s": time.perf_counter() - start, "command": ["rlbench", *cmd[1:]]})
    results = read_json(out / "results.json")
    wall = read_json(out / WALL_FILE)["wall_s"] if (out / WALL_FILE).exists() else None
    kept = {k: results[k] for k in ("problems_evaluated", "accuracy", "pass_at_k", "maj_at_k")}
    return {**kept, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", default="runs/eval_table")
    parser.add_argument("--limit", type=int, default=100, help="greedy: first N problems (not AIME/AMC)")
    parser.add_argument("--avg-limit", type=int, default=10, help="avg@k: first N problems (not AIME)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    rows = {}
    for suite in SUITES:
        whole = suite in WHOLE
        greedy = run_eval(
            args, suite, f"{suite}_greedy", None if whole else args.limit, ["--temperature", "0"]
        )
        sampled = run_eval(
            args, suite, f"{suite}_avg{args.k}", None if suite in WHOLE_SAMPLED else args.avg_limit,
            ["--samples", str(args.k), "--temperature", "0.6", "--top-p", "0.95"],
        )  # fmt: skip
        rows[suite] = {"greedy": greedy, f"avg{args.k}": sampled}
    k = args.k
    print(f"model: {args.model}; max {args.max_tokens} new tokens; avg@{k} at T = 0.6, top-p 0.95")
    print(
        f"| suite | greedy: problems | greedy accuracy | wall | avg@{k}: problems | avg@{k} | pass@{k} "
        f"| maj@{k} | wall |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for suite, r in rows.items():
        g, s = r["greedy"], r[f"avg{k}"]

        def wall(x: dict) -> str:
            return f"{x['wall_s'] / 60:.1f} min" if x["wall_s"] is not None else "n/a"

        print(
            f"| {suite} | {g['problems_evaluated']} | {g['accuracy']:.1%} | {wall(g)} "
            f"| {s['problems_evaluated']} | {s['accuracy']:.1%} | {s['pass_at_k'][str(k)]:.1%} "
            f"| {s['maj_at_k'][str(k)]:.1%} | {wall(s)} |"
        )
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(args.model).name)
    write_json(
        Path(__file__).parent / "results" / f"eval_table_{name}.json",
        {"model": args.model, "max_tokens": args.max_tokens, "k": k, "suites": rows},
    )


if __name__ == "__main__":
    main()
