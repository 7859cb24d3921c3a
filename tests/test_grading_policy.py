"""The grading policy, one table per cause of error in issues 37 and 44: each row is (response, gold,
correct?).

A row marked False is a wrong answer that a looser grader passed (a false positive); a row marked True is
a right answer that a stricter one failed (a false negative). The cases are written here in the style of
the issue's examples; `docs/eval.md` states the policy they pin down.
"""

from __future__ import annotations

import pytest
from conftest import grade_as_pool

from reference_trainer.tasks.answer_extraction import ends_complete, locate_answer
from reference_trainer.tasks.answer_forms import clean_value, number_from_words, text_only
from reference_trainer.tasks.grading import GradeItem, grade_item, parse_free_form_assignment

# Exact on both sides: equal only if exactly equal; a decimal approximation within 6 places and 1e-4.
EXACT = [
    (r"\boxed{\frac{1}{2006!}}", r"\frac{1}{2004!}", False),
    (r"The final answer is $1/2^{98}$. I hope it is correct.", r"1/2^{99}", False),
    (r"\boxed{\frac{1}{3\cdot 2^{2006}}}", r"\frac{2^{2005}+1}{3\cdot 2^{2006}}", False),
    (r"\boxed{\frac{\sqrt{2}}{2^{100}}}", r"\frac{\sqrt{2}}{2^{101}}", False),
    (r"\boxed{\frac{\pi}{10^{20}}}", r"\frac{\pi}{10^{21}}", False),
    (r"\boxed{\left(\frac{1}{2^{60}}, 1\right)}", r"\left(\frac{1}{2^{61}}, 1\right)", False),
    (r"\boxed{e^{-50}}", r"e^{-51}", False),
    (r"\boxed{0.0000001}", r"\frac{1}{2^{99}}", False),
    (r"\boxed{0.000000}", r"\frac{1}{10^{7}}", False),
    (r"\boxed{\frac{1}{2^{99}}}", r"2^{-99}", True),
    (r"\boxed{\frac{1}{2006 \cdot 2005!}}", r"\frac{1}{2006!}", True),
    (r"\boxed{\sqrt{2}+\sqrt{3}}", r"\sqrt{5+2\sqrt{6}}", True),
    (r"\boxed{\log_2 8}", "3", True),
    (r"\boxed{0.333333}", r"\frac13", True),
    (r"\boxed{1.57772 \times 10^{-30}}", r"\frac{1}{2^{99}}", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
]

# LaTeX that parses to a number it does not mean.
MALFORMED = [
    (r"Final answer: 4\sqrt(2)", "4", False),
    (r"\boxed{2}", r"1, 2, \ldots, n", False),
    (r"\boxed{x = 5 \\ y = 3}", "3", False),
    (r"\boxed{2 1/2}", r"\frac{3}{2}", False),
    (r"\boxed{10 \text{ hundred}}", "10", False),
    (r"Final answer: 4\sqrt(2)", r"4\sqrt{2}", True),
    (r"\boxed{3\sqrt(5)}", r"3\sqrt5", True),
    (r"\boxed{1, 2, \ldots, n}", r"1, 2, \ldots, n", True),
    (r"\boxed{2 1/2}", r"\frac{5}{2}", True),
]

# Which answer counts: the last statement; no fallback on a negated, cut-off or questioning sentence.
EXTRACTION = [
    ("The answer is not 204; it is 210.", "204", False),
    ("Adding the two cases, the total would not be 204", "204", False),
    ("So far we have 204 pairs, but we still need to add the cases where", "204", False),
    ("Counting again from the start...", "3", False),
    ("So is it 204?", "204", False),
    (r"\boxed{204} ... I must add 24 more: the answer is 228.", "204", False),
    (r"So \boxed{3}. Wait, recheck: \boxed{5}", "3", False),
    (r"We get \boxed{3}. The final answer is 4.", "3", False),
    ("The answer is not 204; it is 210.", "210", True),
    (r"\boxed{204} ... I must add 24 more: the answer is 228.", "228", True),
    (r"So \boxed{3}. Wait, recheck: \boxed{5}", "5", True),
    (r"\boxed{1}, \boxed{3}", "1, 3", True),
    (r"We get \boxed{12}. Checking: $3 \cdot 4 = 12$.", "12", True),
    ("The answer is $\\boxed{7}$.", "7", True),
    ("**Final Answer:**\n42", "42", True),
    ("Answer: $\\frac{3}{4}$, since both cases give it.", "0.75", True),
    ("we get 3 apples, then 1,250 pears.", "1250", True),
    ("The answer is: **42**.", "42", True),
    ("Answer: 7 (since 3 + 4 = 7).", "7", True),
    (r"\boxed{56}. Let me verify: $7 \cdot 8 = 56$. So the answer is correct.", "56", True),
]

UNITS_AND_LETTERS = [
    (r"\boxed{10 weeks}", "10", True),
    ("Final answer: 10 cm^2", "10", True),
    (r"\boxed{\text{204 minutes}}", "204", True),
    (r"\boxed{5 \text{ dollars}}", "5", True),
    (r"\boxed{\textbf{(E)}\ 27}", "27", True),
    (r"The answer is $\textbf{(B) } \frac{1}{2}$.", r"\frac12", True),
    (r"\boxed{(C)}", r"\text{(C)}", True),
    (r"\boxed{\textbf{(E)}\ 27}", "28", False),
    (r"\boxed{2 pi}", "2", False),
    (r"\boxed{10 weeks}", "11", False),
    ("Final answer: 3 dozen", "3", False),
]

FORMS = [
    (r"\boxed{x < 2 \text{ or } x > 3}", r"(-\infty,2)\cup(3,\infty)", True),
    (r"\boxed{x<2 \lor x>3}", r"(-\infty,2)\cup(3,\infty)", True),
    (r"\boxed{m\geq\sqrt2}", r"[\sqrt2,\infty)", True),
    (r"\boxed{(1,2,3)}", r"\begin{pmatrix}1\\2\\3\end{pmatrix}", True),
    (r"\boxed{0.\overline{3}}", r"\frac13", True),
    (r"\boxed{0.1\overline{6}}", r"\frac16", True),
    (r"\boxed{2\frac{1}{2}}", r"\frac52", True),
    (r"\boxed{-1\frac{1}{3}}", r"-\frac43", True),
    (r"\boxed{x > 2 \text{ and } x < 3}", r"(-\infty,2)\cup(3,\infty)", False),
    (r"\boxed{m\leq\sqrt2}", r"[\sqrt2,\infty)", False),
    (r"\boxed{(1,2,4)}", r"\begin{pmatrix}1\\2\\3\end{pmatrix}", False),
    (r"\boxed{0.\overline{3}}", "0.3", False),
]

WORDS = [
    ("The sum is 7, so it is odd.\nFinal answer: odd", r"\text{odd}", True),
    ("Final answer: two hundred four", "204", True),
    ("Final answer: twelve.", "12", True),
    ("Final answer: minus three", "-3", True),
    ("The answer is even.", r"\text{even}", True),
    ("The sum is 7, so it is odd.\nFinal answer: odd", "7", False),
    ("Final answer: twenty", "204", False),
    ("Final answer: even", r"\text{odd}", False),
]

# Issue 44. A response that is only an answer is that answer (it ends no sentence, yet is not cut off).
ONLY_AN_ANSWER = [
    ("-5", "-5", True),
    ("7,425,000", "7425000", True),
    ("1 000", "1000", True),
    ("1000.0", "1000", True),
    (".4", "0.4", True),
    ("$1,000.99", "1000.99", True),
    (r"-\frac{10}{9}", "-10/9", True),
    ("0.111", "0,111", True),
    ("(C)", r"\text{(C)}", True),
    ("1 001", "1000", False),
    ("3 or 6", "6", False),
    ("Step 1", "1", False),
]

# "Answer" before a formula states it; percent in words or spaced; a number with a unit sign after a
# correction.
NOTATION_PERCENT_UNITS = [
    (r"Answer \( 9 \)", "9", True),
    (r"Answer \[ 9 \]", "9", True),
    (r"Answer \( (9+1) \)", "10", True),
    ("28 percent", r"28\%", True),
    ("28 pct", "28", True),
    ("$28$ %", r"28\%", True),
    ("28", r"0.28", False),
    ("the number is not 10 which is 1,000.99€", "1000.99", True),
    ("so the number is 10 which is 1,000.99m²", "1000.99", True),
    ("the number is 1,000.99€, not 10", "10", False),
    ("the number is not 1,000.99€", "1000.99", False),
]

# Boxes of one sentence joined by labels are one answer, a list; joined under conditions they are a hedge,
# and so are two statements under conditions or a stated answer doubted in favour of another.
BOXES_AND_HEDGES = [
    (r"\boxed{(3, 3)} for part (a) and \boxed{(1, 1)}", "(3, 3), (1, 1)", True),
    (r"\boxed{1} papers and \boxed{2} bins", "1,2", True),
    (r"\boxed{1} papers and \boxed{2} bins", "2", False),
    (r"We get $x = \boxed{2}$, so $y = \boxed{7}$.", "7", True),
    (r"The answer is $\boxed{3}$ if we count unordered pairs, and $\boxed{6}$ if order matters.", "6", False),
    (r"If the order matters the answer is $\boxed{6}$; if not, it is $\boxed{3}$.", "3", False),
    ("The answer is 10 if repetition is allowed, and 6 otherwise.", "6", False),
    (r"Either way: \boxed{6} if ordered and \boxed{6} otherwise.", "6", True),
    ("I think the answer is 12, but I'm not sure. It could be 13.", "12", False),
]

# A gold with a label matches its value; equations joined by "and" are a list, not their (empty) intersection.
LABELS = [
    (r"\boxed{7:32}", "S_{MBCN}:S=7:32", True),
    (r"\boxed{32:7}", "S_{MBCN}:S=7:32", False),
    (r"\boxed{p = -1 \text{ and } p = \dfrac{15}{8}}", r"p=-1,p=\frac{15}{8}", True),
    (r"\boxed{25}", "x^2+y^2=25", False),
]

# Without a statement: the clause's own formulas, a turn marker ends the response, a function of a number
# is not the number, "no solution" rules the maths out.
CLAUSES = [
    (r"Working through each case, the value is $10 \text{ hundred}$.", "10", False),
    (r"Working through each case, the value is $0.\overline{3}$.", r"\frac13", True),
    ("The possible values are $1$, $2$, and $3$.", "1,2,3", True),
    ("So $x = 2$ or $x = 1$.", "1", False),
    (r"So $b = \boxed{\frac{5}{3}}$. <|im_start|>user Solve $4x = 32$. <|im_start|>assistant $\boxed{8}$.",
     "8", False),
    ("So, the angle between these lines is the inverse tangent of 90 degrees.\n\nThis is the answer.",
     r"90^\circ", False),
    ("So the total is 76. This is the sum of the proper divisors of 284.", "284", False),  # no problem given
    ("We find $x=3$. However, $x=3$ makes the denominator zero, so there is no solution.", "3", False),
]  # fmt: skip

# Issue 56, one table row (or more) per kind of false positive or negative it lists.
NESTED_PRED = r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}"  # math-verify timed out on these
NESTED_GOLD = r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}"
CHAINS = r"-\sqrt{11} < x < -2 \text{ or } \sqrt{11} < x"
UNION = r"(-\sqrt{11},-2)\cup (\sqrt{11},9)"
NEXT_TURN = "So the answer is $\\boxed{12}$.\n\nUser: What is 2+2?\nAssistant: The answer is $\\boxed{4}$."
FOR_ALL = r"Thus the only solution is $f(x) = \frac{1}{x}$ for all $x \in \mathbb{Q}^+$."
ISSUE_56 = [
    # a hedge between two values with no if/when
    ("The answer is either 6 or 12, depending on the interpretation.", "6", False),
    ("So the number of ways is either $6$ or $12$.", "12", False),
    ("There are 6 or 12 arrangements depending on whether rotations count.", "6", False),
    ("The answer is 3 or 6.", "3, 6", True),  # a list has no "either" and no condition
    # identities, unsimplified golds, long decimals against fractions
    (r"The answer is $\boxed{\sin(90^\circ - x)}$.", r"\cos x", True),
    (r"The answer is $\boxed{\sin(90^\circ - x)}$.", r"\sin x", False),
    (r"So $z = \boxed{1+2i}$.", "i(2-i)", True),
    (r"So $z = \boxed{1-2i}$.", "i(2-i)", False),
    (r"The probability is $\boxed{2.314814814815 \times 10^{-3}}$.", r"\frac{1}{432}", True),
    (r"The probability is $\boxed{2.3 \times 10^{-3}}$.", r"\frac{1}{432}", False),
    (f"\\boxed{{{NESTED_PRED}}}", NESTED_GOLD, True),
    # several answers in another list form
    (f"The solution is ${CHAINS} < 9$.", UNION, True),
    (f"The solution is ${CHAINS} < 8$.", UNION, False),
    (r"Hence $\boxed{f(x) = \pm x}$.", "f(x)=x,f(x)=-x", True),
    (r"Hence $\boxed{f(x) = \pm 2x}$.", "f(x)=x,f(x)=-x", False),
    ("$(5,2),(7,2)$", "p=5,q=2;p=7,q=2", True),
    ("$p=5,q=2;p=7,q=2$", r"p = 5, q = 2 \quad \text{and} \quad p = 7, q = 2", True),
    ("$(5,2),(7,3)$", "p=5,q=2;p=7,q=2", False),
    ("(a) The count is $\\boxed{3}$.\n\n(b) The sum is $\\boxed{5}$.", "3, 5", True),
    (r"(a) $\boxed{3}$ (b) $\boxed{5}$", "5", False),
    (r"$$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}$$", "(3, 3), (1, 1)", True),
    ("W(x)=1orW(x)=-1", r"W(n) = 1 \text{ and } W(n) = -1", True),
    # plain-text notation
    ("The limit is infinity.", r"\infty", True),
    ("The limit is negative infinity.", r"\infty", False),
    (r"It takes $\boxed{10weeks}$.", "10", True),
    ("The train arrives at 20:34.", "08:34 P.M.", True),
    ("The train arrives at 8:34 PM.", "08:34 P.M.", True),
    ("The train arrives at 10:17.", "08:34 P.M.", False),
    ("1000,99", "1000.99", True),
    # number words inside a sentence
    ("Each root is a seventh root of unity but 1. So there are seven such complex numbers.", "7", True),
    ("So there are seven such complex numbers.", "6", False),
    ("So there is exactly one such number.", "1", True),
    ("So the one that remains is the answer.", "1", False),
    # the end of an equation chain
    (r"$100x - x = 36$, so $x = \frac{36}{99} = \frac{4}{11}$.", r"\frac{4}{11}", True),
    (r"$100x - x = 36$, so $x = \frac{36}{99} = \frac{4}{11}$.", "36", False),
    # a last line without a closing period
    ("</think><answer> 48480 </answer>", "48480", True),
    ("</think><answer> 48480 </answer>", "48481", False),
    (r"\[Answer: 009\]", "9", True),
    (r"\[\text{Answer: } 12\]", "12", True),
    # the wrong clause: a quantifier after the answer, a later turn written as text, contradictions
    (FOR_ALL, r"f(x)=\frac{1}{x}", True),
    (FOR_ALL, "1", False),
    (NEXT_TURN, "12", True),
    (NEXT_TURN, "4", False),
    (r"$x = 5+5+1 = 1/3 \approx 11$", "1/3", False),
    (r"$x = \frac{1}{3} \approx 0.33$", "1/3", True),
    ("Final Answer: The largest $n$ is 34.", "34", True),
    # the same line written another way; an equation of a quantity the problem does not ask for
    (r"\boxed{2x+y-1=0}", "y=-2x+1", True),
    (r"\boxed{2x+y+1=0}", "y=-2x+1", False),
    ("So, the figure skater's final spin is east.", r"\text{east}", True),
]  # fmt: skip

