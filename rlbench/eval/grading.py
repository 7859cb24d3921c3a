"""Answer extraction and grading: math with math-verify, Knights-and-Knaves by the stated assignment.

Model output is untrusted text: nothing here evaluates it (no eval/exec/sympify); math-verify parses
LaTeX with its own grammar. Every grade runs in a forked worker with a wall-clock limit, so a
pathological response can neither hang nor crash a run: a stuck worker is killed, the pool replaced,
and the item counted wrong with the reason logged.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.tasks.kk import format_assignment

log = logging.getLogger("rlbench.eval")

MAX_RESPONSE_CHARS = 20_000  # only the tail can hold the final answer; bounds regex and parser work
_VERIFY_TIMEOUT_S = 1  # math-verify's own (signal) timeouts, inside the worker


# ----------------------------------------------------------------------------- extraction


def _braced_after(text: str, start: int) -> str | None:
    """Content of the balanced {...} group opening at text[start] (None when unbalanced)."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` (braces balanced), or `\\boxed 5`."""
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*(\{|\s+[^\s$]+)", text))):
        if m.group(1) == "{":
            inner = _braced_after(text, m.start(1))
            if inner is not None:
                return inner.strip()
        else:
            return m.group(1).strip()
    return None


_FINAL_RE = re.compile(r"final answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s*I hope|[.\n]|$)", re.IGNORECASE)
_ANSWER_RE = re.compile(r"(?:the answer is|answer\s*:)\s*\$?([^\n$]+?)\$?\s*(?:[.\n]|$)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer: last boxed; else "final answer is X"; else "answer: X"; else the last number."""
    text = text[-MAX_RESPONSE_CHARS:]
    boxed = last_boxed(text)
    if boxed:
        return boxed
    for pattern in (_FINAL_RE, _ANSWER_RE):
        found = pattern.findall(text)
        if found and found[-1].strip():
            return found[-1].strip()
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def normalize_answer(ans: str) -> str:
    """A cheap canonical string for voting and plain-text fallback comparison."""
    s = ans.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|!|,|;|:|displaystyle)", "", s)
    s = (
        s.replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
        .replace("^\\circ", "")
        .replace("^{\\circ}", "")
    )
    s = re.sub(r"\s+", "", s).rstrip(".").lower()
    if re.fullmatch(r"-?[\d,]+", s) and "," in s and re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")  # 1,000 -> 1000; tuples like 1,2 stay
    return s


# ----------------------------------------------------------------------------- math


def grade_math(pred: str | None, gold: str) -> bool:
    """math-verify equivalence of an extracted answer and the gold. Golds that are bare LaTeX parse to
    nothing unless wrapped in $...$, so both sides are wrapped."""
    if pred is None or not pred.strip():
        return False
    from math_verify import parse, verify

    def wrapped(s: str) -> str:
        # "N=n": math-verify folds case, so the gold becomes Eq(n, n) == True and matches anything false
        # too; compare right-hand sides, as the Qwen harness does when it strips "x=" prefixes.
        m = re.fullmatch(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*=([^=]+)", s)
        s = (m.group(1) if m else s).strip()
        return s if ("$" in s or "\\boxed" in s or "\\(" in s) else f"${s}$"

    gold_parsed = parse(wrapped(gold), parsing_timeout=_VERIFY_TIMEOUT_S)
    pred_parsed = parse(wrapped(pred), parsing_timeout=_VERIFY_TIMEOUT_S)
    if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=_VERIFY_TIMEOUT_S):
        return True
    return normalize_answer(pred) == normalize_answer(gold)  # text golds (e.g. \text{Evelyn})


# ----------------------------------------------------------------------------- knights and knaves


def _kk_region(text: str) -> str:
    """The part of the response that states the answer: the last <answer> block or what follows the
    last CONCLUSION: marker, else the whole response (where later statements win)."""
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1]
    idx = text.upper().rfind("CONCLUSION")
    return text[idx:] if idx >= 0 else text


def parse_kk_assignment(text: str, names: Sequence[str]) -> dict[str, bool] | None:
    """{name: is_knight} from statements like "(1) Zoey is a knave" / "Oliver is a knight"; the last
    statement about each name wins. None unless every name gets a role.

    Deliberately more lenient than the training reward's parser (reference_trainer/tasks/kk.py): it grades
    arbitrary models' free-form answers ("Zoey must be a knight", "Zoey: knave", <answer> blocks), where
    the training reward only reads the embedded format and rejects hedged answers outright.
    """
    region = _kk_region(text[-MAX_RESPONSE_CHARS:])
    result: dict[str, bool] = {}
    for name in names:
        pattern = rf"\b{re.escape(name)}\b\W{{0,3}}\s*(?:is|was|must be|:)\s*(?:a|an)?\s*\**\s*(knight|knave)"
        found = re.findall(pattern, region, re.IGNORECASE)
        if not found:
            return None
        result[name] = found[-1].lower() == "knight"
    return result


