"""A judged case set for the maths grader: each case is a response, a gold and the verdict a careful human
grader signs (True: the response answers the gold). Written for rlbench in the style of the public graders'
own suites (math-verify's number, notation, percent and model-output tests, lighteval's extractive match,
MARIO_EVAL's and Qwen2.5-Math's equivalence tables, lm-eval Minerva's "Final Answer: The final answer is
... I hope it is correct."), not copied from them. `benchmarks/grader_cases.py` grades them.

Two parts:
* PAIRS: an answer, a gold and whether they are equal, each written into every one of FRAMES (a box in a
  sentence, Minerva's sentence, "The answer is:", a prose conclusion, the answer alone, a bold "Answer:");
  the frames only place the answer, so each frame keeps the pair's verdict.
* RESPONSES: whole responses for what the frames cannot show: which part is the answer (corrections,
  hedges, several boxes, negations, trailing text, a sentence that repeats the problem).
"""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    response: str
    gold: str
    correct: bool
    problem: str = ""  # the problem statement, where the verdict depends on it
    kind: str = ""


FRAMES = {
    "box": "Putting the steps together, the result is $\\boxed{{{a}}}$.",
    "minerva": "We simplify as above.\nFinal Answer: The final answer is ${a}$. I hope it is correct.",
    "metamath": "Following the steps, we get the result.\nThe answer is: {a}",
    "prose": "Working through each case above, we find that the value is ${a}$.",
    "alone": "{a}",
    "bold": "All conditions hold.\n\n**Answer:** ${a}$",
}

