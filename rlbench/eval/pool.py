"""The grading pool: forked workers with a wall-clock limit per chunk, which die with their parent.

A pathological response can neither hang nor crash a run: a stuck worker is killed, the pool replaced,
and the item counted wrong with one log line naming it. A killed eval (`kill -9`, `kill -TERM`) takes its
workers along: each asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), or, where there is
no prctl, watches its parent from a thread. Without that they would live on under PID 1, ~0.5 GB each.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from rlbench.eval.grading import GradeItem, GradeResult, VoteItem, answer_classes, grade_item, text_classes

log = logging.getLogger("rlbench.eval")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
T = TypeVar("T")
R = TypeVar("R")


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this process when `parent` (the process that forked it) dies."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="watch-parent").start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _run_chunk(fn: Callable[[T], R], items: list[T]) -> list[R]:
    return [fn(it) for it in items]


class GradingPool:
    """Runs grading functions in forked workers; any chunk past `timeout` seconds of wall clock is killed.

    Items go out in chunks (fast path). A chunk that times out or crashes its worker is retried one item
    at a time, each with the same limit; an item that still fails gets its fallback and one log line.
    """

    def __init__(
        self,
        grade_fn: Callable[[GradeItem], GradeResult] = grade_item,
        workers: int | None = None,
        timeout: float = 5.0,
        chunk_size: int = 8,
    ) -> None:
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
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("fork"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
        return self._pool

    def worker_pids(self) -> list[int]:
        pool = self._pool
        return sorted(getattr(pool, "_processes", None) or {}) if pool is not None else []

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
        """Grade every item; one that fails (timeout, crash, grader error) is counted wrong."""
        results = self.map(self.grade_fn, items, lambda reason: GradeResult(None, False, reason))
        for i, (item, res) in enumerate(zip(items, results, strict=True)):
            if res.error is not None:
                log.warning("%s: %s; counted wrong", getattr(item, "id", "") or f"item {i}", res.error)
        return results

    def classes(self, votes: Sequence[VoteItem]) -> list[list[int | None]]:
        """Each problem's answer classes (`answer_classes`); where comparing fails, classes by exact text."""
        failed: dict[int, str] = {}
        out = self.map(answer_classes, votes, lambda reason: reason)
        for i, (vote, res) in enumerate(zip(votes, out, strict=True)):
            if isinstance(res, str):
                failed[i] = res
                log.warning("%s: %s; majority vote by exact answer text", vote.id or f"item {i}", res)
        return [text_classes(v.keys) if i in failed else out[i] for i, v in enumerate(votes)]

    def map(self, fn: Callable[[T], R], items: Sequence[T], on_fail: Callable[[str], Any]) -> list[Any]:
        """fn(item) for every item, in workers; `on_fail(reason)` stands in for an item that failed."""
        results: list[Any] = [None] * len(items)
        done = [False] * len(items)
        chunks = [
            list(range(i, min(i + self.chunk_size, len(items))))
            for i in range(0, len(items), self.chunk_size)
        ]
        solo: list[int] = []
        # Fast path: `workers` chunks at a time, so each chunk starts at once and the limit is wall clock.
        for w in range(0, len(chunks), self.workers):
            solo += self._run_wave(
                fn, items, chunks[w : w + self.workers], results, done, on_fail, final=False
            )
        for i in solo:
            self._run_wave(fn, items, [[i]], results, done, on_fail, final=True)
        return [r if ok else on_fail("not graded") for r, ok in zip(results, done, strict=True)]

    def _run_wave(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        chunks: list[list[int]],
        results: list[Any],
        done: list[bool],
        on_fail: Callable[[str], Any],
        final: bool,
    ) -> list[int]:
        """Run chunks in parallel; fill `results`; return indices to retry alone (when not `final`)."""
        pool = self._executor()
        futures = {pool.submit(_run_chunk, fn, [items[i] for i in chunk]): chunk for chunk in chunks}
        finished, not_done = wait(futures, timeout=self.timeout)
        retry: list[int] = []
        broken = bool(not_done)
        for fut, chunk in futures.items():
            maybe_innocent = False  # a crash breaks every future of the pool, not just the culprit's
            if fut in finished:
                try:
                    for i, res in zip(chunk, fut.result(), strict=True):
                        results[i], done[i] = res, True
                    continue
                except BrokenProcessPool:
                    broken, maybe_innocent, reason = True, True, "grader worker crashed"
                except Exception as err:  # the grader itself raised: a failure, not fatal
                    reason = f"grader error: {type(err).__name__}: {err}"
            else:
                reason = f"grading timed out after {self.timeout:g}s"
            if final or (len(chunk) == 1 and not maybe_innocent):
                for i in chunk:
                    self.failures += 1
                    results[i], done[i] = on_fail(reason), True
            else:
                retry += chunk
        if broken:
            self._kill()
        return retry