MATH_CASES = {
    "exact": EXACT,
    "malformed": MALFORMED,
    "extraction": EXTRACTION,
    "units-letters": UNITS_AND_LETTERS,
    "forms": FORMS,
    "words": WORDS,
    "only-an-answer": ONLY_AN_ANSWER,
    "notation-percent-units": NOTATION_PERCENT_UNITS,
    "boxes-hedges": BOXES_AND_HEDGES,
    "labels": LABELS,
    "clauses": CLAUSES,
    "issue-56": ISSUE_56,
}

# Rule 4 with the problem statement: a clause that only repeats the problem gives way to a result stated
# before it (SmolLM2-135M on MATH-500 number_theory/737 was graded correct by the 284 of its last sentence).
DIVISORS = "Let $a$ be the sum of the proper divisors of 284. What is the sum of the proper divisors of $a$?"
REMAINDER = "What is the remainder when 17 is divided by 5?"
ABSOLUTE = "Find the largest value of $x$ that satisfies the equation $|5x-1|=x+3$."
PROBLEM_AWARE = [
    ("So the total is 76. This is the sum of the proper divisors of 284.", "284", DIVISORS, False),
    ("So the total is 76. This is the sum of the proper divisors of 284.", "76", DIVISORS, True),
    ("She needs 15 more dollars. She has 20 dollars.", "15", "Sally has 20 dollars; a game costs 35.", True),
    ("The remainder is 2 when 17 is divided by 5.", "2", REMAINDER, True),
    ("We need to compute $2^{10}$.", "1024", "What is $2^{10}$?", False),
    ("So $2^{10} = 1024$.", "1024", "What is $2^{10}$?", True),
    ("The larger one is 284.", "284", "Which is larger, 220 or 284?", True),  # nothing stated before it
    # SmolLM2-135M on MATH-500 algebra/567: the conclusion, then the problem's equation again
    (
        "So, the solution to the equation is $x=3$.\n\nThis is the largest value of $x$ that satisfies the "
        "equation $|5x-1|=x+3$.",
        "3",
        ABSOLUTE,
        True,
    ),
]

