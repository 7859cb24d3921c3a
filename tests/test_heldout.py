"""Held-out measurement helpers: the unbiased pass@k estimator and the recipe's policy card."""

from __future__ import annotations

from math import comb

import pytest

from reference_trainer.train.heldout import pass_at_k, policy_card


def test_pass_at_k_is_the_unbiased_estimator():
    # one problem, 4 samples, 1 correct: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1
    assert pass_at_k([True, False, False, False], 4, 1) == pytest.approx(0.25)
    assert pass_at_k([True, False, False, False], 4, 2) == pytest.approx(1 - comb(3, 2) / comb(4, 2))
    assert pass_at_k([True, False, False, False], 4, 4) == 1.0
    # averaged over problems: all wrong and all right
    assert pass_at_k([False] * 4 + [True] * 4, 4, 2) == pytest.approx(0.5)


def test_policy_card_reports_every_target_within_range(tiny_model_dir):
    from reference_trainer.model.loader import load_model
    from reference_trainer.model.tokenizer import load_tokenizer
    from reference_trainer.tasks import get_task

    card = policy_card(
        load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), get_task("arith"), n=4, samples=2,
        max_tokens=12,
    )  # fmt: skip
    assert set(card) == {"greedy_acc", "pass1_t1", "pass2_t1", "len_p50", "len_p99", "len_p99_over_p50",
                         "median_top_prob"}  # fmt: skip
    assert 0 <= card["greedy_acc"] <= 1 and 0 <= card["pass1_t1"] <= card["pass2_t1"] <= 1
    assert 1 <= card["len_p50"] <= card["len_p99"] <= 12
    assert 0 < card["median_top_prob"] <= 1
