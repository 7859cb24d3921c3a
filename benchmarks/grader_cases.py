"""The grader against a judged case set: false positives per thousand cases judged wrong and false negatives
per thousand judged right, by kind. `--set old` is `benchmarks/judged_cases.py`, `--set fresh` is
`benchmarks/fresh_cases.py` (other graders' tests and real model outputs, maths and K&K), `--set rules` is
`benchmarks/rule_cases.py` (the grading rules' own cases and the examples they were written from).

    python -m benchmarks.grader_cases [--set old|fresh|rules] [--workers 2] [--show-agreeing]

Every case is graded as `rlbench eval` grades a sample: in the grading pool (forked workers, the wall-clock
limit and the one retry after a timeout), with the problem statement where the case has one. A false
positive is a case judged wrong that the grader passes; a false negative one judged right that it fails.
Prints a table and every disagreement, and writes benchmarks/results/grader_cases[_fresh].json (or --out).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchmarks import fresh_cases, judged_cases, rule_cases
from reference_trainer.errors import UserError
from reference_trainer.tasks.grading import GradeItem, GradeResult
from reference_trainer.trace.records import write_json
from rlbench.eval.pool import GradingPool

RESULTS = Path(__file__).parent / "results"
SETS: dict[str, tuple[Callable[[], list[Any]], Path]] = {
    "old": (judged_cases.all_cases, RESULTS / "grader_cases.json"),
    "fresh": (fresh_cases.all_cases, RESULTS / "grader_cases_fresh.json"),
    "rules": (rule_cases.all_cases, RESULTS / "grader_cases_rules.json"),
}


def math_item(response: str, gold: str, item_id: str, problem: str) -> GradeItem:
    """A maths item for the grader on the path; one older than the problem-aware grader (run with an older
    checkout first on PYTHONPATH, to compare) is given no problem statement."""
    if "problem" in {f.name for f in fields(GradeItem)}:
        return GradeItem("math", response, gold, id=item_id, problem=problem)
    return GradeItem("math", response, gold, id=item_id)


def case_item(case: Any, item_id: str) -> GradeItem:
    """A judged case as the grading item `rlbench eval` would grade (a K&K case with its names)."""
    if getattr(case, "grader", "math") == "kk":
        return GradeItem("kk", case.response, case.gold, case.names, case.solution, id=item_id)
    return math_item(case.response, case.gold, item_id, case.problem)


def grade_cases(cases: list[Any], workers: int) -> list[GradeResult]:
    items = [case_item(c, f"case-{i}") for i, c in enumerate(cases)]
    with GradingPool(workers=workers) as pool:
        return pool.grade(items)


def per_thousand(count: int, total: int) -> float:
    return 1000 * count / total if total else 0.0


def main() -> None:
    try:
        _main()
    except UserError as err:  # an --out that cannot be written: one line
        sys.exit(f"error: {err}")


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, choices=range(1, 9), default=2, metavar="1..8")
    parser.add_argument("--show-agreeing", action="store_true", help="also print the cases graded as judged")
    parser.add_argument("--set", choices=tuple(SETS), default="old", help="which judged case set")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/grader_cases[_fresh].json")
    args = parser.parse_args()
    load, default_out = SETS[args.set]
    cases = load()
    start = time.perf_counter()
    results = grade_cases(cases, args.workers)
    wall_s = time.perf_counter() - start

    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    disagreements = []
    for case, result in zip(cases, results, strict=True):
        group = case.kind.split("/")[0]
        verdict = "ok" if result.correct == case.correct else "fp" if result.correct else "fn"
        by_kind[group]["cases"] += 1
        by_kind[group]["right" if case.correct else "wrong"] += 1
        by_kind[group][verdict] += 1
        if verdict != "ok" or args.show_agreeing:
            disagreements.append(
                {"kind": case.kind, "verdict": verdict, "response": case.response, "gold": case.gold,
                 "judged": case.correct, "extracted": result.extracted, "error": result.error}
            )  # fmt: skip

    total = collections.Counter[str]()
    for counts in by_kind.values():
        total.update(counts)
    graded = f"graded in {wall_s:.1f} s ({args.workers} workers)"
    print(f"{len(cases)} judged cases ({total['right']} right), {graded}")
    print(
        "| kind | cases | right | false positives | false negatives "
        + "| FP per 1,000 wrong | FN per 1,000 right |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, c in [*sorted(by_kind.items()), ("all", total)]:
        print(
            f"| {kind} | {c['cases']} | {c['right']} | {c['fp']} | {c['fn']} "
            f"| {per_thousand(c['fp'], c['wrong']):.1f} | {per_thousand(c['fn'], c['right']):.1f} |"
        )
    for d in disagreements:
        print(f"{d['verdict'].upper()} [{d['kind']}] gold {d['gold']!r}: {d['response']!r}")
        print(f"    extracted {d['extracted']!r}")
    write_json(
        args.out or default_out,
        {
            "set": args.set,
            "cases": len(cases),
            "right": total["right"],
            "false_positives": total["fp"],
            "false_negatives": total["fn"],
            "fp_per_1000_wrong": per_thousand(total["fp"], total["wrong"]),
            "fn_per_1000_right": per_thousand(total["fn"], total["right"]),
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "disagreements": disagreements,
            "wall_s": wall_s,
        },
    )


if __name__ == "__main__":
    main()