NAMES = ["Zoey", "Penelope", "David"]
GOLD = [True, False, False]  # Zoey a knight, Penelope and David knaves
_RIGHT = "CONCLUSION:\n(1) Zoey is a knight\n(2) Penelope is a knave\n(3) David is a knave"
KK_CASES = [
    ("CONCLUSION:\n(1) Zoey is a knight\n(2) Penelope is a knight\n(3) David is a knave\n\n"
     "Note: one might think Penelope is a knave, since she accuses David.", False),
    ("CONCLUSION: Zoey is a knight or a knave (it cannot be determined). Penelope is a knave. "
     "David is a knave.", False),
    ("Zoey is a knight, Penelope is a knave and David is a knight. Suppose David is a knave: then "
     "Zoey would lie.", False),
    ("CONCLUSION: Zoey is a knight. Zoey is a knave. Penelope and David are knaves.", False),
    ("Zoey might be a knight. Penelope is a knave and David is a knave.", False),
    (f"Assume Zoey is a knave. Then Penelope is a knight.\n{_RIGHT}", True),
    (f"{_RIGHT}\n\nNote: one might think Penelope is a knight.", True),
    ("CONCLUSION: Zoey is not a knave. Penelope and David are knaves.", True),
    ("CONCLUSION:\nKnights: Zoey\nKnaves: Penelope, David", True),
    ("| Person | Role |\n|---|---|\n| Zoey | Knight |\n| Penelope | Knave |\n| David | Knave |", True),
    ("CONCLUSION: Penelope - knave, David - knave, Zoey - knight", True),
    ("<answer>Zoey is a knight; Penelope and David are both knaves.</answer>", True),
    ("The only knight is Zoey. The knaves are Penelope and David.", True),
    ("**Zoey**: knight\n**Penelope**: knave\n**David**: knave", True),
    ("CONCLUSION: Zoey is truthful (a knight); Penelope is a knave; David is a knave.", True),
    # cut off at the token limit, no stated answer: the reasoning never concluded (SmolLM2, kk-2ppl-017)
    ("Zoey is a knight. Penelope is a knave. David is a knave.\nBut if Zoey is a knave, then David", False),
    ("Zoey is a knight. Penelope is a knave.\nDavid is a knave. But if Zoey is a knight or", False),
    # ...but a finished response whose last line is a statement still answers
    ("Step 3: conclude.\nZoey is a knight (1)\nPenelope is a knave (2)\nDavid is a knave (3)", True),
    ("Zoey is a knight, Penelope and David are knaves. Who lies? \"Penelope, who says 'David lies'?\"", True),
    ("Zoey is a knight.\nPenelope (knave)\nDavid (knave)", True),
    # Issue 56: the roles as finally stated, in any common phrasing
    ("So Zoey is a knight, Penelope and David are knaves. ... Zoey could be either a knight or a knave.",
     False),
    ("CONCLUSION: Zoey is a knight. Penelope and David are knaves.\nWe cannot determine whether Zoey ...",
     False),
    ("Zoey is the only knight.", True),
    ("Only Zoey is a knight.", True),
    ("The only knight is Zoey.", True),
    ("Penelope is the only knight.", False),
    ("Zoey is a truth-teller, while Penelope and David are liars.", True),
    ("Zoey tells the truth. Penelope lies. David is lying.", True),
    ("Zoey is a liar, Penelope and David are liars.", False),
    ("zoey is a knight, penelope is a knave and david is a knave.", True),
    ('<answer>{"Zoey": "knight", "Penelope": "knave", "David": "knave"}</answer>',
     True),
    ('<answer>{"Zoey": "knave", "Penelope": "knave", "David": "knave"}</answer>',
     False),
    ("Penelope is a knight at first sight. Later: Penelope is a knave, David is a knave, Zoey is a knight.",
     True),
]  # fmt: skip