# (answer, gold, equal)
PAIRS: dict[str, list[tuple[str, str, bool]]] = {
    "numbers": [
        ("-5", "-5", True),
        ("5", "-5", False),
        ("7,425,000", "7425000", True),
        ("7,425,001", "7425000", False),
        ("1 000", "1000", True),
        ("1 001", "1000", False),
        ("1000.0", "1000", True),
        ("1,000.0", "1000.0", True),
        ("1,000.99", "1000.99", True),
        ("1,000.98", "1000.99", False),
        (".4", "0.4", True),
        (".5", "0.4", False),
        ("0.111", "0,111", True),
        ("0.112", "0,111", False),
        ("1.22", "1,22", True),
        ("12", "12.0", True),
        ("012", "12", True),
        ("13", "12", False),
        ("1{,}024", "1024", True),
        ("1\\,024", "1024", True),
        ("1\\,025", "1024", False),
        ("2^{10}", "1024", True),
        ("2^{10}", "1023", False),
        ("5!", "120", True),
        ("\\binom{5}{2}", "10", True),
        ("\\binom{5}{3}", "9", False),
        ("\\log_2 8", "3", True),
        ("1.5\\times10^{3}", "1500", True),
        ("1.5 \\cdot 10^{3}", "1500", True),
        ("1.5\\times10^{4}", "1500", False),
        ("10^{-3}", "0.001", True),
        ("10^{-2}", "0.001", False),
    ],
    "fractions": [
        ("\\frac{10}{9}", "10/9", True),
        ("-\\frac{10}{9}", "-10/9", True),
        ("\\frac{9}{10}", "10/9", False),
        ("\\frac{10}{9}", "-10/9", False),
        ("\\dfrac{3}{4}", "0.75", True),
        ("\\tfrac{1}{3}", "\\frac13", True),
        ("\\cfrac{1}{3}", "1/3", True),
        ("\\frac13", "\\frac{1}{3}", True),
        ("\\frac3{3}", "1", True),
        ("\\frac{2}{4}", "\\frac12", True),
        ("\\frac{1}{2}", "\\frac{1}{3}", False),
        ("0.33", "\\frac13", False),
        ("0.5", "\\frac{1}{2}", True),
        ("0.25", "\\frac{1}{2}", False),
        ("2\\frac{1}{2}", "\\frac52", True),
        ("-1\\frac{1}{3}", "-\\frac43", True),
        ("0.\\overline{3}", "\\frac13", True),
        ("0.\\overline{6}", "\\frac13", False),
        ("\\left( \\frac{1}{3} \\right)", "1/3", True),
        ("\\frac{14}{3}", "\\frac{14}{3}", True),
        ("\\frac{13}{3}", "\\frac{14}{3}", False),
    ],
    "roots-pi-angles": [
        ("\\sqrt3", "\\sqrt{3}", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt2}", True),
        ("\\sqrt{3}", "3", False),
        ("3\\sqrt{2}", "2\\sqrt{3}", False),
        ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt6}", True),
        ("2\\pi", "2\\pi", True),
        ("\\frac{\\pi}{2}", "\\pi/2", True),
        ("\\frac{\\pi}{3}", "\\pi/2", False),
        ("4\\pi", "2\\pi", False),
        ("90^\\circ", "90^\\circ", True),
        ("90", "90^\\circ", True),
        ("45^\\circ", "90^\\circ", False),
        ("\\frac{3\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}", True),
        ("\\frac{\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}", False),
    ],
    "expressions-equations": [
        ("(x+1)^2", "x^2+2x+1", True),
        ("3+2x", "2x+3", True),
        ("2x-3", "2x+3", False),
        ("(x-1)(x+1)", "x^2-1", True),
        ("(x-1)^2", "x^2-1", False),
        ("b+a", "a+b", True),
        ("2-2p", "2-2p", True),
        ("2+2p", "2-2p", False),
        ("y = 3 + 2x", "y=2x+3", True),
        ("y = 2x - 3", "y=2x+3", False),
        ("k = \\frac{1}{3}", "\\frac13", True),
        ("x=5", "5", True),
        ("x=6", "5", False),
        ("3+4i", "3+4i", True),
        ("4i+3", "3+4i", True),
        ("3-4i", "3+4i", False),
        ("\\frac{x+1}{2}", "\\frac{1}{2}x+\\frac{1}{2}", True),
        ("\\frac{x+1}{2}", "\\frac{x}{2}+1", False),
    ],
    "sets-tuples-intervals": [
        ("[0,1)", "[0,1)", True),
        ("(0,1)", "[0,1)", False),
        ("[0,9)", "(0,9)", False),
        ("(-\\infty, 2)\\cup(3,\\infty)", "(-\\infty,2)\\cup(3,\\infty)", True),
        ("(-\\infty, 2]\\cup(3,\\infty)", "(-\\infty,2)\\cup(3,\\infty)", False),
        ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
        ("\\{1,2\\}", "\\{1,2,3\\}", False),
        ("3, 2, 1", "1,2,3", True),
        ("1, 2", "1,2,3", False),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
        ("(1,2)", "(2,1)", False),
        ("(3,-1)", "(3,-1)", True),
        ("x \\in [2,5]", "[2,5]", True),
        ("x > 2", "(2,\\infty)", True),
        ("x \\geq 2", "(2,\\infty)", False),
        ("x \\le 3", "(-\\infty,3]", True),
        ("p=-1, p=\\frac{15}{8}", "p=-1,p=\\frac{15}{8}", True),
        ("p = -1 \\text{ and } p = \\dfrac{15}{8}", "p=-1,p=\\frac{15}{8}", True),
        ("p = -1 \\text{ and } p = \\dfrac{15}{7}", "p=-1,p=\\frac{15}{8}", False),
        (
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
            True,
        ),
        (
            "\\begin{pmatrix} 1 & 2 \\\\ 4 & 3 \\end{pmatrix}",
            "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
            False,
        ),
        ("(1,2,3)", "\\begin{pmatrix}1\\\\2\\\\3\\end{pmatrix}", True),
    ],
    "percent-units-money": [
        ("28\\%", "28\\%", True),
        ("28", "28\\%", True),
        ("0.28", "28\\%", True),
        ("29\\%", "28\\%", False),
        ("28 percent", "28\\%", True),
        ("28 pct", "28\\%", True),
        ("28 %", "28\\%", True),
        ("28", "0.28", False),
        ("28", "\\frac{28}{100}", False),
        ("28/100", "28", False),
        ("10 \\text{ cm}", "10", True),
        ("10\\text{ meters}", "10", True),
        ("11 \\text{ cm}", "10", False),
        ("5 \\text{ dollars}", "5", True),
        ("\\$18.90", "18.90", True),
        ("18.9", "\\$18.90", True),
        ("\\$19", "\\$18.90", False),
        ("10 \\text{ hundred}", "10", False),
        ("3 \\text{ dozen}", "3", False),
    ],
    "labels-text-choices": [
        ("7:32", "S_{MBCN}:S=7:32", True),
        ("7:33", "S_{MBCN}:S=7:32", False),
        ("S_{MBCN}:S=7:32", "7:32", True),
        ("AB = 5", "5", True),
        ("AB = 6", "5", False),
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
        ("\\text{Briana}", "\\text{Evelyn}", False),
        ("\\text{(C)}", "\\text{(C)}", True),
        ("(C)", "\\text{(C)}", True),
        ("(D)", "\\text{(C)}", False),
        ("\\textbf{(E)}\\ 27", "27", True),
        ("\\textbf{(E)}\\ 27", "28", False),
    ],
}

