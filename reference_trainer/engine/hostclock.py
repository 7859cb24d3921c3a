"""The rollout's host work counted as itself: CPU seconds of the rollout's thread (`time.thread_time`), split
by where they go (`engine`, `controller`, `sampling`, `forwards`: what each holds is docs/metrics.md's, the
rollout phase's `host_cpu_s`), so the figure does not move with the machine's load the way wall time does.

Parts are exclusive: a part nested inside another is not counted in the outer one. `forwards` (on a CPU the
model's compute, on a GPU its launches and its wait for the device) is kept apart and never counted as host
work: the GPU replay puts a calibration's measured forward in its place. Thread CPU time counts the rollout
thread only: a forward's intra-op worker threads are the forward's.
"""

from __future__ import annotations

import time

HOST_PARTS = ("engine", "controller", "sampling")
FORWARDS = "forwards"
PARTS = (*HOST_PARTS, FORWARDS)


class _Part:
    """`with clock.engine:` and the like: one reusable context per part (no generator on the hot path)."""

    __slots__ = ("clock", "name")

    def __init__(self, clock: HostClock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock.enter(self.name)

    def __exit__(self, *exc: object) -> None:
        self.clock.leave()


class HostClock:
    """Exclusive thread-CPU seconds per part, accumulated for the clock's life; a rollout reads what it added
    (`since`). Outside every part nothing is counted."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._stack: list[str | None] = []
        self._part: str | None = None
        self._since = 0.0
        self.reads = 0  # clock reads made: each costs a system call, counted in the part it ends
        self.engine, self.controller = _Part(self, "engine"), _Part(self, "controller")
        self.sampling, self.forwards = _Part(self, "sampling"), _Part(self, FORWARDS)

    def _read(self) -> float:
        """Now, with the seconds since the last read credited to the part running (the read counts in it)."""
        now = time.thread_time()
        self.reads += 1
        if self._part is not None:
            self.seconds[self._part] += now - self._since
        return now

    def enter(self, part: str) -> None:
        self._stack.append(self._part)
        self._part, self._since = part, self._read()

    def leave(self) -> None:
        self._part, self._since = self._stack.pop(), self._read()

    def switch(self, part: str) -> None:
        """Leave the innermost part for `part` at the same level: one clock read instead of two (a read of
        the thread's CPU clock is a system call, a few microseconds, and it counts in the part it ends)."""
        self._part, self._since = part, self._read()

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """Seconds per part added since `before` (a `snapshot`)."""
        return {part: self.seconds[part] - before[part] for part in PARTS}


def read_cost_s(reads: int = 2000) -> float:
    """CPU seconds one read of the thread's CPU clock costs on this machine (the mean of `reads`)."""
    start = time.thread_time()
    for _ in range(reads):
        time.thread_time()
    return (time.thread_time() - start) / reads


def host_fields(added: dict[str, float]) -> dict[str, object]:
    """A rollout phase's fields (docs/metrics.md): `host_cpu_s`, the host parts' CPU seconds, and
    `forward_cpu_s`, the forwards' own."""
    return {
        "host_cpu_s": {part: round(added[part], 6) for part in HOST_PARTS},
        "forward_cpu_s": round(added[FORWARDS], 6),
    }