# Issue 56: statements about everyone
EVERYONE = [
    ("All three are knights: Harper, Owen, and Luna.", [True, True, True]),
    ("All of them are knaves.", [False, False, False]),
    ("Everyone is a knight.", [True, True, True]),
    ("None of them is a knight.", [False, False, False]),
    ("There are no knaves.", [True, True, True]),
]


@pytest.mark.parametrize(("response", "roles"), EVERYONE, ids=[f"everyone-{i}" for i in range(len(EVERYONE))])
def test_kk_statements_about_everyone(response: str, roles: list[bool]) -> None:
    names = ["Harper", "Owen", "Luna"]
    assert parse_free_form_assignment(response, names) == dict(zip(names, roles, strict=True))


def test_kk_a_count_that_is_not_everyone_is_no_statement() -> None:
    assert parse_free_form_assignment("All two are knights.", ["Harper", "Owen", "Luna"]) is None


def test_kk_names_that_are_words_keep_their_capital() -> None:
    assert parse_free_form_assignment("grace is a knight and owen is a knave.", ["Grace", "Owen"]) is None
    assert parse_free_form_assignment("Grace is a knight and owen is a knave.", ["Grace", "Owen"]) == {
        "Grace": True, "Owen": False}  # fmt: skip


def _math(response: str, gold: str) -> bool:
    return grade_as_pool(response, gold).correct


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    [case for cases in MATH_CASES.values() for case in cases],
    ids=[f"{name}-{i}" for name, cases in MATH_CASES.items() for i in range(len(cases))],
)
def test_math_policy(response: str, gold: str, correct: bool) -> None:
    assert _math(response, gold) is correct


