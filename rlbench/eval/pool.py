"""The grading pool: forked workers with a wall-clock limit per chunk, which die with their parent.

A pathological response can neither hang nor crash a run: a stuck worker is killed, the pool replaced,
and the item counted wrong with one log line naming it. A verdict does not depend on the machine's load: an
item that timed out (the pool's wall clock, or math-verify's own limit inside) is graded once more, alone,
with limits three times as long, and that second verdict is the item's (`GradeResult.retried`). So a
pathological response costs at most its chunk's limit, its own, and the retry's (5 + 5 + 15 s).

A killed eval (`kill -9`, `kill -TERM`) takes its workers along: each asks the kernel for SIGKILL when its
parent dies (PR_SET_PDEATHSIG), or, where there is no prctl, watches its parent from a thread. Without that
they would live on under PID 1, ~0.5 GB each.
"""

from __future__ import annotations

import ctypes
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
from dataclasses import replace
from typing import Any, TypeVar

from reference_trainer.tasks.grading import (
    MATH_VERIFY_TIMED_OUT,
    RETRY_VERIFY_TIMEOUT_S,
    GradeItem,
    GradeResult,
    GradingTimeout,
    VoteItem,
    answer_classes,
    text_classes,
)
from reference_trainer.tasks.second_opinion import grade_both

log = logging.getLogger("rlbench.eval")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_TIMED_OUT = "grading timed out"
RETRY_FACTOR = 3  # the retry's wall-clock limit, in multiples of the first
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
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="watch-parent").start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    # Ctrl-C reaches the whole process group; the parent alone answers it (it kills the workers), so a
    # worker neither prints a KeyboardInterrupt traceback nor waits on a lock its fork copied held.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_chunk(fn: Callable[[T], R], items: list[T]) -> list[R]:
    return [fn(it) for it in items]


