"""The two graders of every eval side by side: the score under each, their versions, and the samples they
grade differently, counted by the gold's answer type with examples (results.json's `graders` and
`disagreements`, the page's "Second grader" section). The second grader is plain math-verify for maths and
the strict K&K reader for K&K (`reference_trainer.tasks.second_opinion`)."""

from __future__ import annotations

from typing import Any

from reference_trainer.tasks.second_opinion import SECOND_GRADER, answer_type, grader_versions

EXAMPLES_PER_TYPE = 3
_EXAMPLE_CHARS = 200


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def compare_graders(rows: list[dict[str, Any]], grader: str) -> dict[str, Any] | None:
    """{"graders": ..., "disagreements": ...} for results.json; None when the suite's grader has no second
    (a suite's own `python:` grader) or no row was graded by both (rows of an older run)."""
    second = SECOND_GRADER.get(grader)
    both = [r for r in rows if r.get("second_correct") is not None]
    if second is None or not both:
        return None
    versions = grader_versions()
    by_type: dict[str, dict[str, Any]] = {}
    for row in both:
        kind = answer_type(str(row["gold"]), grader)
        entry = by_type.setdefault(kind, {"samples": 0, "rlbench_only": 0, "second_only": 0, "examples": []})
        for j, (ours, theirs) in enumerate(zip(row["correct"], row["second_correct"], strict=False)):
            entry["samples"] += 1
            if ours == theirs or theirs is None:
                continue
            entry["rlbench_only" if ours else "second_only"] += 1
            if len(entry["examples"]) < EXAMPLES_PER_TYPE:
                entry["examples"].append(_example(row, j, ours))
    return {
        "graders": {
            "rlbench": {"version": versions["rlbench"], "accuracy": _mean([r["avg"] for r in both])},
            second: {
                "version": versions[second],
                "accuracy": _mean([_mean([float(bool(c)) for c in r["second_correct"]]) for r in both]),
            },
        },
        "disagreements": {
            "second_grader": second,
            "problems": len(both),
            "samples": sum(e["samples"] for e in by_type.values()),
            "rlbench_only": sum(e["rlbench_only"] for e in by_type.values()),
            "second_only": sum(e["second_only"] for e in by_type.values()),
            "by_type": dict(sorted(by_type.items())),
        },
    }


def _example(row: dict[str, Any], j: int, ours: bool) -> dict[str, Any]:
    extracted = row.get("extracted") or []
    theirs = row.get("second_extracted") or []
    return {
        "id": f"{row['id']}#{j}",
        "gold": str(row["gold"])[:_EXAMPLE_CHARS],
        "rlbench": {"answer": _cut(extracted[j] if j < len(extracted) else None), "correct": ours},
        "second": {"answer": _cut(theirs[j] if j < len(theirs) else None), "correct": not ours},
    }


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= _EXAMPLE_CHARS else text[: _EXAMPLE_CHARS - 3] + "..."
