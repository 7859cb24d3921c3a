"""Knights and Knaves puzzles from our own generator, phrased and graded like the public K&K set.

Knights always tell the truth, knaves always lie: an assignment is consistent iff every person's
statement is true exactly when that person is a knight. Statements are nested tuples in the public set's
notation (0-based person indices): ('telling-truth', i), ('lying', i), ('not', atom), ('and' | 'or' |
'->' | '<=>', atom, atom), plus ('says', j, atom) for "J would say that ...", which is true iff
(J is a knight) == atom. A puzzle is kept only if brute force over all 2^n assignments finds exactly one
consistent assignment; otherwise its statements are redrawn.

For up to 3 people the response searches the assignments in order (knights first). Each candidate gets a
line of roles, then one line per claim checked under them, stopping at the first claim that contradicts its
speaker; the first candidate with none is the answer, given in the public format. A check writes out every
lookup it needs: the speaker and role, the claim restated from the prompt with each mentioned person's
claimed role (T/F), actual role on this candidate, and the atom's truth (t/f), then the claim's truth and
whether it fits the speaker (ok/no). For 'Nora says, "Eva is a knave." Eva says, "Nora is a knave if and
only if Eva is a knight."':

    Nora T Eva T
     Nora T: Eva=F:T f = f no
    Nora T Eva F
     Nora T: Eva=F:F t = t ok
     Eva F: Nora=F:T f <=> Eva=T:F f = t no
    Nora F Eva T
     Nora F: Eva=F:T f = f ok
     Eva T: Nora=F:F t <=> Eva=T:T t = t ok
    answer:
    (1) Nora is a knave
    (2) Eva is a knight

Every token of a check reads one thing: a name or role in the prompt's statement, a role on the candidate
line, or two truth values just written (an earlier format left the claim's truth to a single token, and a
4-layer model never learned it: benchmarks/kk_claims.py).
The search is the solver a small model can run; its length varies with where the solution lies.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from reference_trainer.option import option
from reference_trainer.tasks.base import (
    ANSWER_MARKER,
    BaseTask,
    Problem,
    TaskOptions,
    chat_prompt,
    error_probability,
    final_answer_section,
    problem_rng,
    prompt_id,
)
from reference_trainer.tasks.kk_answers import format_assignment, parse_free_form_assignment

Statement = tuple[Any, ...]

# Short, distinct names keep 8-person prompts inside the char model's context; none is a prefix-word of
# another or an English word that appears in the prompt text.
NAMES = (
    "Zoe", "Max", "Ava", "Leo", "Mia", "Sam", "Eli", "Ivy", "Ben", "Amy", "Tom", "Eva",
    "Jack", "Lily", "Owen", "Ruby", "Noah", "Emma", "Liam", "Luke", "Kate", "Nora", "Finn", "Jade",
)  # fmt: skip

SEARCH_MAX_PEOPLE = 3  # above this, a search trace would not fit the char model's context
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
    if form in ("truth", "lie"):
        return ("telling-truth" if form == "truth" else "lying", rng.randrange(n))
    if form == "not":
        return ("not", _atom(rng, rng.randrange(n)))
    x, y = rng.sample(range(n), 2)
    if form == "says":
        return ("says", x, _atom(rng, y))
    return (form, _atom(rng, x), _atom(rng, y))


def parse_compact_assignment(text: str, names: list[str]) -> dict[str, bool] | None:
    """Roles stated as "<Name> is a knight|knave" in `text` (True = knight), for every name in `names`: the
    training reward's reading of the compact format's answer section (`rlbench eval` and the chat style
    read free-form answers with `reference_trainer.tasks.kk_answers.parse_free_form_assignment`).

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


def _role(knight: bool) -> str:
    return "T" if knight else "F"


def _truth(value: bool) -> str:
    return "t" if value else "f"


def _explain_atom(atom: Statement, names: Sequence[str], knights: Sequence[bool]) -> str:
    """'Eva=F:T f': Eva is claimed a knave (F), is a knight on this line (T), so the atom is false."""
    claimed_knight = atom[0] == "telling-truth"
    actual = knights[atom[1]]
    return f"{names[atom[1]]}={_role(claimed_knight)}:{_role(actual)} {_truth(actual == claimed_knight)}"


def explain(stmt: Statement, names: Sequence[str], knights: Sequence[bool]) -> str:
    """A statement restated with every lookup its truth needs under `knights` (the search trace's check)."""
    op = stmt[0]
    if op in ("telling-truth", "lying"):
        return _explain_atom(stmt, names, knights)
    if op == "not":
        return f"not {_explain_atom(stmt[1], names, knights)}"
    if op == "says":
        return f"{names[stmt[1]]}:{_role(knights[stmt[1]])} says {_explain_atom(stmt[2], names, knights)}"
    symbol = {"and": "&", "or": "|", "->": "=>", "<=>": "<=>"}[op]
    return f"{_explain_atom(stmt[1], names, knights)} {symbol} {_explain_atom(stmt[2], names, knights)}"


