"""Generated grading cases: every gold of every suite written in many equivalent surface forms (right), and
wrong answers made from right ones by one small change (wrong), with a fixed seed.

    python -m benchmarks.generated_cases [--seed 0] [--workers 2]

Right forms: LaTeX variants (`\\dfrac`, `\\left(`, spacing), a box in a sentence, `\\fbox`, "Final answer:",
Minerva's sentence, a bold "Answer:" line, the answer restated after its box, an equality chain ending on
it, a box taken back for it, and for an integer its words, a thousands separator, a unit or a currency sign.
Wrong forms: one digit changed, the sign flipped, one element dropped from a list, a box taken back for a
wrong value; for K&K, one role flipped and one person dropped. K&K rights: the CONCLUSION list, prose
with references ("so is", "the others"), lower-case `name: role` lines, a JSON object.

The golds are the suites' (`$RLBENCH_DATA_DIR`, else the shared data folder beside the clone) and a built-in
list of every answer type, so the generator runs without the data too (fewer cases).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

DATA = Path(os.environ.get("RLBENCH_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
MATH_FILES = ("aime24.jsonl", "amc23.jsonl", "math500.jsonl", "olympiadbench.jsonl")
KK_FILES = ("kk_logic.jsonl", "kk_logic_ood.jsonl")
BUILT_IN_GOLDS = [
    "7", "-12", "0", "2024", "1000000", "\\frac{3}{4}", "-\\frac{5}{2}", "0.25", "3.5", "2\\sqrt{3}",
    "\\frac{\\sqrt{5}}{2}", "\\pi", "4\\pi", "e^2", "x^2 + 1", "(1, 2)", "(-3, 4)", "1, 3, 5",
    "[2, 5)", "(-\\infty, 0]", "\\text{east}", "y = 2x + 1",
    "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", "45^\\circ", "\\frac{1}{2^{10}}", "12\\%",
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    grader: str  # "math" or "kk"
    response: str
    gold: str
    correct: bool  # the verdict the form was made to carry
    kind: str  # which form
    names: tuple[str, ...] = ()
    solution: tuple[bool, ...] = ()


# ----------------------------------------------------------------------------- maths

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
)
_ONES += "seventeen eighteen nineteen"
_UNITS = _ONES.split()
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n: int) -> str:
    """An integer below a million in English words ("two hundred four", "fifty-five")."""
    if n < 0:
        return "minus " + words(-n)
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10 - 2] + ("" if n % 10 == 0 else "-" + _UNITS[n % 10])
    if n < 1000:
        return _UNITS[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + words(n % 100))
    return words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + words(n % 1000))


def _latex_variants(g: str) -> str:
    out = g.replace("\\frac", "\\dfrac")
    out = re.sub(r"^\((.*)\)$", r"\\left(\1\\right)", out)
    return re.sub(r",\s*(?!\d{3}(?!\d))", ", ", out)  # a space after a list's comma, never in "58,500"


_RIGHT: dict[str, Callable[[str], str]] = {
    "box in a sentence": lambda g: f"Putting it together, the result is $\\boxed{{{g}}}$.",
    "fbox": lambda g: f"Hence \\fbox{{${g}$}}.",
    "final answer line": lambda g: f"We compute step by step.\n\nFinal answer: ${g}$",
    "minerva": lambda g: f"Final Answer: The final answer is ${g}$. I hope it is correct.",
    "bold answer line": lambda g: f"**Answer:** ${g}$",
    "latex variant": lambda g: f"So the answer is $\\boxed{{{_latex_variants(g)}}}$.",
    "restated after its box": lambda g: f"Therefore $\\boxed{{{g}}}$. The answer is ${g}$.",
    "the answer is": lambda g: f"After simplifying, the answer is ${g}$.",
    "display": lambda g: f"Collecting terms:\n\\[\n\\boxed{{{g}}}\n\\]",
}
_INTEGER_RIGHT: dict[str, Callable[[int], str]] = {
    "chain": lambda n: f"So $N = ({n} - 1) + 1 = {n}$.",
    "chain in a box": lambda n: f"$\\boxed{{2 \\cdot {n} - {n} = {n}}}$",
    "words": lambda n: f"The answer is {words(n)}.",
    "unit": lambda n: f"The total is $\\boxed{{{n} \\text{{ cm}}}}$.",
    "currency": lambda n: f"She pays \\boxed{{\\${n}}}.",
    "taken back for it": lambda n: (
        f"So $k = \\boxed{{{n + 3}}}$. Wait, I double-counted three cases; so $k = {n}$."
    ),
}


def _grouped(n: int) -> str:
    return f"{n:,}".replace(",", "{,}")


def _one_digit(g: str, rng: random.Random) -> str | None:
    digits = [m.start() for m in re.finditer(r"\d", g)]
    if not digits:
        return None
    at = rng.choice(digits)
    return g[:at] + str((int(g[at]) + rng.randint(1, 8)) % 10) + g[at + 1 :]


_NO_DIGIT_CHANGE = re.compile(r"\\(?:begin|end|text|mbox)|\^\\circ")


def _wrongs(g: str, rng: random.Random) -> dict[str, str]:
    found: dict[str, str] = {}
    # (not in a unit or an angle: "864 \\mbox{ inches}^9" is the same number of other units)
    if (changed := _one_digit(g, rng)) is not None and not re.search(
        r"\\(?:begin|end|text|mbox)|\^\\circ", g
    ):
        found["one digit"] = f"So the answer is $\\boxed{{{changed}}}$."
        found["taken back for a wrong one"] = (
            f"We get $\\boxed{{{g}}}$. Wait, that is wrong; the answer is ${changed}$."
        )
    if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\\frac\{\d+\}\{\d+\}", g) and g.strip("-") not in {"0", "0.0"}:
        found["sign"] = f"Final answer: ${g[1:] if g.startswith('-') else '-' + g}$"
    parts = [p.strip() for p in g.strip("()").split(",")]
    # a list of distinct elements (a set drops a repeated one) that no decimal comma reads ("-3,0" is -3.0)
    distinct = len(set(parts)) == len(parts) and not re.fullmatch(r"-?\d+,\d{1,2}", g)
    if "," in g and len(parts) > 1 and distinct and "=" not in g and not g.startswith("["):
        dropped = ", ".join(parts[:-1])
        found["element dropped"] = (
            f"The answer is $\\boxed{{{'(' + dropped + ')' if g.startswith('(') else dropped}}}$."
        )
    return found  # fmt: skip


def math_cases(gold: str, rng: random.Random, per_gold: int) -> list[Case]:
    forms = {k: f(gold) for k, f in _RIGHT.items()}
    if re.fullmatch(r"\d{1,6}", gold):
        n = int(gold)
        forms |= {k: f(n) for k, f in _INTEGER_RIGHT.items()}
        if n >= 1000:
            forms["thousands separator"] = f"The count is $\\boxed{{{_grouped(n)}}}$."
    chosen = rng.sample(sorted(forms), min(per_gold, len(forms)))
    cases = [Case("math", forms[k], gold, True, k) for k in chosen]
    cases += [Case("math", r, gold, False, k) for k, r in _wrongs(gold, rng).items()]
    return cases


# ----------------------------------------------------------------------------- knights and knaves


def _role(k: bool) -> str:
    return "knight" if k else "knave"


def _listed(pairs: list[tuple[str, bool]]) -> str:
    return "\n".join(f"({i + 1}) {n} is a {_role(k)}" for i, (n, k) in enumerate(pairs))


def _kk_forms(names: list[str], sol: list[bool]) -> dict[str, str]:
    pairs = list(zip(names, sol, strict=True))
    knights = ", ".join(n for n, k in pairs if k)
    knaves = ", ".join(n for n, k in pairs if not k)
    forms = {
        "conclusion list": f"Let me check each claim.\n\nCONCLUSION:\n{_listed(pairs)}",
        "lower-case name: role": "Final roles:\n"
        + "\n".join(f"{n.lower()}: {_role(k).upper()}" for n, k in pairs),
        "json": "<answer>" + json.dumps({n: _role(k) for n, k in pairs}) + "</answer>",
        "knights and knaves lists": "\n".join(
            line for line in (knights and f"Knights: {knights}", knaves and f"Knaves: {knaves}") if line
        ),
    }
    # prose with references: "A is a knight. So is B." and "... the others are knaves"
    sentences = []
    for i, (n, k) in enumerate(zip(names, sol, strict=True)):
        same = i > 0 and sol[i - 1] == k
        sentences.append(f"So is {n}." if same else f"{n} is a {_role(k)}.")
    forms["so is"] = "Working through the statements: " + " ".join(sentences)
    knights = [n for n, k in zip(names, sol, strict=True) if k]
    if 0 < len(knights) < len(names):
        first = " and ".join(knights) + (" is a knight" if len(knights) == 1 else " are knights")
        forms["the others"] = f"Therefore {first}, and everyone else is a knave."
    if len(knights) == 1 and len(names) > 2:
        forms["the only"] = f"So {knights[0]} is the only knight."
    return forms


def kk_cases(names: list[str], sol: list[bool], rng: random.Random) -> list[Case]:
    gold = "\n".join(
        f"({i + 1}) {n} is a {_role(k)}" for i, (n, k) in enumerate(zip(names, sol, strict=True))
    )
    meta = {"names": tuple(names), "solution": tuple(sol)}
    cases = [Case("kk", r, gold, True, k, **meta) for k, r in _kk_forms(names, sol).items()]
    flip = rng.randrange(len(names))
    flipped = [k != (i == flip) for i, k in enumerate(sol)]
    flips = _kk_forms(names, flipped)
    cases += [
        Case("kk", flips[k], gold, False, f"role flipped: {k}", **meta) for k in ("conclusion list", "so is")
    ]
    drop = rng.randrange(len(names))
    kept = [(n, k) for i, (n, k) in enumerate(zip(names, sol, strict=True)) if i != drop]
    listed = _listed(kept)
    quoted = f'{names[drop]} said, "{names[drop]} is a {_role(not sol[drop])}".'
    cases.append(Case("kk", f"{quoted}\n\nCONCLUSION:\n{listed}", gold, False, "person dropped", **meta))
    return cases


# ----------------------------------------------------------------------------- the set


def _rows(files: tuple[str, ...]) -> list[dict]:
    rows = []
    for name in files:
        path = DATA / name
        if path.is_file():
            rows += [
                json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
            ]
    return rows


def all_cases(seed: int = 0, per_gold: int = 5) -> list[Case]:
    """The generated set: deterministic for a seed (and the data present)."""
    rng = random.Random(seed)
    golds = BUILT_IN_GOLDS + [r["answer"] for r in _rows(MATH_FILES)]
    cases = [c for g in golds for c in math_cases(g, rng, per_gold)]
    for row in _rows(KK_FILES):
        cases += kk_cases(list(row["names"]), [bool(s) for s in row["solution"]], rng)
    return cases


def grade(cases: list[Case], workers: int) -> list[bool]:
    from reference_trainer.tasks.grading import GradeItem
    from rlbench.eval.pool import GradingPool

    # an older grader (a checkout before the second grader, run to compare) has no `second` switch
    second = {"second": False} if "second" in {f.name for f in fields(GradeItem)} else {}
    items = [
        GradeItem(c.grader, c.response, c.gold, list(c.names) or None, list(c.solution) or None,
                  id=f"generated-{i}", **second)
        for i, c in enumerate(cases)
    ]  # fmt: skip
    with GradingPool(workers=workers, chunk_size=64, timeout=60) as pool:
        return [bool(r.correct) for r in pool.grade(items)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, choices=range(1, 9), default=2, metavar="1..8")
    args = parser.parse_args()
    cases = all_cases(args.seed)
    verdicts = grade(cases, args.workers)
    fp = [c for c, v in zip(cases, verdicts, strict=True) if v and not c.correct]
    fn = [c for c, v in zip(cases, verdicts, strict=True) if c.correct and not v]
    right = sum(c.correct for c in cases)
    print(f"{len(cases)} cases ({right} right, {len(cases) - right} wrong): {len(fp)} false positives, "
          f"{len(fn)} false negatives ({100 * len(fn) / max(right, 1):.2f}% of right)")  # fmt: skip
    kinds = collections.Counter(("FP" if c in fp else "FN", c.kind) for c in fp + fn)
    print(", ".join(f"{v} {k}: {n}" for (v, k), n in sorted(kinds.items())))
    for c in (fp + fn)[:60]:
        print(f"{'FP' if c in fp else 'FN'} [{c.kind}] gold {c.gold[:60]!r}: {c.response[:160]!r}")


if __name__ == "__main__":
    main()
