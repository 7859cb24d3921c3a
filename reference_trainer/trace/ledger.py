"""The bias and starvation ledger (docs/metrics.md, "The ledger"): what a mode trades for its speed, from
the trace's sequence events. A generation is a sequence id at the longest length it reached; the KS
distance of trained against generated lengths, the longest decile's trained share, the oldest waiting
prompt's age in policy versions, reward over completed and all generations."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from reference_trainer.trace.schema import SEQUENCE
from reference_trainer.trace.steps import mean_of, ratio, step_metrics

Event = dict[str, Any]

COMPLETE = ("eos", "stop", "length")  # finish reasons of a generation that ran to its end
# The fields of a sequence event the ledger reads (a streamed import keeps only these)
LEDGER_FIELDS = ("kind", "id", "step", "status", "response_tokens", "reward", "finish_reason", "prompt_index",
                 "prompt_id", "admit_version")  # fmt: skip


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    if not a or not b:
        return None
    xs, ys = sorted(a), sorted(b)
    gap = 0.0
    for v in sorted(set(xs) | set(ys)):
        gap = max(gap, abs(bisect.bisect_right(xs, v) / len(xs) - bisect.bisect_right(ys, v) / len(ys)))
    return gap


def _generations(seqs: Sequence[Event]) -> dict[str, Event]:
    """Every generation of the trace (a sequence id; a regenerated sample is a new one), in trace order: the
    length it reached, its reward there, whether an update trained it, whether it ran to its end, and
    whether it is still kept when the trace ends (`pending`: last seen `cached` in the trace's last step, its
    fate unknown; one last cached earlier was given up: regenerated as a new attempt, or dropped)."""
    out: dict[str, Event] = {}
    last = max((int(e.get("step", 0)) for e in seqs), default=0)
    for e in seqs:
        if e.get("status") == "lookahead":
            continue
        g = out.setdefault(str(e["id"]), {"length": 0, "reward": None, "trained": False, "complete": False})
        n = int(e.get("response_tokens") or 0)
        if n >= g["length"]:
            g["length"], g["reward"] = n, e.get("reward", g["reward"])
        g["trained"] |= e.get("status") == "finished"
        g["complete"] |= e.get("finish_reason") in COMPLETE
        g["pending"] = e.get("status") == "cached" and int(e.get("step", 0)) == last
    return out


def _prompt_key(seq: Event) -> str:
    """A prompt's key across runs on one prompt stream: its position (a cycled pool repeats prompt ids)."""
    return str(seq.get("prompt_index", seq.get("prompt_id")))


def _waiting_ages(seqs: Sequence[Event], versions: dict[int, int]) -> dict[int, int | None]:
    """Per step, the age in policy versions of the oldest prompt admitted by its update and not trained
    before it (trained at this step or later, or never): the update's version - the version at which the
    prompt was first admitted. Null where the trace records no admission versions."""
    admitted: dict[str, int] = {}
    trained: dict[str, int] = {}
    for e in seqs:
        if e.get("admit_version") is None or e.get("status") == "lookahead":
            continue
        key = _prompt_key(e)
        admitted[key] = min(admitted.get(key, int(e["admit_version"])), int(e["admit_version"]))
        if e.get("status") == "finished":
            trained[key] = min(trained.get(key, int(e["step"])), int(e["step"]))
    if not admitted:
        return dict.fromkeys(versions)
    ages: dict[int, int | None] = {}
    for step, version in sorted(versions.items()):
        waiting = [version - v for k, v in admitted.items() if v <= version and trained.get(k, step) >= step]
        ages[step] = max(waiting, default=0)
    return ages


def ledger(events: Sequence[Event], steps: list[Event] | None = None) -> Event:
    """What a mode trades for its speed, from the trace's sequence events (docs/metrics.md, "The ledger"):
    the trained response lengths against every generation's, the share of the longest decile of generations
    an update trained, the age of the oldest prompt still waiting at each update, reward over completed and
    over all generations, and each prompt's trained lengths (for the comparison on the same prompts)."""
    steps = step_metrics(events) if steps is None else steps  # only their update versions are read
    seqs = [e for e in events if e.get("kind") == SEQUENCE]
    gens = [g for g in _generations(seqs).values() if not g["pending"]]
    trained = [int(e.get("response_tokens") or 0) for e in seqs if e.get("status") == "finished"]
    generated = [g["length"] for g in gens]
    longest = sorted(gens, key=lambda g: -g["length"])[: math.ceil(0.1 * len(gens))]
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for e in seqs:
        if e.get("status") == "finished":
            by_prompt[_prompt_key(e)].append(int(e.get("response_tokens") or 0))
    versions = {s["step"]: int(s["policy_version"]) for s in steps if s.get("policy_version") is not None}
    ages = _waiting_ages(seqs, versions)
    return {
        "trained_vs_generated_ks": ks_distance(trained, generated),
        "long_decile_trained_share": ratio(sum(g["trained"] for g in longest), len(longest)),
        "long_decile_min_length": longest[-1]["length"] if longest else None,
        "oldest_waiting_age": {str(k): v for k, v in ages.items()},
        "reward_completed": mean_of(g["reward"] for g in gens if g["complete"]),
        "reward_all": mean_of(g["reward"] for g in gens),
        "generations": len(gens),
        "trained_lengths_by_prompt": dict(by_prompt),
    }


def ledger_summary(book: Event) -> Event:
    """The ledger's run-level numbers, for a summary."""
    ages = [v for v in book["oldest_waiting_age"].values() if v is not None]
    return {
        "trained_vs_generated_ks": book["trained_vs_generated_ks"],
        "long_decile_trained_share": book["long_decile_trained_share"],
        "oldest_waiting_age_max": max(ages) if ages else None,
        "reward_completed": book["reward_completed"],
        "reward_all": book["reward_all"],
    }


def same_prompts_ks(mine: dict[str, list[int]], theirs: dict[str, list[int]]) -> float | None:
    """KS distance between two runs' trained response lengths over the prompts both trained (the same
    prompt stream: a prompt's position is its key)."""
    both = mine.keys() & theirs.keys()
    return ks_distance([n for k in both for n in mine[k]], [n for k in both for n in theirs[k]])