def _people(num_people: Any) -> int | tuple[int, int]:
    """`num_people` checked: an int, or a pair of ints (from `--task-option num_people=[3,7]`) as a tuple;
    anything else, e.g. the string "3,7" or "abc", is refused in one line rather than failing at tuple
    unpacking."""
    if isinstance(num_people, int) and not isinstance(num_people, bool):
        lo = hi = num_people
    elif (
        isinstance(num_people, (list, tuple))
        and len(num_people) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in num_people)
    ):
        lo, hi = num_people
    else:
        raise ValueError(
            f"num_people must be an integer or a range [lo,hi] such as [3,7], got {num_people!r}"
        )
    if not 2 <= lo <= hi <= 8:
        raise ValueError(f"num_people must lie in 2..8, got {num_people}")
    return num_people if isinstance(num_people, int) else (lo, hi)


@dataclass(frozen=True)
class KKOptions(TaskOptions):
    """K&K's options."""

    num_people: int | tuple[int, int] = option((3, 7), "people per puzzle: n, or a range [lo,hi] in 2..8")
    sft_person_error: float = option(0.06, "chance that one person of an SFT trace slips")

    def check(self) -> None:
        super().check()
        object.__setattr__(self, "num_people", _people(self.num_people))  # JSON's [3,7] as a tuple


class KKTask(BaseTask):
    """Knights and Knaves with 2..8 people (`num_people`: an int, or an inclusive (lo, hi) range).

    SFT traces (`sft_response`) are a search over assignments up to SEARCH_MAX_PEOPLE people, and a
    checked statement of the solution above; both are deliberately imperfect (see `sft_response`). Because
    the solution is unique, a trace that stops at another assignment is graded wrong. With
    sft_person_error=0 the traces are always correct.
    """

    name = "kk"
    Options = KKOptions
    max_response_tokens = 1000  # a 3-person search is up to about 860 characters
    # RL runs use puzzles of 3 people (the embedded model's search traces cover up to 3); the embedded
    # model's card is measured on the same settings.
    run_options: ClassVar[dict[str, Any]] = {"num_people": 3}

    def __init__(self, options: KKOptions | None = None) -> None:
        super().__init__(options)
        people = self.options.num_people
        self.people_range = (people, people) if isinstance(people, int) else people
        self.sft_person_error = self.options.sft_person_error

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

    def _prompt(self, names: Sequence[str], statements: Sequence[Statement]) -> str:
        listing = ", ".join(names[:-1]) + f", and {names[-1]}"
        claims = " ".join(
            f'{name} says, "{render(s, names)}."' for name, s in zip(names, statements, strict=True)
        )
        text = (
            "Knights always tell the truth, and knaves always lie. "
            f"You meet {len(names)} inhabitants: {listing}. {claims} So who is a knight and who is a knave?"
        )
        return text if self.style == "compact" else chat_prompt(text, "kk")

    def gold(self, problem: Problem) -> dict[str, bool]:
        return dict(zip(problem.meta["names"], problem.meta["solution"], strict=True))

    def parse(self, problem: Problem, response: str) -> dict[str, bool] | None:
        if self.style == "chat":  # free-form answers, read as `rlbench eval` reads them
            return parse_free_form_assignment(response, problem.meta["names"])
        section = final_answer_section(response)
        return None if section is None else parse_compact_assignment(section, list(problem.meta["names"]))

    def sft_response(self, problem: Problem, rng: random.Random) -> str:
        """Up to SEARCH_MAX_PEOPLE people, a search: each line tries one assignment (knights first, in
        binary order) and checks the claims in turn, `t`/`f` for the claim's truth and `ok`/`no` for its
        consistency with the speaker's role, stopping at the first `no`; the first line without one is the
        answer. Each check reads the roles on its own line and one statement of the prompt. With
        probability `sft_person_error` a failed check is read as `ok`, so the search can stop at a wrong
        assignment. Larger puzzles (a search would not fit the context) state the roles of the answer
        and check every claim under them; with probability 1 - (1 - sft_person_error)^n one role is
        flipped and the checks follow it."""
        names: list[str] = problem.meta["names"]
        statements = problem.meta["statements"]
        if len(names) > SEARCH_MAX_PEOPLE:
            knights = list(problem.meta["solution"])
            if rng.random() < error_probability(self.sft_person_error, len(names)):
                wrong = rng.randrange(len(names))
                knights[wrong] = not knights[wrong]
            checks = [
                f"{name}: {'knight' if k else 'knave'}, claim {'true' if evaluate(s, knights) else 'false'}"
                for name, k, s in zip(names, knights, statements, strict=True)
            ]
            return "\n".join([*checks, self._answer_header(), format_assignment(names, knights)])
        lines = []
        for candidate in itertools.product((True, False), repeat=len(names)):
            knights, accepted = list(candidate), True
            lines.append(" ".join(f"{name} {_role(k)}" for name, k in zip(names, knights, strict=True)))
            for name, knight, stmt in zip(names, knights, statements, strict=True):
                truth = evaluate(stmt, knights)
                ok = knight == truth or rng.random() < self.sft_person_error
                lines.append(
                    f" {name} {_role(knight)}: {explain(stmt, names, knights)} = {_truth(truth)} "
                    f"{'ok' if ok else 'no'}"
                )
                if not ok:
                    accepted = False
                    break
            if accepted:
                break
        return "\n".join([*lines, self._answer_header(), format_assignment(names, knights)])

    def _answer_header(self) -> str:
        return ANSWER_MARKER if self.style == "compact" else "CONCLUSION:"
