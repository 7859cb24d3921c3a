"""Knights and Knaves puzzles from our own generator, phrased and graded like the public K&K set.

Knights always tell the truth, knaves always lie: an assignment is consistent iff every person's
statement is true exactly when that person is a knight. Statements are nested tuples in the public set's
notation (0-based person indices): ('telling-truth', i), ('lying', i), ('not', atom), ('and' | 'or' |
'->' | '<=>', atom, atom), plus ('says', j, atom) for "J would say that ...", which is true iff
(J is a knight) == atom. A puzzle is kept only if brute force over all 2^n assignments finds exactly one
consistent assignment; otherwise its statements are redrawn.

The response is a short check of every claim under the chosen roles, then the answer in the public
format:

    Zoe: knave, claim false
    Max: knight, claim true
    answer:
    (1) Zoe is a knave
    (2) Max is a knight
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from typing import Any

from reference_trainer.tasks.base import (
    ANSWER_MARKER,
    BaseTask,
    Problem,
    error_probability,
    final_answer_section,
    problem_rng,
    prompt_id,
)

Statement = tuple[Any, ...]

# Short, distinct names keep 8-person prompts inside the char model's context; none is a prefix-word of
# another or an English word that appears in the prompt text.
NAMES = (
    "Zoe", "Max", "Ava", "Leo", "Mia", "Sam", "Eli", "Ivy", "Ben", "Amy", "Tom", "Eva",
    "Jack", "Lily", "Owen", "Ruby", "Noah", "Emma", "Liam", "Luke", "Kate", "Nora", "Finn", "Jade",
)  # fmt: skip

_FORMS = ("truth", "lie", "not", "and", "or", "->", "<=>", "says")
_FORM_WEIGHTS = (2, 2, 1, 2, 2, 2, 2, 1)
_MAX_TRIES = 100_000


def evaluate(stmt: Statement, knights: Sequence[bool]) -> bool:
    """Truth value of a statement given who is a knight (True) or a knave (False)."""
    op = stmt[0]
    if op == "telling-truth":
        return knights[stmt[1]]
    if op == "lying":
        return not knights[stmt[1]]
    if op == "not":
        return not evaluate(stmt[1], knights)
    if op == "and":
        return evaluate(stmt[1], knights) and evaluate(stmt[2], knights)
    if op == "or":
        return evaluate(stmt[1], knights) or evaluate(stmt[2], knights)
    if op == "->":
        return (not evaluate(stmt[1], knights)) or evaluate(stmt[2], knights)
    if op == "<=>":
        return evaluate(stmt[1], knights) == evaluate(stmt[2], knights)
    if op == "says":
        return knights[stmt[1]] == evaluate(stmt[2], knights)
    raise ValueError(f"unknown statement op {op!r}")


def consistent(statements: Sequence[Statement], knights: Sequence[bool]) -> bool:
    return all(knights[i] == evaluate(s, knights) for i, s in enumerate(statements))


def solve(statements: Sequence[Statement], limit: int | None = None) -> list[tuple[bool, ...]]:
    """All consistent assignments by brute force over 2^n (stops after `limit` when given)."""
    found: list[tuple[bool, ...]] = []
    for knights in itertools.product((True, False), repeat=len(statements)):
        if consistent(statements, knights):
            found.append(knights)
            if limit is not None and len(found) >= limit:
                break
    return found


def render(stmt: Statement, names: Sequence[str]) -> str:
    op = stmt[0]
    if op == "telling-truth":
        return f"{names[stmt[1]]} is a knight"
    if op == "lying":
        return f"{names[stmt[1]]} is a knave"
    if op == "not":
        return f"{names[stmt[1][1]]} is not a {'knight' if stmt[1][0] == 'telling-truth' else 'knave'}"
    if op == "says":
        return f"{names[stmt[1]]} would say that {render(stmt[2], names)}"
    a, b = stmt[1], stmt[2]
    if op in ("and", "or") and a[0] == b[0]:
        role = "knight" if a[0] == "telling-truth" else "knave"
        if op == "and":
            return f"{names[a[1]]} and {names[b[1]]} are both {role}s"
        return f"{names[a[1]]} or {names[b[1]]} is a {role}"
    if op == "->":
        return f"if {render(a, names)} then {render(b, names)}"
    joiner = {"and": "and", "or": "or", "<=>": "if and only if"}[op]
    return f"{render(a, names)} {joiner} {render(b, names)}"


def _atom(rng: random.Random, person: int) -> Statement:
    return (rng.choice(("telling-truth", "lying")), person)


def random_statement(rng: random.Random, n: int) -> Statement:
    form = rng.choices(_FORMS, weights=_FORM_WEIGHTS)[0]
    if form == "truth":
        return ("telling-truth", rng.randrange(n))
    if form == "lie":
        return ("lying", rng.randrange(n))
    if form == "not":
        return ("not", _atom(rng, rng.randrange(n)))
    x, y = rng.sample(range(n), 2)
    if form == "says":
        return ("says", x, _atom(rng, y))
    return (form, _atom(rng, x), _atom(rng, y))


def parse_kk_assignment(text: str, names: list[str]) -> dict[str, bool] | None:
    """Roles stated as "<Name> is a knight|knave" in `text` (True = knight), for every name in `names`.

    Returns None when any name has no such statement, or has both roles stated (hedging is not an
    answer). Case-insensitive, tolerant of extra spaces and numbering like "(1)"; whole-word names, so
    "Eli" never matches inside "Elizabeth". Pass only the final-answer part of a response: the reasoning
    before it may mention trial roles.
    """
    result: dict[str, bool] = {}
    for name in names:
        pattern = rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])\s+is\s+an?\s+(knight|knave)\b"
        roles = {m.group(1).lower() for m in re.finditer(pattern, text, flags=re.IGNORECASE)}
        if len(roles) != 1:
            return None
        result[name] = roles.pop() == "knight"
    return result


def format_assignment(names: Sequence[str], knights: Sequence[bool]) -> str:
    """The public set's solution format: "(1) Zoe is a knave\\n(2) Max is a knight"."""
    roles = ("knight" if k else "knave" for k in knights)
    return "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(names, roles, strict=True)))