PROPER_DIVISORS = (
    "Let $a$ be the sum of the proper divisors of 284. What is the sum of the proper divisors of $a$?"
)
AREA = "A rectangle has sides 12 and 5. What is the length of its diagonal?"

RESPONSES: dict[str, list[Case]] = {
    "only-an-answer": [
        Case("-5", "-5", True),
        Case("7,425,000", "7425000", True),
        Case("1 000", "1000", True),
        Case("1000.0", "1000", True),
        Case(".4", "0.4", True),
        Case("1,000.99", "1000.99", True),
        Case("$1,000.99", "1000.99", True),
        Case("1,000.99$", "1000.99", True),
        Case("\\frac{10}{9}", "10/9", True),
        Case("-\\frac{10}{9}", "-10/9", True),
        Case("0.111", "0,111", True),
        Case("$\\frac{14}{3}$", "\\frac{14}{3}", True),
        Case("**42**", "42", True),
        Case("42.", "42", True),
        Case("43", "42", False),
        Case("AZYUK2A", "2", False),
        Case("3 or 6", "6", False),
        Case("Step 1", "1", False),
        Case("x", "5", False),
    ],
    "answer-notation": [
        Case("Answer \\[ 9 \\]", "9", True),
        Case("Answer $ 9 $", "9", True),
        Case("Answer $$ 9 $$", "9", True),
        Case("Answer \\( 9 \\)", "9", True),
        Case("Answer \\( (9+1) \\)", "10", True),
        Case("Answer \\[ \n 9 \n \\]", "9", True),
        Case("Answer \\( 8 \\)", "9", False),
        Case("$\\frac{1}{3} \\textbf{meters}$", "1/3", True),
        Case("$k = \\frac{1}{3}$", "1/3", True),
        Case("$\\boxed{\\frac{1}{3}}$", "1/3", True),
    ],
    "percent": [
        Case("28 percent", "28\\%", True),
        Case("28 pct", "28\\%", True),
        Case("28 %", "28\\%", True),
        Case("$28$ %", "28\\%", True),
        Case("$28$ percent", "28\\%", True),
        Case("$\\boxed{28}$ pct", "28\\%", True),
        Case("$\\boxed{28 pct}$", "28\\%", True),
        Case("$\\boxed{28 percent}$", "28\\%", True),
        Case("$\\boxed{28 percentage}$", "28\\%", True),
        Case("28", "28\\%", True),
        Case("28", "0.28", False),
        Case("28", "28/100", False),
        Case("28/100", "28", False),
        Case("28", "\\frac{28}{100}", False),
        Case("28", "28*\\frac{1}{100}", False),
        Case("The loss is 28 percent.", "28\\%", True),
        Case("The loss is 27 percent.", "28\\%", False),
    ],
    "trailing-words-units": [
        Case("the number is not 10 which is 1,000.99€", "1000.99", True),
        Case("so the number is 10 which is 1,000.99m²", "1000.99", True),
        Case("not it's not 10 it's 1,000.99m²", "1000.99", True),
        Case("the number is 1,000.99€, not 10", "10", False),
        Case("the number is not 1,000.99€", "1000.99", False),
        Case("The total would not be 204", "204", False),
        Case("So the total cost is $18.90 dollars.", "18.90", True),
        Case("Each side measures 12 cm.", "12", True),
        Case("Each side measures 12 cm, not 13 cm.", "13", False),
    ],
    "several-boxes": [
        Case("\\boxed{(3, 3)} for part (a) and \\boxed{(1, 1)}", "(3, 3), (1, 1)", True),
        Case("\\boxed{1} papers and \\boxed{2} bins", "1,2", True),
        Case("\\boxed{1} papers and \\boxed{2} bins", "2", False),
        Case("The roots are $\\boxed{2}$ and $\\boxed{-3}$.", "2,-3", True),
        Case("The roots are $\\boxed{2}$ and $\\boxed{-3}$.", "-3", False),
        Case("\\boxed{12} cm for the length, \\boxed{5} cm for the width", "12, 5", True),
        Case("\\boxed{1}, \\boxed{3}", "1, 3", True),
        Case("So \\boxed{3}. Wait, recheck: \\boxed{5}", "5", True),
        Case("So \\boxed{3}. Wait, recheck: \\boxed{5}", "3", False),
        Case("First \\boxed{4}, but that is wrong, and the right count is \\boxed{6}.", "6", True),
        Case("We get $x = \\boxed{2}$, so $y = \\boxed{7}$.", "7", True),
    ],
    "hedged": [
        Case(
            "The answer is $\\boxed{3}$ if we count unordered pairs, and $\\boxed{6}$ if order matters.",
            "6",
            False,
        ),
        Case(
            "The answer is $\\boxed{3}$ if we count unordered pairs, and $\\boxed{6}$ if order matters.",
            "3",
            False,
        ),
        Case("If the order matters the answer is $\\boxed{6}$; if not, it is $\\boxed{3}$.", "3", False),
        Case("The answer is 10 if repetition is allowed, and 6 otherwise.", "6", False),
        Case("The answer is $4$ when $n$ is even and $5$ when $n$ is odd.", "4", False),
        Case("The answer is 6 if order matters. If not, the answer is 3.", "3", False),
        Case("Either way the count is the same: \\boxed{6} if ordered and \\boxed{6} otherwise.", "6", True),
        Case("The answer is $\\boxed{6}$ if order matters, which it does here.", "6", True),
    ],
    "gold-labels": [
        Case("\\boxed{7:32}", "S_{MBCN}:S=7:32", True),
        Case("\\boxed{32:7}", "S_{MBCN}:S=7:32", False),
        Case("$\\boxed{p = -1 \\text{ and } p = \\dfrac{15}{8}}$", "p=-1,p=\\frac{15}{8}", True),
        Case("\\boxed{AB = 5}", "5", True),
        Case("\\boxed{N = 12}", "N=12", True),
        Case("\\boxed{x^2+y^2=25}", "x^2+y^2=25", True),
        Case("\\boxed{25}", "x^2+y^2=25", False),
    ],
    "prose-conclusion": [
        Case(
            "The first term is 3 and the ratio is 2, so the fifth term is $3 \\cdot 2^4 = 48$.",
            "48",
            True,
        ),
        Case(
            "Adding the three cases gives 4 + 5 + 6. Therefore the total number of ways is 15.",
            "15",
            True,
        ),
        Case(
            "The perimeter is 2(12 + 5) = 34 and the area is 60. Thus the area is 60 square units.",
            "60",
            True,
        ),
        Case("We have $a = 2$ and $b = 3$, hence $a^2 + b^2 = 13$.", "13", True),
        Case("Thus, the smallest such number is 14,916.", "14916", True),
        Case(
            "So the total is 76. This is the sum of the proper divisors of 284.",
            "284",
            False,
            PROPER_DIVISORS,
        ),
        Case(
            "So the total is 76. This is the sum of the proper divisors of 284.", "76", True, PROPER_DIVISORS
        ),
        Case(
            "The proper divisors of 220 add up to 284, and those of 284 add up to 220. Therefore the answer "
            "is 220, which is the sum of the proper divisors of 284.",
            "220",
            True,
            PROPER_DIVISORS,
        ),
        Case(
            "By Pythagoras, $\\sqrt{12^2 + 5^2} = 13$. This is the diagonal of the rectangle with sides 12 "
            "and 5.",
            "13",
            True,
            AREA,
        ),
        Case(
            "By Pythagoras, $\\sqrt{12^2 + 5^2} = 13$. This is the diagonal of the rectangle with sides 12 "
            "and 5.",
            "5",
            False,
            AREA,
        ),
        Case("The diagonal is longer than both sides, 12 and 5.", "12", False, AREA),
        Case("The value of x is 5. Note that 5 is not 6.", "6", False),
        Case("So is it 204?", "204", False),
        Case("So far we have 204 pairs, but we still need to add the cases where", "204", False),
        Case("Counting again from the start...", "3", False),
        Case("The answer is not 204; it is 210.", "210", True),
        Case("The answer is not 204; it is 210.", "204", False),
    ],
    "corrections": [
        Case("\\boxed{204} ... I must add 24 more: the answer is 228.", "228", True),
        Case("\\boxed{204} ... I must add 24 more: the answer is 228.", "204", False),
        Case("We get \\boxed{3}. The final answer is 4.", "4", True),
        Case("We get \\boxed{3}. The final answer is 4.", "3", False),
        Case("\\boxed{56}. Let me verify: $7 \\cdot 8 = 56$. So the answer is correct.", "56", True),
        Case("The answer is: **42**.", "42", True),
        Case("**Final Answer**\n\\[\n\\boxed{5}\n\\]", "5", True),
        Case("An unfinished \\boxed{20", "20", False),
    ],
}

