"""Hand-written cases of the grading rules of docs/eval.md, one table per rule: the last commitment, an
equality chain's last value, a substitution, values written with signs or words, clock times, options,
named matrices, and a K&K answer read from the conclusion only (references, any case, negations, quoted
claims). Each maths row is (response, gold, correct?); a False row is a wrong answer a looser rule would
credit. `tests/test_grading_rules.py` tests them rule by rule; `python -m benchmarks.grader_cases --set rules`
grades them as `rlbench eval` does, with the reported examples the rules came from (`REPORTED_EXAMPLES`).
"""

from __future__ import annotations

from typing import NamedTuple


class RuleCase(NamedTuple):
    response: str
    gold: str
    correct: bool
    problem: str = ""
    kind: str = ""
    grader: str = "math"
    names: list[str] | None = None
    solution: list[bool] | None = None


# The final answer is the last one the response commits to.
LAST_COMMITMENT = [
    (r"Thus $k = \boxed{12}$. Hmm, wait: I counted the corner twice. Removing it, $k = 11$.", "11", True),
    (r"Thus $k = \boxed{12}$. Hmm, wait: I counted the corner twice. Removing it, $k = 11$.", "12", False),
    (r"The area is $\boxed{40}$. Actually the base is 9, not 8, so the area is $45$.", "45", True),
    (r"The area is $\boxed{40}$. Actually the base is 9, not 8, so the area is $45$.", "40", False),
    (r"So $p + q = \boxed{17}$. Recomputing the sum with $q = 9$ instead: $p + q = 16$.", "16", True),
    (r"Hence $a+b = \boxed{7}$. Then squaring, $(a+b)^2 = 49$, which is consistent.", "7", True),
    (r"So the answer is $\boxed{8}$. Let me double-check: $2^3 = 8$. Yes.", "8", True),
]

# An equality chain yields its last value; the name it opens with stays.
CHAINS = [
    (r"So $(40+3)(40-3) = 1600 - 9 = 1591$.", "1591", True),
    (r"So $(40+3)(40-3) = 1600 - 9 = 1591$.", "1600", False),
    (r"Therefore $(2-i)(2+i) = 4 - i^2 = 5$.", "5", True),
    (r"\boxed{S = 3 + 4 + 5 = 12}", "12", True),
    (r"\boxed{S = 3 + 4 + 5 = 12}", "13", False),
    (r"\boxed{y = 2 + 2 + 2 = 7}", "7", True),  # a false middle step: the value committed to is 7
    (r"$x = 2$ or $x = 1$.", "1, 2", True),  # a list of equations is no chain
]

# A substitution is not an answer: the answer is the result it leads to.
SUBSTITUTIONS = [
    (r"Plugging in $n = 2$ we get $g(n) = n^2 + 1$ works, so the only function is $g(n) = n^2 + 1$.",
     r"g(n) = n^2 + 1", True),
    (r"Setting $t = 0$ gives $h(0) = 4$. Hence the solution is $h(t) = 4e^{t}$.", r"h(t) = 4e^t", True),
    (r"Setting $t = 0$ gives $h(0) = 4$. Hence the solution is $h(t) = 4e^{t}$.", "0", False),
    (r"So the polynomial is $p(x) = x^2 - 2$. Plugging in $x = 3$ checks out.", "p(x) = x^2 - 2", True),
    (r"So the polynomial is $p(x) = x^2 - 2$. Plugging in $x = 3$ checks out.", "3", False),
]  # fmt: skip

# Numbers in words, currency and unit signs, infinity: compared by value.
VALUES = [
    (r"\boxed{\text{thirty-seven}}", "37", True),
    (r"The answer is three hundred twelve metres.", "312", True),
    (r"The answer is three hundred twelve metres.", "302", False),
    (r"\boxed{€ 45}", "45", True),
    (r"\boxed{Rs. 250}", "250", True),
    (r"The ticket costs R65.", "65", True),
    (r"The ticket costs R65.", "56", False),
    (r"\boxed{∞}", r"\infty", True),
    (r"\boxed{-∞}", r"\infty", False),
    (r"The sum diverges to infinity.", r"\infty", True),
]

PROBLEM = "Which solid has exactly one face? (A) Cube (B) Cone (C) Sphere (D) Prism (E) Pyramid"
OPTIONS = [
    (r"\boxed{\text{Sphere}}", r"\text{(C)}", True),
    (r"\boxed{\text{sphere}}", "C", True),
    (r"\boxed{\text{Cone}}", r"\text{(C)}", False),
    (r"\boxed{(C)}", "Sphere", True),
    (r"\boxed{(B)}", "Sphere", False),
]

MATRIX = r"\begin{pmatrix} 3 & 0 & 0 \\ 0 & 3 & 0 \\ 0 & 0 & 3 \end{pmatrix}"
MATRICES = [
    (r"\boxed{3\mathbf{I}}", MATRIX, True),
    (r"\boxed{3I_3}", MATRIX, True),
    (r"\boxed{-3\mathbf{I}}", MATRIX, False),
    (r"\boxed{\mathbf{I}}", MATRIX, False),
    (r"\boxed{\mathbf{0}}", r"\begin{pmatrix} 0 & 0 \\ 0 & 0 \end{pmatrix}", True),
]

CLOCKS = [
    (r"\boxed{07:15:00}", "07:15", True),
    (r"\boxed{7:15}", r"\text{07:15:00}", True),
    (r"\boxed{07:15:30}", "07:15", False),
    (r"\boxed{07:16}", r"07:15:00", False),
]


