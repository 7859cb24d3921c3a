"""What the two sides of a rollout run ahead (rollout/ahead.py) share besides the weights: the gate that lets
the rollout side run only inside the trainer's steps, the lock and wake-up guarding the ring's stamps, and
the channel its batches come back on. Every wait here has a deadline at which it asks whether the other side
is still there, so a side killed by any signal is noticed within `POLL_S`, never waited for.

A multiprocessing Condition is not used: its `notify` waits for each sleeper to acknowledge the wake-up, and a
sleeper killed asleep never does, so the notifier would wait forever. Here a wake-up is a semaphore release,
which never blocks, and the one waiter (the rollout side) re-checks what it waits for after each.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from reference_trainer.errors import UserError

POLL_S = 1.0  # how often a waiting side checks that the other is still there
FLUSH_S = 30.0  # how long a failing rollout process tries to send its error before it exits


class Stopped(Exception):
    """The trainer closed the rollout side (or went away)."""


class RolloutDied(UserError):
    """The rollout process ended without a word: killed by a signal, or exited."""


def death_line(exitcode: int | None, step: int | None) -> str:
    """One line for a rollout process gone at `step`: the signal that killed it and how to go on."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    at = "" if step is None else f" during step {step}"
    return (
        f"the rollout process {how}{at} (out of memory, or stopped by a scheduler?); the run keeps every "
        "finished step: `rlbench train --resume RUN_DIR` continues from its last checkpoint"
    )


class _Flag:
    """A multiprocessing Value's `.value`, for the thread backend."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


class Signal:
    """A lock and a wake-up, used as a Condition with one waiter: `with signal:`, `signal.wait(timeout)`,
    `signal.notify_all()`. Taking the lock waits at most POLL_S at a time, then calls `check` (set by each
    side: it raises when the other side is gone, which may have died holding the lock)."""

    def __init__(self, backend: str) -> None:
        if backend == "process":
            mp = multiprocessing.get_context("spawn")
            self._lock: Any = mp.Lock()
            self._wake: Any = mp.Semaphore(0)
        else:
            self._lock, self._wake = threading.Lock(), threading.Semaphore(0)
        self.check: Callable[[], None] | None = None

    def __getstate__(self) -> dict[str, Any]:  # `check` is each side's own
        return {"_lock": self._lock, "_wake": self._wake}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, check=None)

    def __enter__(self) -> Signal:
        while not self._lock.acquire(timeout=POLL_S):
            if self.check is not None:
                self.check()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def notify_all(self) -> None:
        """Wake the waiter, if any (never blocks, with or without the lock held)."""
        self._wake.release()

    def wait(self, timeout: float) -> None:
        """With the lock held: release it, sleep until a wake-up or `timeout`, take it again. The caller
        checks what it waits for afterwards (a wake-up may be an old one)."""
        self._lock.release()
        try:
            if self._wake.acquire(timeout=timeout):
                while self._wake.acquire(False):  # older wake-ups: the caller re-checks anyway
                    pass
        finally:
            self.__enter__()


class Gate:
    """Lets the rollout side run only inside the trainer's steps. `cond` also guards the weight ring's stamps,
    so one wake-up reaches a side waiting for either. `busy` is held by the rollout side around each forward
    (and weight load): `hold` returns once none is running, and none starts until `let_run`."""

    def __init__(self, backend: str) -> None:
        self.cond = Signal(backend)
        if backend == "process":
            mp = multiprocessing.get_context("spawn")
            self.busy: Any = mp.Lock()
            self.open: Any = mp.Value("b", 0, lock=False)
            self.stop: Any = mp.Value("b", 0, lock=False)
            self.parent: int | None = os.getpid()
        else:
            self.busy = threading.Lock()
            self.open, self.stop, self.parent = _Flag(), _Flag(), None

    def __setstate__(self, state: dict[str, Any]) -> None:  # on the rollout side: the trainer is the other
        self.__dict__.update(state)
        self.cond.check = self.check

    # ---- the trainer's side --------------------------------------------------------------------------------
    def let_run(self) -> None:
        with self.cond:
            self.open.value = 1
        self.cond.notify_all()

    def hold(self, alive: Callable[[], bool]) -> None:
        """Close the gate and wait out a forward in progress: afterwards the rollout side is idle. A side
        that is gone (it may have died holding either lock) is not waited for."""
        self.open.value = 0  # one byte, read by the rollout side under `busy`: no lock needed to close
        self.cond.notify_all()
        while alive():
            if self.busy.acquire(timeout=POLL_S):
                self.busy.release()
                return

    def close(self) -> None:
        """For good: the rollout side stops at its next check. Takes no lock (the other side may hold one)."""
        self.stop.value, self.open.value = 1, 1
        self.cond.notify_all()

    # ---- the rollout side --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise Stopped when the trainer closed the gate for good or its process is gone."""
        if self.stop.value or (self.parent is not None and os.getppid() != self.parent):
            raise Stopped

    def wait(self) -> None:
        """Block (with `cond` held) until something changes, checking the trainer is still there."""
        self.check()
        self.cond.wait(POLL_S)
        self.check()

    @contextmanager
    def forward(self, trace: Any, spans: Any = None) -> Iterator[None]:
        """Around one forward of the rollout side: wait while the gate is closed (closing the rollout
        phase's open stretch in `spans`, if any, and opening a new one when it reopens), then hold `busy`."""
        paused = False
        while True:
            self.check()
            if self.busy.acquire(timeout=POLL_S):
                if self.open.value:
                    break
                self.busy.release()
            else:
                continue
            if spans is not None and not paused:
                spans.pause(trace.now())
            paused = True
            with self.cond:
                while not self.open.value:
                    self.wait()
        try:
            if paused and spans is not None:
                spans.resume(trace.now())
            yield
        finally:
            self.busy.release()


class Outbox:
    """The rollout process's end of the channel: a thread writes each message to the pipe, so a batch is
    sent while the next rollout starts. A trainer gone away is an OSError here, and the thread just ends."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.queue = conn, queue.Queue()
        self.thread = threading.Thread(target=self._send, daemon=True, name="rlbench-outbox")
        self.thread.start()

    def put(self, item: Any) -> None:
        self.queue.put(item)

    def flush(self) -> None:
        """Send what is queued (within FLUSH_S: a trainer that stopped reading is not waited for)."""
        self.queue.put(None)
        self.thread.join(timeout=FLUSH_S)

    def _send(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self.conn.send(item)
            except OSError:
                return


class Inbox:
    """The trainer's end: `get()` waits for the next message, POLL_S at a time, calling `check` between
    (which raises when the sender is gone). A process that died mid-message is an end of file here, as the
    trainer closed its own copy of the pipe's writing end."""

    def __init__(self, source: Any, check: Callable[[], None]) -> None:
        self.source, self.check = source, check

    def get(self) -> tuple[str, Any]:
        ended = 0  # polls since the pipe ended: the sender is exiting, or is about to be seen dead
        while True:
            if ended:
                time.sleep(POLL_S / 10)
                self.check()
                ended += 1
                if ended > 100:
                    raise RolloutDied("the rollout process closed its channel and did not exit")
                continue
            if isinstance(self.source, queue.Queue):
                try:
                    return self.source.get(timeout=POLL_S)
                except queue.Empty:
                    pass
            elif self.source.poll(POLL_S):
                try:
                    return self.source.recv()
                except (EOFError, OSError):
                    ended = 1  # the sender is gone: `check` says how
            self.check()
