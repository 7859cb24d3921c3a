"""Grade the responses an eval kept again, with the grader on the Python path, and say which verdicts changed.

    python -m benchmarks.regrade --data-dir DIR RUN_DIR... [--out FILE] [--against FILE]

Each RUN_DIR is an `rlbench eval --out` directory: its `problems.jsonl` keeps every response, and
`run_config.json` names the suite, whose data file gives each problem's statement. Prints each run's accuracy
and writes every verdict to --out (JSON). With --against (an earlier --out, say from an older grader put first
on PYTHONPATH), lists every response whose verdict differs. A grader older than the problem-aware one is
graded without the problem statement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.grader_cases import math_item
from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_json, read_jsonl, write_json
from rlbench.eval.pool import GradingPool
from rlbench.eval.suites import get_suite


def _problems(data_dir: Path, suite_name: str) -> dict[str, str]:
    suite = get_suite(suite_name)
    return {str(r["id"]): r["problem"] for r in read_jsonl(data_dir / suite.data_file, ("id", "problem"))}


def regrade(run_dir: Path, data_dir: Path, pool: GradingPool) -> dict[str, dict]:
    """{"problem-id#sample": {"correct", "extracted"}} for every response of one run."""
    suite_name = read_json(run_dir / "run_config.json")["config"]["suite"]
    statements = _problems(data_dir, suite_name)
    rows = read_jsonl(run_dir / "problems.jsonl", ("id", "gold", "responses"))
    items, keys = [], []
    for row in rows:
        statement = statements.get(row["id"], "")
        for j, response in enumerate(row["responses"]):
            items.append(math_item(response, row["gold"], f"{row['id']}#{j}", statement))
            keys.append(f"{row['id']}#{j}")
    results = pool.grade(items)
    return {k: {"correct": r.correct, "extracted": r.extracted} for k, r in zip(keys, results, strict=True)}


def main() -> None:
    try:
        _main()
    except UserError as err:  # a missing or malformed file: one line
        sys.exit(f"error: {err}")


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/regrade.json"))
    parser.add_argument("--against", type=Path, help="an earlier --out to compare verdicts with")
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "problems.jsonl").is_file() or not (run / "run_config.json").is_file():
            sys.exit(f"{run}: not an eval run directory (no problems.jsonl or run_config.json)")
    verdicts: dict[str, dict[str, dict]] = {}
    with GradingPool(workers=2) as pool:
        for run in args.runs:
            verdicts[run.name] = regrade(run, args.data_dir, pool)
    write_json(args.out, verdicts)
    earlier = read_json(args.against) if args.against else {}
    print("| run | responses | correct | accuracy | verdicts changed |")
    print("|---|---:|---:|---:|---:|")
    changes = []
    for name, graded in verdicts.items():
        before = earlier.get(name, {})
        changed = [k for k, v in graded.items() if k in before and before[k]["correct"] != v["correct"]]
        changes += [(name, k, before[k], graded[k]) for k in changed]
        correct = sum(v["correct"] for v in graded.values())
        accuracy = correct / len(graded) if graded else 0.0
        shown = str(len(changed)) if args.against else "n/a"
        print(f"| {name} | {len(graded)} | {correct} | {accuracy:.1%} | {shown} |")
    for name, key, old, new in changes:
        print(f"{name} {key}: {old['extracted']!r} {old['correct']} -> {new['extracted']!r} {new['correct']}")


if __name__ == "__main__":
    main()
