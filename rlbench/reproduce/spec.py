"""A reproduction's spec (`rlbench/reproduce/specs/<name>.toml`) and the rule that turns measurements into a
verdict.

[verdict] holds `checks` (each {metric, op, value}): all pass → "reproduced", any fails → "not reproduced".
`requires` are preconditions on the workload (e.g. the baseline has a bubble to remove); a failed one, or a
metric missing from the measurement, makes the verdict "inconclusive". No result at all: "not run".
"""

from __future__ import annotations

import importlib
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlbench.reproduce.base import Context, Outcome

SPEC_DIR = Path(__file__).resolve().parent / "specs"  # one <name>.toml per claim


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The keys of a spec file: a stale or misspelt one is refused, not ignored.
REQUIRED = ("runner", "claim", "source", "paper_value", "workload", "metric")  # each a Spec field of its name
KEYS = (*REQUIRED, "verdict", "model", "needs_gpu")
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class Check:
    metric: str
    op: str
    value: float

    def text(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def holds(self, measured: dict[str, Any]) -> bool | None:
        """True/False, or None when the measurement lacks the metric."""
        got = measured.get(self.metric)
        return None if got is None else bool(OPS[self.op](float(got), self.value))


@dataclass(frozen=True)
class Spec:
    name: str
    claim: str  # the claim in one sentence
    source: str  # paper, arXiv id, section or table
    paper_value: str  # the paper's number, as the paper gives it
    workload: str  # what runs, in words; the modes that run are the runner's own
    metric: str  # the metric that decides
    rule: str  # the verdict rule in words
    runner: str  # "module:function": the function of a Context that measures it and returns an Outcome
    checks: list[Check] = field(default_factory=list)
    requires: list[Check] = field(default_factory=list)
    # The model the claim is about, when not the embedded one (e.g. a pretrained model's name); --model
    # overrides it.
    model: str | None = None
    # A claim about a real model at full size needs a GPU: `--all` on a CPU leaves it out (named, it runs).
    needs_gpu: bool = False

    def run_function(self) -> Callable[[Context], Outcome]:
        """The runner, imported only when the reproduction runs."""
        module, function = self.runner.split(":")
        return getattr(importlib.import_module(module), function)

    def verdict(self, measured: dict[str, Any] | None) -> tuple[str, list[str]]:
        """The verdict and the reasons behind it, one line per check."""
        if measured is None:
            return "not run", []
        reasons, inconclusive = [], False
        for check in self.requires:
            ok = check.holds(measured)
            reasons.append(f"precondition {check.text()}: {_word(ok, measured.get(check.metric))}")
            inconclusive |= ok is not True
        results = []
        for check in self.checks:
            ok = check.holds(measured)
            reasons.append(f"{check.text()}: {_word(ok, measured.get(check.metric))}")
            results.append(ok)
        if inconclusive or any(ok is None for ok in results):
            return "inconclusive", reasons
        return ("reproduced" if all(results) else "not reproduced"), reasons


def _word(ok: bool | None, got: Any) -> str:
    if ok is None:
        return "not measured"
    return f"{'holds' if ok else 'fails'} ({got:.4g})"


def _checks(raw: list[dict[str, Any]], where: str) -> list[Check]:
    out = []
    for item in raw:
        if item.get("op") not in OPS:
            raise ValueError(f"{where}: op must be one of {', '.join(OPS)}, got {item.get('op')!r}")
        out.append(Check(str(item["metric"]), item["op"], float(item["value"])))
    return out


def parse_spec(name: str, text: str) -> Spec:
    raw = tomllib.loads(text)
    verdict = raw.get("verdict", {})
    where = f"rlbench/reproduce/specs/{name}.toml"
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing or "rule" not in verdict:
        raise ValueError(
            f"{where} lacks {', '.join(missing + ([] if 'rule' in verdict else ['verdict.rule']))}"
        )
    return Spec(
        name=name,
        **{k: raw[k] for k in REQUIRED},
        rule=verdict["rule"],
        checks=_checks(verdict.get("checks", []), where),
        requires=_checks(verdict.get("requires", []), where),
        model=raw.get("model"),
        needs_gpu=bool(raw.get("needs_gpu", False)),
    )


def load_specs() -> dict[str, Spec]:
    """Every spec of SPEC_DIR (package data), by name."""
    return {
        path.stem: parse_spec(path.stem, path.read_text(encoding="utf-8"))
        for path in sorted(SPEC_DIR.glob("*.toml"))
    }