@pytest.mark.parametrize(
    ("response", "gold", "problem", "correct"),
    PROBLEM_AWARE,
    ids=[f"problem-{i}" for i in range(len(PROBLEM_AWARE))],
)
def test_a_clause_that_repeats_the_problem(response: str, gold: str, problem: str, correct: bool) -> None:
    assert grade_as_pool(response, gold, problem).correct is correct


def test_an_equation_of_a_quantity_not_asked_for_is_no_answer() -> None:
    """SmolLM2-135M on MATH-500 intermediate_algebra/623 ends "the answer is $\\log a^b = 0$"; the problem
    asks for a + b (gold 0), and math-verify compared the equation's right side with the gold."""
    problem = (
        "If the domain of the function $\\log x^2$ is $x < a$ or $x > b$, for some $a$ and $b$, find $a + b$."
    )
    assert not grade_as_pool("So to summarize, the answer is $\\log a^b = 0$.", "0", problem).correct
    assert grade_as_pool("So the answer is $a + b = 0$.", "0", problem).correct


def test_the_problem_reaches_the_grader_in_the_pool() -> None:
    """The eval runner's items carry the problem statement into the forked workers."""
    from rlbench.eval.pool import GradingPool

    response = "So the total is 76. This is the sum of the proper divisors of 284."
    with GradingPool(workers=1) as pool:
        graded = pool.grade([GradeItem("math", response, "284", problem=DIVISORS)])
    assert graded[0].extracted == "76" and not graded[0].correct