SALLY = "Sally has 20 dollars and wants a game that costs 35 dollars. How many more dollars does she need?"
POWER = "What is $2^{10}$?"
NOTE = "Note: The solution above is incorrect. The correct approach is as follows:"
RESPONSES["model-outputs"] = [
    # SmolLM2-135M-Instruct, math500-precalculus/927 (greedy, 2026-11-26), the end of its response
    Case(
        "So, the angle between these lines is the inverse tangent of 90 degrees.\n\nThis is the answer.",
        "90^\\circ",
        False,
    ),
    Case("So the total is 76. This is the sum of the proper divisors of 284.", "284", False),
    # SmolLM2-135M-Instruct, math500-algebra/567 (greedy, 2026-11-26): the conclusion, then the problem again
    Case(
        "So, the solution to the equation is $x=3$.\n\nThis is the largest value of $x$ that satisfies the "
        "equation $|5x-1|=x+3$.",
        "3",
        True,
        "Find the largest value of $x$ that satisfies the equation $|5x-1|=x+3$.",
    ),
    Case(
        "The base area is $\\frac{1}{2} \\times 5 \\times 6 = 15$ and the height is 4. Final Answer: The "
        "volume of $ABCDEFGH$ is 120. I hope it is correct.",
        "120",
        True,
    ),
    Case(
        f"So the loss is $100\\% - 72\\% = 28\\%$. Final Answer: The final answer is $28 \\%$. I hope it is "
        f"correct. {NOTE}",
        "28\\%",
        True,
    ),
    Case(
        "The sum is $12,\\!000,\\!023$. Final Answer: The final answer is 12,000,023. I hope it is correct. "
        "<|im_start|>user",
        "12000023",
        True,
    ),
    Case(
        "Rounded to the nearest cent, the investment is worth $\\boxed{\\$16,\\!386.20}$. The answer is "
        "$16,\\!386.20$. I apologize for the repetition. Here is the correct solution: To find the value we "
        "use the formula",
        "16386.20",
        True,
    ),
    Case(
        "Rounded to the nearest cent, the investment is worth $\\boxed{\\$16386.17}$ after 5 years.",
        "16386.17",
        True,
    ),
    Case("Solving for $x$ yields $x=1/5$, or $\\boxed{20}$ percent.", "20\\%", True),
    Case(
        "Dividing by 3, $b = \\boxed{\\frac{5}{3}}$. Final Answer: The final answer is $\\frac{5}{3}$. I "
        "hope it is correct. <|im_start|>user Another one: solve $4x = 32$. <|im_start|>assistant We get "
        "$x = \\boxed{8}$.",
        "\\frac53",
        True,
    ),
    Case(
        "Dividing by 3, $b = \\boxed{\\frac{5}{3}}$. <|im_start|>user Another one: solve $4x = 32$. "
        "<|im_start|>assistant We get $x = \\boxed{8}$.",
        "8",
        False,
    ),
    Case("So, the number of ways is 12.\n\nTherefore, the answer is 12.", "12", True),
    Case("The sum of the roots is $-\\frac{b}{a} = -\\frac{-6}{2} = 3$.", "3", True),
    Case("\\[ x = \\frac{6 \\pm 2}{4} \\]\nSo $x = 2$ or $x = 1$.", "1, 2", True),
    Case("\\[ x = \\frac{6 \\pm 2}{4} \\]\nSo $x = 2$ or $x = 1$.", "1", False),
    Case("The possible values are $1$, $2$, and $3$.", "1,2,3", True),
    Case("Hence the minimum value is $\\boxed{-4}$, attained at $x = 2$.", "-4", True),
    Case(
        "The area is $\\boxed{24}$ square units. To double-check, the legs are 6 and 8, so "
        "$\\frac{1}{2}\\cdot 6 \\cdot 8 = 24$.",
        "24",
        True,
    ),
    Case("\\boxed{24}\n\nNote: the problem gives a perimeter of 30.", "30", False),
    Case(
        "The divisors of 360 are 1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 18, 20, 24, 30, 36, 40, 45, 60, 72, 90, "
        "120, 180, 360.",
        "24",
        False,
    ),
    Case("We need to compute $2^{10}$.", "1024", False, POWER),
    Case("So $2^{10} = 1024$.", "1024", True, POWER),
    Case("There are 5 apples left, so she ate 3.", "3", True),
    Case("The answer is 5 apples.", "5", True),
    Case("The final answer is $\\boxed{B}$.", "\\text{(B)}", True),
    Case("The final answer is $\\boxed{C}$.", "\\text{(B)}", False),
    Case("So $x = 3$ and $y = -2$, that is $(x, y) = (3, -2)$.", "(3,-2)", True),
    Case("The probability is $\\frac{3}{8}$, or 37.5%.", "\\frac38", True),
    Case("She needs 15 more dollars. She has 20 dollars.", "15", True, SALLY),
    Case("She needs 15 more dollars. She has 20 dollars.", "20", False, SALLY),
    Case("Then $n^2 = 49$, so $n = 7$ or $n = -7$. Since $n$ is positive, $n = 7$.", "7", True),
    Case("$$\\boxed{x = 7}$$", "7", True),
    Case("**Step 3:** Add them up: 4 + 9 = 13\n\n**Answer:** 13", "13", True),
    Case("The answer is $\\boxed{\\text{No}}$.", "\\text{No}", True),
    Case(
        "Final Answer: The final answer is $3.0 \\times 10^8$ m/s. I hope it is correct.",
        "3 \\times 10^8",
        True,
    ),
    Case("Final Answer: The final answer is $\\frac{1}{4}$. I hope it is correct.", "0.25", True),
    Case("I think the answer is 12, but I'm not sure. It could be 13.", "12", False),
    Case("I think the answer is 12, but I'm not sure. It could be 13.", "13", False),
    Case(
        "The sum of the proper divisors of 284 is 220. The sum of the proper divisors of 220 is 284.",
        "284",
        True,
        PROPER_DIVISORS,
    ),
    Case(
        "To find the sum of the proper divisors of 284, we list them: 1, 2, 4, 71, 142. Their sum is",
        "220",
        False,
        PROPER_DIVISORS,
    ),
]

