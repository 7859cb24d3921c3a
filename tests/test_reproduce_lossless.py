"""histospec-lossless: the stratified chi-square test is calibrated and has power; the quick reproduction
passes the exact rule, catches the wrong ones and meets its spec."""

from __future__ import annotations

import random

import pytest
import torch
from scipy import stats

from reference_trainer.speculation.suffix import suffix_available
from rlbench.reproduce.base import Context
from rlbench.reproduce.lossless import generous_accept, homogeneity_test, lossless, no_residual_accept
from rlbench.reproduce.spec import load_specs

# Three strata (prompts), each with a few common outcomes and a tail of rare ones.
STRATA = [
    {"a": 0.5, "b": 0.3, "c": 0.15, **{f"r{i}": 0.01 for i in range(5)}},
    {"x": 0.9, "y": 0.1},
    {"u": 0.4, "v": 0.4, "w": 0.2},
]


def draw(rng: random.Random, dist: dict[str, float], n: int) -> list[str]:
    return rng.choices(list(dist), weights=list(dist.values()), k=n)


def test_homogeneity_test_pools_rare_outcomes_and_adds_strata():
    a = [["a"] * 30 + ["b"] * 20 + ["r1"] * 2 + ["r2"] * 3, ["x"] * 10]
    b = [["a"] * 25 + ["b"] * 30 + ["r1"] * 2 + ["r3"] * 2, ["x"] * 12]
    got = homogeneity_test(a, b)
    # r1, r2, r3 (9 together, under 10) join the smallest kept cell, b; the one-outcome stratum adds nothing.
    ref = stats.chi2_contingency([[30, 25], [25, 34]], correction=False)
    assert got["dof"] == 1 and got["statistic"] == pytest.approx(ref.statistic)
    assert got["p_value"] == pytest.approx(ref.pvalue) and got["per_stratum"][1] == 1.0
    assert homogeneity_test([["x"] * 5], [["x"] * 7]) == {"p_value": 1.0, "statistic": 0.0, "dof": 0,
                                                          "per_stratum": [1.0]}  # fmt: skip


def test_homogeneity_test_is_calibrated_and_has_power():
    rng = random.Random(0)
    null = [
        homogeneity_test([draw(rng, d, 150) for d in STRATA], [draw(rng, d, 150) for d in STRATA])["p_value"]
        for _ in range(300)
    ]
    assert 0.02 <= sum(p < 0.05 for p in null) / len(null) <= 0.09  # false positives near the 5% level
    assert 0.4 <= sum(null) / len(null) <= 0.6  # p-values roughly uniform under the null
    shifted = [dict(STRATA[0], a=0.3, b=0.5), *STRATA[1:]]  # one stratum moves 20% of its mass
    power = [
        homogeneity_test([draw(rng, d, 400) for d in STRATA], [draw(rng, d, 400) for d in shifted])["p_value"]
        for _ in range(50)
    ]
    assert sum(p < 0.01 for p in power) / len(power) >= 0.9


def test_wrong_rules_accept_too_often():
    probs = torch.tensor([[0.3, 0.7]]).repeat(20_000, 1)
    drafts = torch.zeros(20_000, dtype=torch.long)  # p(d) = 0.3
    plain = torch.ones(20_000, dtype=torch.long)
    assert generous_accept(0)(probs, plain, drafts).float().mean() == pytest.approx(0.6, abs=0.02)
    # Acceptance right (p(d)), but independent of the plain draw, which the rejection then emits.
    assert no_residual_accept(0)(probs, plain, drafts).float().mean() == pytest.approx(0.3, abs=0.02)


@pytest.mark.e2e
def test_quick_reproduction_passes_the_exact_rule_and_catches_wrong_ones(tmp_path, one_thread):
    ctx = Context(device="cpu", quick=True, model=None, work_dir=tmp_path, progress=lambda _: None)
    out = lossless(ctx)
    m = out.measured
    assert m["p_value_exact"] >= 0.01  # no difference with drafts...
    assert m["p_value_biased"] < 1e-6 and m["p_value_no_residual"] < 0.01  # ...but the test sees wrong rules
    assert m["identical_with_same_seeds"] == 1.0  # the coupling: same seeds, same responses
    assert m["accepted_tokens"] > 1000 and m["rejected_tokens"] > 200 and 0.5 < m["acceptance_rate"] < 1
    if suffix_available():  # the same verifier under SuffixDecoding's drafts
        assert m["p_value_exact_suffix"] >= 0.01 and m["p_value_biased_suffix"] < 0.01
        assert m["accepted_tokens_suffix"] > 1000 and m["rejected_tokens_suffix"] > 200
    spec = load_specs()["histospec-lossless"]
    assert spec.verdict(m)[0] == "reproduced"
    assert {c.metric for c in spec.checks + spec.requires} <= set(m)
    figures = [p for _, parts in out.sections for p in parts if not isinstance(p, str)]
    assert len(figures) == 2 and out.seeds == [0]
