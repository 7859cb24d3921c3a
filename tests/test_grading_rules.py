"""The grading rules of docs/eval.md ("Which answer counts", "Answer forms", the K&K reading), each tested
on its table of hand-written cases (benchmarks/rule_cases.py): the last commitment, an equality chain's last
value, a substitution, values written with signs or words, options, named matrices, clock times, and a K&K
answer read from the conclusion only."""

from __future__ import annotations

import pytest

from benchmarks.rule_cases import (
    CHAINS,
    CLOCKS,
    KK,
    LAST_COMMITMENT,
    MATRICES,
    NAMES,
    OPTIONS,
    PROBLEM,
    SUBSTITUTIONS,
    VALUES,
)
from reference_trainer.tasks.answer_context import named_matrix_reading, option_readings, options
from reference_trainer.tasks.answer_forms import chain_end
from reference_trainer.tasks.grading import grade_math, parse_free_form_assignment

TIMEOUT_S = 20  # math-verify's limit: a verdict here must not depend on the machine's load


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    LAST_COMMITMENT + CHAINS + SUBSTITUTIONS + VALUES + CLOCKS + MATRICES,
    ids=lambda v: v if isinstance(v, bool) else None,
)
def test_math_rules(response: str, gold: str, correct: bool) -> None:
    assert grade_math(response, gold, TIMEOUT_S)[1] is correct


@pytest.mark.parametrize(("response", "gold", "correct"), OPTIONS)
def test_an_option_s_text_is_its_letter(response: str, gold: str, correct: bool) -> None:
    assert grade_math(response, gold, TIMEOUT_S, PROBLEM)[1] is correct
    assert (
        grade_math(response, gold, TIMEOUT_S)[1] is False
    )  # without the problem's options, text is not a letter


def test_the_rules_helpers() -> None:
    assert chain_end("a = 1 + 1 = 2") == "a = 2"
    assert chain_end("(1+1)(2) = 2 \\cdot 2 = 4") == "4"
    assert chain_end("x = 1 + 1 \\approx 2") == "x = 1 + 1 \\approx 2"
    assert chain_end("y = 2x + 1") == "y = 2x + 1"
    assert options("(A) 1 (B) 2") == {"A": "1", "B": "2"}
    assert options("Find $f(2)$.") == {}
    assert option_readings("2", "(A) 1 (B) 2") == ["(B)"]
    assert named_matrix_reading("2\\mathbf{I}", "5") is None


@pytest.mark.parametrize(("response", "roles"), KK)
def test_kk_rules(response: str, roles: dict[str, bool] | None) -> None:
    assert parse_free_form_assignment(response, NAMES) == roles