def kk_gold(answer: str, names: Sequence[str], solution: Sequence[bool] | None) -> dict[str, bool]:
    if solution is not None and len(solution) == len(names):
        return {n: bool(s) for n, s in zip(names, solution, strict=True)}
    parsed = parse_kk_assignment(answer, names)
    if parsed is None:
        raise ValueError(f"cannot read the gold K&K assignment from {answer!r}")
    return parsed


def format_kk_assignment(assignment: dict[str, bool]) -> str:
    return format_assignment(list(assignment), list(assignment.values()))


# ----------------------------------------------------------------------------- items and the pool


@dataclass
class GradeItem:
    grader: str  # "math" | "kk"
    response: str
    gold: str
    names: list[str] | None = None
    solution: list[bool] | None = None


@dataclass
class GradeResult:
    extracted: str | None
    correct: bool
    error: str | None = None
    key: str | None = None  # canonical answer for majority voting
    extra: dict[str, Any] = field(default_factory=dict)


def grade_item(item: GradeItem) -> GradeResult:
    """Extract and grade one response; runs inside a pool worker."""
    if item.grader == "kk":
        names = item.names or []
        pred = parse_kk_assignment(item.response, names)
        if pred is None:
            return GradeResult(extracted=None, correct=False)
        text = format_kk_assignment(pred)
        gold = kk_gold(item.gold, names, item.solution)
        return GradeResult(extracted=text, correct=pred == gold, key=text)
    extracted = extract_answer(item.response)
    if extracted is None:
        return GradeResult(extracted=None, correct=False)
    return GradeResult(
        extracted=extracted, correct=grade_math(extracted, item.gold), key=normalize_answer(extracted)
    )


def _run_chunk(fn: Callable[[GradeItem], GradeResult], items: list[GradeItem]) -> list[GradeResult]:
    return [fn(it) for it in items]


class GradingPool:
    """Grades items in forked workers; any chunk past `timeout` seconds of wall clock is killed.

    Items go out in chunks (fast path). A chunk that times out or crashes its worker is retried one item
    at a time, each with the same limit; an item that still fails is counted wrong and logged.
    """

    def __init__(
        self,
        grade_fn: Callable[[GradeItem], GradeResult] = grade_item,
        workers: int | None = None,
        timeout: float = 5.0,
        chunk_size: int = 8,
    ) -> None:
        import os

        import math_verify  # noqa: F401  - imported before forking so workers start warm

        self.grade_fn = grade_fn
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.failures = 0
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # fork: workers inherit the parent's imports; math-verify's signal timeouts need a main thread.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool

    def _kill(self) -> None:
        """Hard-stop every worker (a stuck sympy call ignores everything but SIGKILL) and drop the pool."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public API kills a busy worker
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GradingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade(self, items: Sequence[GradeItem]) -> list[GradeResult]:
        results: list[GradeResult | None] = [None] * len(items)
        chunks = [list(range(i, i + self.chunk_size)) for i in range(0, len(items), self.chunk_size)]
        chunks[-1:] = [[j for j in chunks[-1] if j < len(items)]] if chunks else []
        solo: list[int] = []
        # Fast path: `workers` chunks at a time, so each chunk starts at once and the limit is wall clock.
        for w in range(0, len(chunks), self.workers):
            solo += self._run_wave(items, chunks[w : w + self.workers], results, final=False)
        for i in solo:
            self._run_wave(items, [[i]], results, final=True)
        return [r if r is not None else GradeResult(None, False, "not graded") for r in results]

    def _run_wave(
        self,
        items: Sequence[GradeItem],
        chunks: list[list[int]],
        results: list[GradeResult | None],
        final: bool,
    ) -> list[int]:
        """Run chunks in parallel; fill `results`; return indices to retry alone (when not `final`)."""
        pool = self._executor()
        futures = {
            pool.submit(_run_chunk, self.grade_fn, [items[i] for i in chunk]): chunk for chunk in chunks
        }
        done, not_done = wait(futures, timeout=self.timeout)
        retry: list[int] = []
        broken = bool(not_done)
        for fut, chunk in futures.items():
            maybe_innocent = False  # a crash breaks every future of the pool, not just the culprit's
            if fut in done:
                try:
                    for i, res in zip(chunk, fut.result(), strict=True):
                        results[i] = res
                    continue
                except BrokenProcessPool:
                    broken, maybe_innocent, reason = True, True, "grader worker crashed"
                except Exception as err:  # the grader itself raised: wrong, not fatal
                    reason = f"grader error: {type(err).__name__}: {err}"
            else:
                reason = f"grading timed out after {self.timeout:g}s"
            if final or (len(chunk) == 1 and not maybe_innocent):
                for i in chunk:
                    self.failures += 1
                    log.warning("counted wrong: %s (response tail %r)", reason, items[i].response[-80:])
                    results[i] = GradeResult(extracted=None, correct=False, error=reason)
            else:
                retry += chunk
        if broken:
            self._kill()
        return retry