@pytest.mark.parametrize(("response", "correct"), KK_CASES, ids=[f"kk-{i}" for i in range(len(KK_CASES))])
def test_kk_policy(response: str, correct: bool) -> None:
    item = GradeItem("kk", response, "", NAMES, GOLD)
    assert grade_item(item).correct is correct


def test_kk_phrasings_read_the_roles() -> None:
    names = ["Zoey", "Oliver"]
    both = {"Zoey": True, "Oliver": False}
    assert (
        parse_free_form_assignment("CONCLUSION: Zoey is not a knave, Oliver is not a knight.", names) == both
    )
    assert parse_free_form_assignment("Zoey = knight, Oliver (knave)", names) == both
    assert (
        parse_free_form_assignment("CONCLUSION: Zoey is a knight or a knave. Oliver is a knave.", names)
        is None
    )
    assert parse_free_form_assignment("Zoey says Oliver is a knave. Zoey is a knight.", names) is None
    assert parse_free_form_assignment("Elizabeth is a knight", ["Eli"]) is None  # whole names only
    assert parse_free_form_assignment("will is a knight", ["Will"]) is None  # names with their capital


def _value(response: str) -> str | None:
    located = locate_answer(response)
    return located.value if located is not None else "(no answer)"


def test_the_answer_located() -> None:
    """Which text is the answer: the last statement, a box run as one list, a phrase's maths or words."""
    assert _value(r"\boxed{3} and \boxed{5}") == "3, 5"
    assert _value(r"\boxed{5} \boxed{5}") == "5"
    assert _value("The answer is 5 apples, I think.") == "5"
    assert _value("Final answer: \\frac{3}{4}") == "\\frac{3}{4}"
    assert _value("Final answer: 4.9.") == "4.9"
    assert _value("Final answer: 11,\\! 111") == "11,\\! 111"
    assert _value("The final answer is $2.5$. I hope it is correct.") == "2.5"
    assert _value("The answer is a multiple of 3, so it is 12.") is None  # the last clause, parsed whole
    assert _value("The answer is correct.") == "(no answer)"
    assert _value("The answer is $3$ and $5$.") == "3, 5"
    assert _value("Final answer: two hundred four") == "204" and _value("Final answer: odd") == "\\text{odd}"
    assert _value("\\boxed{5}\n\nFinal Answer\nThe answer is above.") == "5"  # a sentence, not words
    assert _value("An unfinished \\boxed{20") == "(no answer)"
    assert _value("") == "(no answer)"
    assert ends_complete("x = $5$") and ends_complete("so 12.") and not ends_complete("so 12")
    assert ends_complete("so it is 12")  # one short line that states a number is a whole answer line...
    assert not ends_complete("Adding the cases one by one. " * 4 + "so it is 12")  # ...a long one is cut off
    assert not ends_complete("and then...") and ends_complete("\\[ x = 1 \\]")