class KKTask(BaseTask):
    """Knights and Knaves with 2..8 people (`num_people`: an int, or an inclusive (lo, hi) range).

    SFT traces (`sft_response`) are deliberately imperfect: with probability
    1 - (1 - sft_person_error)^n (more people, more slips) the trace commits to the wrong role for one
    person chosen uniformly; the claim checks are then written for that wrong assignment (so at least one
    line is visibly inconsistent) and the answer states it. Because the solution is unique, a slipped
    trace is always graded wrong: SFT accuracy is exactly 1 - E[slip probability]. With
    sft_person_error=0 the traces are always correct.
    """

    name = "kk"

    def __init__(
        self,
        num_people: int | tuple[int, int] = (3, 7),
        sft_person_error: float = 0.06,
        format_reward: float = 0.0,
    ) -> None:
        super().__init__(format_reward)
        lo, hi = (num_people, num_people) if isinstance(num_people, int) else num_people
        if not 2 <= lo <= hi <= 8:
            raise ValueError(f"num_people must lie in 2..8, got {num_people}")
        self.people_range = (lo, hi)
        self.sft_person_error = sft_person_error

    def problem(self, seed: int, index: int) -> Problem:
        rng = problem_rng(self.name, seed, index)
        n = rng.randint(*self.people_range)
        names = rng.sample(NAMES, n)
        for _ in range(_MAX_TRIES):
            statements = tuple(random_statement(rng, n) for _ in range(n))
            solutions = solve(statements, limit=2)
            if len(solutions) == 1:
                break
        else:  # pragma: no cover - uniqueness is found within a few hundred draws for n <= 8
            raise RuntimeError(f"no unique K&K puzzle found for n={n}")
        knights = solutions[0]
        return Problem(
            prompt_id=prompt_id(self.name, seed, index),
            prompt=self._prompt(names, statements),
            answer=format_assignment(names, knights),
            meta={"num_people": n, "names": list(names), "solution": list(knights), "statements": statements},
        )

    @staticmethod
    def _prompt(names: Sequence[str], statements: Sequence[Statement]) -> str:
        listing = ", ".join(names[:-1]) + f", and {names[-1]}"
        claims = " ".join(
            f'{name} says, "{render(s, names)}."' for name, s in zip(names, statements, strict=True)
        )
        return (
            "Knights always tell the truth, and knaves always lie. "
            f"You meet {len(names)} inhabitants: {listing}. {claims} So who is a knight and who is a knave?"
        )

    def gold(self, problem: Problem) -> dict[str, bool]:
        return dict(zip(problem.meta["names"], problem.meta["solution"], strict=True))

    def parse(self, problem: Problem, response: str) -> dict[str, bool] | None:
        section = final_answer_section(response)
        if section is None:
            return None
        return parse_kk_assignment(section, list(problem.meta["names"]))

    def sft_response(self, problem: Problem, rng: random.Random) -> str:
        names: list[str] = problem.meta["names"]
        knights = list(problem.meta["solution"])
        if rng.random() < error_probability(self.sft_person_error, len(names)):
            wrong = rng.randrange(len(names))
            knights[wrong] = not knights[wrong]
        checks = []
        for name, knight, stmt in zip(names, knights, problem.meta["statements"], strict=True):
            role = "knight" if knight else "knave"
            checks.append(f"{name}: {role}, claim {'true' if evaluate(stmt, knights) else 'false'}")
        return "\n".join([*checks, ANSWER_MARKER, format_assignment(names, knights)])
