"""Embedded tasks: determinism, ASCII, length tail, K&K uniqueness, rewards and imperfect SFT traces."""

from __future__ import annotations

import ast
import itertools
import json
import os
import random
import re
import statistics
from pathlib import Path

import pytest

from reference_trainer.tasks import (
    TASKS,
    ArithOptions,
    ArithTask,
    KKOptions,
    KKTask,
    Problem,
    get_task,
    parse_compact_assignment,
)
from reference_trainer.tasks.base import final_answer_section, is_ascii_text
from reference_trainer.tasks.kk import solve

DATA_DIR = Path(os.environ.get("RLBENCH_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="module")
def arith_problems() -> list[Problem]:
    return ArithTask().problems(2000, seed=0)


@pytest.fixture(scope="module")
def kk_problems() -> list[Problem]:
    return KKTask(KKOptions(num_people=(2, 8))).problems(300, seed=0)


# --- registry and determinism ---------------------------------------------------------------------


def test_registry_and_unknown_name() -> None:
    assert set(TASKS) == {"arith", "kk"}
    assert isinstance(get_task("arith", max_ops=10), ArithTask)
    assert get_task("kk", num_people=4).people_range == (4, 4)
    with pytest.raises(ValueError, match="arith, kk"):
        get_task("gsm8k")


def test_a_task_takes_its_options_as_one_record() -> None:
    from rlbench.commands.modes import registry_doc

    task = get_task("kk", num_people=[3, 4], style="chat")
    assert task.options == KKOptions(num_people=(3, 4), style="chat") and task.people_range == (3, 4)
    with pytest.raises(ValueError, match="takes no option 'max_ops'"):
        get_task("kk", max_ops=3)
    listed = registry_doc()["tasks"]  # `rlbench modes` reads the record's fields
    assert listed["arith"]["options"]["max_ops"]["default"] == ArithOptions().max_ops == 16
    assert listed["kk"]["run_options"] == {"num_people": 3}


@pytest.mark.parametrize("name", ["arith", "kk"])
def test_problems_deterministic_by_seed_and_index(name: str) -> None:
    task = get_task(name)
    full = task.problems(20, seed=3)
    assert task.problems(10, seed=3, start=5) == full[5:15]
    assert get_task(name).problems(20, seed=3) == full  # a fresh instance gives the same problems
    assert full[7].prompt_id == f"{name}-s3-000007"
    other = task.problems(20, seed=4)
    assert sum(a.prompt != b.prompt for a, b in zip(full, other, strict=True)) >= 15
    assert len({p.prompt for p in full}) >= 18


@pytest.mark.parametrize("name", ["arith", "kk"])
def test_prompts_and_traces_are_ascii(name: str) -> None:
    task = get_task(name)
    rng = random.Random(0)
    for p in task.problems(200, seed=1):
        response = task.sft_response(p, rng)
        assert is_ascii_text(p.prompt) and is_ascii_text(response) and is_ascii_text(p.answer)
        assert final_answer_section(response) is not None


def test_final_answer_section_takes_last_marker_at_line_start() -> None:
    assert final_answer_section("x\nanswer: 1\nanswer: 2 ") == "2"
    assert final_answer_section("the answer: 3") is None  # marker must start a line
    assert final_answer_section("  ANSWER:\t5\n") == "5"
    assert final_answer_section("no marker") is None


# --- arith ------------------------------------------------------------------------------------------


def _recompute(p: Problem) -> int:
    value = p.meta["start"]
    for op, k in p.meta["ops"]:
        value = {"+": value + k, "-": value - k, "*": value * k}[op]
        assert 0 <= value <= 99
    return value


def test_arith_gold_matches_recomputation_and_prompt(arith_problems: list[Problem]) -> None:
    for p in arith_problems[:300]:
        assert int(p.answer) == _recompute(p)
        ops_text = " ".join(f"{op}{k}" for op, k in p.meta["ops"])
        assert p.prompt == f"Start with {p.meta['start']}, apply in order: {ops_text}. Result?"
        assert len(p.meta["ops"]) == p.meta["num_ops"]


def test_arith_response_length_is_heavy_tailed(arith_problems: list[Problem]) -> None:
    task = ArithTask(ArithOptions(sft_step_error=0.0))
    rng = random.Random(0)
    lengths = sorted(len(task.sft_response(p, rng)) for p in arith_problems)
    median = statistics.median(lengths)
    p99 = lengths[int(0.99 * len(lengths))]
    # Measured at seed 0: median 37, p99 345, max 349 chars (length grows as ~k^2 in the operations).
    assert 6.0 <= p99 / median <= 12.0
    assert lengths[-1] < 400  # fits the default max_tokens: no rollout is cut
    ops = [p.meta["num_ops"] for p in arith_problems]
    assert min(ops) == 2 and max(ops) <= 16
    assert statistics.median(ops) <= 5


def test_arith_tail_exponent_controls_the_tail() -> None:
    heavy = [p.meta["num_ops"] for p in ArithTask(ArithOptions(tail_exponent=1.2)).problems(500, seed=0)]
    light = [p.meta["num_ops"] for p in ArithTask(ArithOptions(tail_exponent=3.0)).problems(500, seed=0)]
    assert statistics.mean(heavy) > 1.8 * statistics.mean(light)  # 5.9 vs 2.9 with max_ops 16
    assert all(
        3 <= k <= 6
        for k in (
            p.meta["num_ops"] for p in ArithTask(ArithOptions(min_ops=3, max_ops=6)).problems(100, seed=0)
        )
    )


def test_arith_reward_parsing() -> None:
    task = ArithTask()
    p = Problem("arith-s0-000000", "Start with 9, apply in order: +9 *3 +1. Result?", "55", {})
    assert task.reward(p, "9+9=18\n18*3=54\n54+1=55\nanswer: 55") == 1.0
    assert task.reward(p, "answer:55") == 1.0
    assert task.reward(p, "  answer:   55  \n\n") == 1.0  # extra whitespace
    assert task.reward(p, "answer: 54\nanswer: 55") == 1.0  # the last answer line counts
    assert task.reward(p, "answer: 55\nanswer: 54") == 0.0
    assert task.reward(p, "9+9=18\nanswer: 56") == 0.0  # wrong
    malformed_answers = ["", "55", "answer 55", "answer: 5 5", "answer: 55 apples", "answer: fifty"]
    malformed_answers += ["answer:", "answer: 55\nmore text", "the answer: 55"]
    malformed_answers += ["answer: \u0665\u0665"]  # Arabic-Indic digits: str.isdigit() accepts them
    for malformed in malformed_answers:
        assert task.reward(p, malformed) == 0.0, malformed
        assert not task.is_correct(p, malformed)
    neg = Problem("arith-s0-000001", "", "-3", {})
    assert task.is_correct(neg, "answer: -3") and not task.is_correct(neg, "answer: 3")


def test_arith_format_reward_is_optional() -> None:
    task = ArithTask(ArithOptions(format_reward=0.1))
    p = Problem("x", "", "7", {})
    assert task.reward(p, "answer: 7") == 1.0
    assert task.reward(p, "answer: 8") == 0.1
    assert task.reward(p, "answer: eight") == 0.0
    with pytest.raises(ValueError):
        ArithTask(ArithOptions(format_reward=1.0))


def test_arith_sft_traces_are_imperfect_with_one_propagated_slip(arith_problems: list[Problem]) -> None:
    """Each line applies the first operation of the line above and copies the rest; at most one value
    is off, and every later line starts from it."""
    task, rng = ArithTask(), random.Random(0)
    problems = arith_problems[:500]
    correct = 0
    for p in problems:
        response = task.sft_response(p, rng)
        lines = [re.fullmatch(r"(-?\d+) ?((?:[+*-]\d)*)", line) for line in response.split("\n")[:-1]]
        assert all(lines) and len(lines) == p.meta["num_ops"] + 1
        assert int(lines[0].group(1)) == p.meta["start"]
        assert lines[0].group(2) == "".join(f"{op}{k}" for op, k in p.meta["ops"])
        bad = 0
        for above, line in zip(lines, lines[1:], strict=False):
            op, k, rest = above.group(2)[0], int(above.group(2)[1]), above.group(2)[2:]
            assert line.group(2) == rest
            bad += int(line.group(1)) != {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](
                int(above.group(1)), k
            )
        ok = task.is_correct(p, response)
        assert bad == (0 if ok else 1)
        correct += ok
    assert 0.8 <= correct / len(problems) <= 0.95  # measured 0.874 (seed 0)
    exact = ArithTask(ArithOptions(sft_step_error=0.0))
    assert all(exact.is_correct(p, exact.sft_response(p, rng)) for p in problems)


# --- knights and knaves -----------------------------------------------------------------------------


def _independent_eval(stmt: tuple, knights: tuple[bool, ...]) -> bool:
    """A second evaluator, written differently from the module's, so the uniqueness test is not circular."""
    op, *args = stmt
    sub = [_independent_eval(a, knights) if isinstance(a, tuple) else a for a in args]
    table = {
        "telling-truth": lambda: knights[sub[0]],
        "lying": lambda: not knights[sub[0]],
        "not": lambda: not sub[0],
        "and": lambda: all(sub),
        "or": lambda: any(sub),
        "->": lambda: sub[1] or not sub[0],
        "<=>": lambda: sub[0] == sub[1],
        "says": lambda: knights[sub[0]] == sub[1],
    }
    return table[op]()


def _brute_force(statements: tuple, n: int) -> list[tuple[bool, ...]]:
    return [
        k
        for k in itertools.product((False, True), repeat=n)
        if all(k[i] == _independent_eval(s, k) for i, s in enumerate(statements))
    ]


def test_kk_solution_is_unique_by_brute_force(kk_problems: list[Problem]) -> None:
    sizes = set()
    for p in kk_problems:
        n = p.meta["num_people"]
        sizes.add(n)
        assert _brute_force(p.meta["statements"], n) == [tuple(p.meta["solution"])]
        assert len(p.meta["names"]) == len(set(p.meta["names"])) == n
        assert p.answer == "\n".join(
            f"({i + 1}) {name} is a {'knight' if k else 'knave'}"
            for i, (name, k) in enumerate(zip(p.meta["names"], p.meta["solution"], strict=True))
        )
    assert sizes == set(range(2, 9))


def test_kk_statement_forms_and_prompt_phrasing(kk_problems: list[Problem]) -> None:
    ops = {s[0] for p in kk_problems for s in p.meta["statements"]}
    assert ops == {"telling-truth", "lying", "not", "and", "or", "->", "<=>", "says"}
    text = " ".join(p.prompt for p in kk_problems)
    for phrase in ("are both knights", "are both knaves", "if and only if", "would say that", "is not a"):
        assert phrase in text
    p = kk_problems[0]
    assert p.prompt.startswith("Knights always tell the truth, and knaves always lie. You meet ")
    assert p.prompt.endswith("So who is a knight and who is a knave?")
    for name in p.meta["names"]:
        assert f'{name} says, "' in p.prompt


def test_kk_people_range_and_context_budget() -> None:
    assert {p.meta["num_people"] for p in KKTask(KKOptions(num_people=(3, 5))).problems(60, seed=0)} == {
        3,
        4,
        5,
    }
    # the embedded model's context is 1536 characters: 8-person checks and 3-person searches fit in it
    for people, budget in ((8, 1000), (3, 1400)):
        task, rng = KKTask(KKOptions(num_people=people)), random.Random(0)
        for p in task.problems(200, seed=0):
            assert len(p.prompt) + len(task.sft_response(p, rng)) < budget
    for bad in (1, 9, (1, 3), (5, 4)):
        with pytest.raises(ValueError):
            KKTask(KKOptions(num_people=bad))


def test_parse_compact_assignment() -> None:
    names = ["Zoey", "Oliver"]
    expected = {"Zoey": False, "Oliver": True}
    assert parse_compact_assignment("(1) Zoey is a knave\n(2) Oliver is a knight", names) == expected
    assert parse_compact_assignment("  zoey   is a KNAVE,\n oliver is a knight.  ", names) == expected
    assert parse_compact_assignment("Oliver is a knight and Zoey is a knave", names) == expected
    assert parse_compact_assignment("(1) Zoey is a knave", names) is None  # a name is missing
    assert parse_compact_assignment("Zoey is a knave\nZoey is a knight\nOliver is a knight", names) is None
    assert parse_compact_assignment("Zoey is not a knight\nOliver is a knight", names) is None
    assert parse_compact_assignment("Elizabeth is a knight", ["Eli"]) is None  # whole names only
    assert parse_compact_assignment("Eli is a knave, Elizabeth is a knight", ["Eli", "Elizabeth"]) == {
        "Eli": False,
        "Elizabeth": True,
    }


def test_kk_reward() -> None:
    task = KKTask()
    p = task.problems(1, seed=0)[0]
    names, sol = p.meta["names"], p.meta["solution"]
    assert task.reward(p, "answer:\n" + p.answer) == 1.0
    spaced = "Zoe: knight, claim true\n  Answer:  \n\n" + p.answer.replace(" is", "  is") + "\n"
    assert task.reward(p, spaced) == 1.0
    wrong = [not sol[0], *sol[1:]]
    wrong_text = "\n".join(
        f"{n} is a {'knight' if k else 'knave'}" for n, k in zip(names, wrong, strict=True)
    )
    assert task.reward(p, "answer:\n" + wrong_text) == 0.0
    assert task.reward(p, p.answer) == 0.0  # no answer marker
    # Roles stated only in the reasoning before the marker are not graded.
    assert task.reward(p, p.answer + "\nanswer:\n" + wrong_text) == 0.0
    assert task.reward(p, "answer:\n" + p.answer.rsplit("\n", 1)[0]) == 0.0  # last person missing
    assert KKTask(KKOptions(format_reward=0.2)).reward(p, "answer:\n" + wrong_text) == 0.2


def test_kk_sft_search_traces_write_each_lookup_and_stop_at_the_first_pass() -> None:
    """Up to 3 people: candidates in binary order, a roles line each, then one line per claim checked under
    those roles. Each atom names the person, the role the claim gives them, their role on the candidate
    and the atom's truth; the claim's truth follows, then ok/no (its consistency with the speaker's role).
    A candidate ends at its first no; the answer is the first candidate without one. A slip is an
    inconsistent check read as ok; on the accepted candidate it makes the answer wrong. Checked against
    this file's own evaluator, not the module's."""
    task, rng = KKTask(KKOptions(num_people=(2, 3))), random.Random(0)
    problems = task.problems(300, seed=2)
    check_line = re.compile(r" (\w+) ([TF]): (.*) = ([tf]) (ok|no)")
    atom = re.compile(r"(\w+)=([TF]):([TF]) ([tf])")
    correct = 0
    for p in problems:
        names, statements = p.meta["names"], p.meta["statements"]
        lines = task.sft_response(p, rng).split("\n")
        body = lines[: lines.index("answer:")]
        starts = [i for i, line in enumerate(body) if not line.startswith(" ")]
        assert starts[0] == 0
        for c, start in enumerate(starts):
            roles = body[start].split()
            assert roles[0::2] == names
            knights = tuple(r == "T" for r in roles[1::2])
            assert knights == list(itertools.product((True, False), repeat=len(names)))[c]
            checks = body[start + 1 : starts[c + 1] if c + 1 < len(starts) else len(body)]
            accepted = c == len(starts) - 1
            slipped = False  # a slip decides the answer only on the accepted candidate
            for j, line in enumerate(checks):
                match = check_line.fullmatch(line)
                assert match is not None, line
                speaker, role, claim, truth, verdict = match.groups()
                assert (speaker, role) == (names[j], roles[2 * j + 1])
                atoms = atom.findall(claim)
                stmt = statements[j]
                assert len(atoms) == (2 if stmt[0] in ("and", "or", "->", "<=>") else 1)
                for name, claimed, actual, value in atoms:
                    assert actual == roles[2 * names.index(name) + 1]
                    assert value == ("t" if claimed == actual else "f")
                expected = _independent_eval(stmt, knights)
                assert truth == ("t" if expected else "f")
                consistent = knights[j] == expected
                assert verdict == "ok" or not consistent
                slipped |= verdict == "ok" and not consistent
            verdicts = [line.endswith(" no") for line in checks]
            assert verdicts == [False] * (len(checks) - 1) + [not accepted]
            assert not accepted or len(checks) == len(names)
        ok = task.is_correct(p, "\n".join(lines))
        assert ok == (not slipped)
        correct += ok
    assert 0.8 <= correct / len(problems) <= 0.98  # measured 0.92 (seed 0)
    exact = KKTask(KKOptions(sft_person_error=0.0))
    assert all(exact.is_correct(p, exact.sft_response(p, rng)) for p in problems)


def test_kk_sft_traces_for_larger_puzzles_flip_at_most_one_role() -> None:
    task, rng = KKTask(KKOptions(num_people=(4, 7))), random.Random(0)
    problems = task.problems(300, seed=2)
    correct = 0
    for p in problems:
        response = task.sft_response(p, rng)
        parsed = task.parse(p, response)
        assert parsed is not None
        flips = sum(parsed[n] != k for n, k in zip(p.meta["names"], p.meta["solution"], strict=True))
        assert flips in (0, 1)
        ok = task.is_correct(p, response)
        assert ok == (flips == 0)
        correct += ok
    assert 0.6 <= correct / len(problems) <= 0.85
    exact = KKTask(KKOptions(sft_person_error=0.0))
    assert all(exact.is_correct(p, exact.sft_response(p, rng)) for p in problems)


@pytest.mark.skipif(not (DATA_DIR / "kk_logic.jsonl").exists(), reason="public K&K copy not present")
def test_kk_semantics_and_parser_agree_with_public_set() -> None:
    """Our evaluator finds the public puzzles' unique solutions, and the parser reads their gold answers."""
    rows = [json.loads(line) for line in (DATA_DIR / "kk_logic.jsonl").read_text().splitlines()[::5]]
    for row in rows:
        statements = ast.literal_eval(row["statements"])
        assert solve(statements) == [tuple(row["solution"])]
        expected = {n: row["assignment"][n] == "knight" for n in row["names"]}
        assert parse_compact_assignment(row["answer"], row["names"]) == expected


def test_chat_style_prompts_ask_for_eval_formats_and_grade_like_eval() -> None:
    """The chat style (pretrained instruct models): natural-language prompts with `rlbench eval`'s
    instructions, graded by math-verify (arith) and the free-form K&K parser; same problems as compact."""
    from reference_trainer.tasks.grading import KK_INSTRUCTION, MATH_INSTRUCTION, grade_math

    arith, compact = get_task("arith", style="chat"), get_task("arith")
    p, pc = arith.problems(1, seed=3)[0], compact.problems(1, seed=3)[0]
    assert p.answer == pc.answer and p.meta == pc.meta
    assert p.prompt.endswith(MATH_INSTRUCTION) and "answer:" not in p.prompt
    words = {"+": "add", "-": "subtract", "*": "multiply by"}
    assert all(f"{words[op]} {k}" in p.prompt for op, k in p.meta["ops"])
    gold = p.answer
    assert arith.reward(p, f"So we get $\\boxed{{{gold}}}$.") == 1.0
    assert arith.reward(p, f"Result: \\boxed{{{int(gold) + 1}}}") == 0.0
    for response in (f"answer: {gold}", f"It is {gold}.", f"{gold} + 1 = {int(gold) + 1}", "no idea"):
        assert arith.is_correct(p, response) == grade_math(response, gold)[1]  # exactly as eval grades
    assert get_task("arith", style="chat", format_reward=0.1).reward(p, "\\boxed{9999}") == 0.1
    assert arith.reward(p, arith.sft_response(p, random.Random(0))) in (0.0, 1.0)

    kk = get_task("kk", num_people=3, style="chat")
    q = kk.problems(1, seed=3)[0]
    assert q.prompt.endswith(KK_INSTRUCTION)
    names, solution = q.meta["names"], q.meta["solution"]
    free_form = "Let me think.\nCONCLUSION:\n" + "\n".join(
        f"{n} must be a {'knight' if s else 'knave'}" for n, s in zip(names, solution, strict=True)
    )
    assert kk.reward(q, free_form) == 1.0
    flipped = free_form.replace("knight", "KNAVE").replace("knave", "knight").replace("KNAVE", "knave")
    assert kk.reward(q, flipped) == 0.0
    with pytest.raises(ValueError, match="style"):
        get_task("kk", style="verbose")