class GradingPool:
    """Runs grading functions in forked workers; any chunk past `timeout` seconds of wall clock is killed.

    Items go out in chunks (fast path). A chunk that times out or crashes its worker is retried one item
    at a time, each with the same limit. An item that timed out is then graded once more with the longer
    limits (`retry_timeout`, and math-verify's `retry_verify_timeout_s`); an item that still fails gets
    its fallback and one log line.
    """

    def __init__(
        self,
        grade_fn: Callable[[GradeItem], GradeResult] = grade_both,  # rlbench's grader and the second
        workers: int | None = None,
        timeout: float = 5.0,
        chunk_size: int = 8,
        retry_timeout: float | None = None,
        retry_verify_timeout_s: int = RETRY_VERIFY_TIMEOUT_S,
    ) -> None:
        import math_verify  # noqa: F401  - imported before forking so workers start warm

        self.grade_fn = grade_fn
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.retry_timeout = RETRY_FACTOR * timeout if retry_timeout is None else retry_timeout
        self.retry_verify_timeout_s = retry_verify_timeout_s
        self.failures = 0
        self.retries = 0  # items graded a second time after a timeout
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

    def start(self) -> None:
        """Fork the workers now (a round trip through each start-up) rather than at the first grade."""
        self._executor().submit(int).result()

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
        fail = lambda reason: GradeResult(None, False, reason)  # noqa: E731
        results, retried = self._map_retrying(self.grade_fn, items, fail, lambda r: r.error)
        for i in retried:
            results[i].retried = True
        for i, (item, res) in enumerate(zip(items, results, strict=True)):
            if res.error is not None:
                again = " (also on the retry)" if res.retried else ""
                log.warning("%s: %s%s; counted wrong", _name(item, i), res.error, again)
        return results

    def classes(self, votes: Sequence[VoteItem]) -> list[list[int | None]]:
        """Each problem's answer classes (`answer_classes`); where comparing fails, classes by exact text."""
        out, _ = self._map_retrying(answer_classes, votes, lambda reason: reason, _reason)
        failed: dict[int, str] = {}
        for i, (vote, res) in enumerate(zip(votes, out, strict=True)):
            if isinstance(res, str):
                failed[i] = res
                log.warning("%s: %s; majority vote by exact answer text", _name(vote, i), res)
        return [text_classes(v.keys) if i in failed else out[i] for i, v in enumerate(votes)]

    def map(self, fn: Callable[[T], R], items: Sequence[T], on_fail: Callable[[str], Any]) -> list[Any]:
        """fn(item) for every item, in workers; `on_fail(reason)` stands in for an item that failed."""
        results, failed = self._attempt(fn, items, on_fail, self.timeout, self.chunk_size)
        self.failures += len(failed)
        return results

    def _map_retrying(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        on_fail: Callable[[str], Any],
        reason: Callable[[Any], str | None],
    ) -> tuple[list[Any], list[int]]:
        """`map`, then every item whose first attempt timed out (`reason(result)` says so) graded again
        alone with the longer limits, its second result standing: a timeout says more about the machine's
        load than about the answer. Returns the results and the indices retried."""
        results, failed = self._attempt(fn, items, on_fail, self.timeout, self.chunk_size)
        again = [i for i, r in enumerate(results) if _is_timeout(reason(r))]
        if again:
            self.retries += len(again)
            for i in again:
                log.info("%s: timed out; graded again with longer limits", _name(items[i], i))
            slower = [replace(items[i], verify_timeout_s=self.retry_verify_timeout_s) for i in again]
            second, failed_again = self._attempt(fn, slower, on_fail, self.retry_timeout, 1)
            for j, i in enumerate(again):
                results[i] = second[j]
                failed.discard(i)
                if j in failed_again:
                    failed.add(i)
        self.failures += len(failed)
        return results, again

    def _attempt(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        on_fail: Callable[[str], Any],
        limit: float,
        size: int,
    ) -> tuple[list[Any], set[int]]:
        """fn(item) for every item, `size` to a chunk, each chunk under `limit` seconds; returns the
        results and the indices that failed (their result is `on_fail(reason)`)."""
        results: list[Any] = [None] * len(items)
        done = [False] * len(items)
        failed: set[int] = set()
        chunks = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
        solo: list[int] = []
        # Fast path: `workers` chunks at a time, so each chunk starts at once and the limit is wall clock.
        for w in range(0, len(chunks), self.workers):
            wave = chunks[w : w + self.workers]
            solo += self._run_wave(fn, items, wave, results, done, failed, on_fail, limit, final=False)
        for i in solo:
            self._run_wave(fn, items, [[i]], results, done, failed, on_fail, limit, final=True)
        for i, ok in enumerate(done):
            if not ok:
                results[i] = on_fail("not graded")
                failed.add(i)
        return results, failed

    def _run_wave(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        chunks: list[list[int]],
        results: list[Any],
        done: list[bool],
        failed: set[int],
        on_fail: Callable[[str], Any],
        limit: float,
        final: bool,
    ) -> list[int]:
        """Run chunks in parallel; fill `results`; return indices to retry alone (when not `final`)."""
        pool = self._executor()
        futures = {pool.submit(_run_chunk, fn, [items[i] for i in chunk]): chunk for chunk in chunks}
        finished, not_done = wait(futures, timeout=limit)
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
                except GradingTimeout:
                    reason = MATH_VERIFY_TIMED_OUT
                except Exception as err:  # the grader itself raised: a failure, not fatal
                    reason = f"grader error: {type(err).__name__}: {err}"
            else:
                reason = f"{_TIMED_OUT} after {limit:g}s"
            if final or (len(chunk) == 1 and not maybe_innocent):
                for i in chunk:
                    failed.add(i)
                    results[i], done[i] = on_fail(reason), True
            else:
                retry += chunk
        if broken:
            self._kill()
        return retry


def _reason(result: Any) -> str | None:
    """The failure reason `map` put in place of a result (a string), else None."""
    return result if isinstance(result, str) else None


def _is_timeout(reason: str | None) -> bool:
    return reason is not None and (reason.startswith(_TIMED_OUT) or reason == MATH_VERIFY_TIMED_OUT)


def _name(item: Any, index: int) -> str:
    return getattr(item, "id", "") or f"item {index}"