NAMES = ["Mila", "Oscar", "Lena", "Hugo"]


def _roles(*knights: int) -> dict[str, bool]:
    return dict(zip(NAMES, map(bool, knights), strict=True))


# (response, roles it states: None when it states no answer)
KK = [
    # references resolve
    ("Mila is a knave. So is Hugo. Oscar and Lena, however, are knights.", _roles(0, 1, 1, 0)),
    ("Lena is a knight, and Hugo is too. Mila is not a knight; neither is Oscar.", _roles(0, 0, 1, 1)),
    ("Therefore Oscar is the knave and the other three are knights.", _roles(1, 0, 1, 1)),
    ("Hugo lies, while everyone else tells the truth.", _roles(1, 1, 1, 0)),
    ("Mila and Lena are knights. The rest are knaves.", _roles(1, 0, 1, 0)),
    ("Mila is a knight. The other two are knaves.", None),  # three others, not two
    # roles in any case, names written in lower case where the phrasing says they are names
    ("mila: KNAVE\noscar: Knight\nlena: knave\nhugo: KNIGHT", _roles(0, 1, 0, 1)),
    ("Mila isn't a knight. Oscar is no knave. Lena does not lie. Hugo is not truthful.", _roles(0, 1, 1, 0)),
    # a quoted claim is never the conclusion; a person never concluded leaves the answer unread
    ('Hugo declared, "Hugo is a knight and Mila is a knave". So Oscar, Lena and Mila are knights.', None),
    ('So Mila, Oscar and Lena are knights. Recall that Lena remarked "Hugo is a knave".', None),
    ("So Mila is a knight, Oscar is a knight, Lena is a knave.", None),
]


# The examples the rules were written from: a box taken back, a person never concluded, and the false
# negatives by kind (the rules' own tables above are new examples of the same kinds).
REPORTED_EXAMPLES = [
    (r"…so $m + n = \boxed{3}$. Wait, the recursion for $P(9)$ should include the jump of size 1 twice. "
     r"Redoing it gives $\frac{1}{3}$, so $m + n = 4$.", "3", False),
    (r"…so $m + n = \boxed{3}$. Wait, the recursion for $P(9)$ should include the jump of size 1 twice. "
     r"Redoing it gives $\frac{1}{3}$, so $m + n = 4$.", "4", True),
    (r"So $(513 - 487)(513 + 487) = 26 \cdot 1000 = 26{,}000$.", "26000", True),
    (r"Hence $(1+i)^2 = 1 + 2i + i^2 = 2i$.", "2i", True),
    (r"Substituting $y = 1$ gives $f(x) f(1) = f(x)$, so the only solution is $f(x) = \frac{1}{x}$.",
     r"f(x) = \frac{1}{x}", True),
    (r"$x = 5+5+1 = 1/3$", r"\frac{1}{3}", True),
    ("The answer is fifty-five.", "55", True),
    ("It takes two hundred four minutes.", "204", True),
    (r"\boxed{R28}", "28", True),
    ("The limit is infinity.", r"\infty", True),
    (r"\boxed{-\mathbf{I}}", r"\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}", True),
    (r"The train arrives at $20:34$.", r"\text{20:34:00}", True),
]  # fmt: skip
REPORTED_OPTION = (
    r"\boxed{\text{Plane}}",
    r"\text{(C)}",
    True,
    "Which is it? (A) Line (B) Point (C) Plane (D) Cone",
)
REPORTED_KK = [
    ('Michael commented, "Michael is a knight". So Owen is a knight, Aiden is a knight, Henry is a knight.',
     ["Owen", "Aiden", "Henry", "Michael"], [True, True, True, True], False),
    ("William is a knight. So is Alexander. Ella, on the other hand, is a knave.",
     ["William", "Alexander", "Ella"], [True, True, False], True),
    ("henry: knight, jack: knave, grace: knight", ["Henry", "Jack", "Grace"], [True, False, True], True),
    ("So Noah is the liar and the other three tell the truth.", ["Noah", "Ava", "Liam", "Mia"],
     [False, True, True, True], True),
]  # fmt: skip


def _kk_case(response: str, roles: dict[str, bool] | None, kind: str) -> RuleCase:
    """A K&K row as a judged case: right against the roles it states, or (stating none) wrong against the
    roles its quoted or unconcluded text would give."""
    solution = [roles[n] for n in NAMES] if roles is not None else [True] * len(NAMES)
    return RuleCase(response, "", roles is not None, kind=kind, grader="kk", names=NAMES, solution=solution)


def all_cases() -> list[RuleCase]:
    tables = {
        "last-commitment": LAST_COMMITMENT, "chains": CHAINS, "substitutions": SUBSTITUTIONS,
        "values": VALUES, "clocks": CLOCKS, "matrices": MATRICES, "reported": REPORTED_EXAMPLES,
    }  # fmt: skip
    cases = [RuleCase(r, g, c, kind=kind) for kind, rows in tables.items() for r, g, c in rows]
    cases += [RuleCase(r, g, c, PROBLEM, "options") for r, g, c in OPTIONS]
    cases.append(RuleCase(*REPORTED_OPTION[:3], REPORTED_OPTION[3], "reported"))
    cases += [_kk_case(r, roles, "kk") for r, roles in KK]
    cases += [
        RuleCase(r, "", c, kind="reported-kk", grader="kk", names=n, solution=s) for r, n, s, c in REPORTED_KK
    ]
    return cases