# Written after the grader changes above, before grading them once (the first result is in docs/eval.md).
ERROR_FOUND = "The answer is $\\frac{1}{2}$. Wait, I made an error: the answer is $\\frac{1}{3}$."
REMAINDER = "What is the remainder when 17 is divided by 5?"
RESPONSES["held-out"] = [
    Case("\\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}", True),
    Case("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", True),
    Case("\\boxed{3.14}", "\\pi", False),
    Case("\\boxed{e^{i\\pi}}", "-1", True),
    Case("\\boxed{\\infty}", "\\infty", True),
    Case("\\boxed{-\\infty}", "\\infty", False),
    Case("\\boxed{\\emptyset}", "\\varnothing", True),
    Case("\\boxed{50\\%}", "\\frac{1}{2}", True),
    Case("\\boxed{\\text{Monday}}", "\\text{monday}", True),
    Case("\\boxed{\\text{(A)}}", "A", True),
    Case("\\boxed{\\sin^2 x + \\cos^2 x}", "1", True),
    Case("\\boxed{[1, 2]}", "[1,2]", True),
    Case("\\boxed{(1,2]}", "[1,2]", False),
    Case("\\boxed{x \\in (-\\infty, 0)}", "(-\\infty,0)", True),
    Case("\\boxed{\\text{D}}", "D", True),
    Case("\\boxed{(-\\infty,-1]\\cup[1,\\infty)}", "(-\\infty,-1] \\cup [1, \\infty)", True),
    Case("\\boxed{y=-2x+1}", "y=-2x+1", True),
    Case("\\boxed{2x+y-1=0}", "y=-2x+1", True),
    Case("Final Answer: The final answer is $\\$4.50$. I hope it is correct.", "4.50", True),
    Case("Final Answer: The final answer is 10\\%. I hope it is correct.", "10", True),
    Case("Final Answer: The final answer is $x^2+7x+10$. I hope it is correct.", "(x+2)(x+5)", True),
    Case("Final Answer: The final answer is $x^2+7x+12$. I hope it is correct.", "(x+2)(x+5)", False),
    Case("We get \\boxed{}. The answer is 5.", "5", True),
    Case("The answer is 5.", "-5", False),
    Case("The final answer is $\\boxed{2}$ or $\\boxed{3}$.", "2", False),
    Case("\\boxed{2, 3}", "2", False),
    Case("\\boxed{x = 2}", "x = 2, x = 3", False),
    Case(ERROR_FOUND, "\\frac12", False),
    Case(ERROR_FOUND, "\\frac13", True),
    Case("The answer is 4. Let me double-check: 2 + 2 = 4. Yes.", "4", True),
    Case("We find $x=3$. However, $x=3$ makes the denominator zero, so there is no solution.", "3", False),
    Case("The equation has solutions $x=2$ and $x=3$, but only $x=2$ satisfies the condition.", "2", True),
    Case("The equation has solutions $x=2$ and $x=3$, but only $x=2$ satisfies the condition.", "2,3", False),
    Case("The answer is 7. Do you want me to explain more?", "7", True),
    Case("Answer: 7 or 8", "7", False),
    Case("Let's say the number of apples is 5. Then the number of oranges is 5 + 3 = 8. So the total is "
         "5 + 8 = 13.", "13", True),
    Case("Let's say the number of apples is 5. Then the number of oranges is 5 + 3 = 8. So the total is "
         "5 + 8 = 13.", "8", False),
    Case("The answer is 12 (or 13 if we include zero).", "12", False),
    Case("The answer is 12 (that is, a dozen).", "12", True),
    Case("Thus there are $\\boxed{6}$ ways to arrange them, since $3! = 6$.", "6", True),
    Case("So $a = 3$, $b = 4$, and the hypotenuse is $c = 5$.", "5", True),
    Case("So $a = 3$, $b = 4$, and the hypotenuse is $c = 5$.", "4", False),
    Case("The remainder is 2 when 17 is divided by 5.", "2", True, REMAINDER),
    Case("When 17 is divided by 5, the remainder is 2.", "5", False, REMAINDER),
    Case("The largest of 220 and 284 is 284.", "284", True, "Which is larger, 220 or 284?"),
    Case("**Final Answer**\n\\[\n\\boxed{\\dfrac{7}{2}}\n\\]", "3.5", True),
    Case("The answer is $\\boxed{7}$ because $7 = 3 + 4$, not $8$.", "7", True),
    Case("The answer is $\\boxed{7}$ because $7 = 3 + 4$, not $8$.", "8", False),
]  # fmt: skip


def all_cases() -> list[Case]:
    """Every pair in every frame, then the whole responses, each with its kind."""
    cases = [
        Case(frame.format(a=answer), gold, equal, kind=f"{group}/{name}")
        for group, pairs in PAIRS.items()
        for answer, gold, equal in pairs
        for name, frame in FRAMES.items()
    ]
    for kind, responses in RESPONSES.items():
        cases += [case._replace(kind=kind) for case in responses]
    return cases