def test_answer_rewrites() -> None:
    assert clean_value("4\\sqrt(2)") == "4\\sqrt{2}"
    assert clean_value("\\textbf{(E)}\\ 27") == "27" and clean_value("\\text{(C)}") == "\\text{(C)}"
    assert clean_value("10 weeks") == "10" and clean_value("10 cm^2") == "10" and clean_value("10 m") == "10"
    assert clean_value("\\text{204 minutes}") == "204" and clean_value("10 hundred") == "10 hundred"
    assert (
        clean_value("0.\\overline{3}") == "\\frac{3}{9}" and clean_value("1.\\overline{3}") == "\\frac{12}{9}"
    )
    assert clean_value("2 1/2") == "\\frac{5}{2}" and clean_value("-2 1/2") == "-\\frac{5}{2}"
    assert number_from_words("two hundred and four") == 204 and number_from_words("three thousand") == 3000
    assert number_from_words("seventy-five") == 75 and number_from_words("odd") is None
    assert number_from_words("hundred") is None and number_from_words("") is None
    assert text_only("1, 2, \\ldots, n") and text_only("x = 5 \\\\ y = 3")
    assert not text_only("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}") and not text_only("5.4 \\text{ cents}")


def test_exact_comparison_is_math_verify_s() -> None:
    """The exact comparison replaces math-verify's numeric step in its own module (a rename there would
    otherwise leave the loose one in place silently)."""
    import math_verify.grader

    from reference_trainer.tasks.answer_equality import install_exact_comparison

    install_exact_comparison()
    assert getattr(math_verify.grader.sympy_numeric_eq, "rlbench_exact", False)
    install_exact_comparison()  # idempotent
    assert getattr(math_verify.grader.sympy_numeric_eq, "rlbench_exact", False)
