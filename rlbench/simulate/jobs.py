"""The simulator's work items: the trace's groups as a stream, and the outstanding sequences of a step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlbench.simulate.workload import LengthTrace


@dataclass
class Stream:
    """The trace's groups in submission order (cycled: a second pass is the next epoch). Group g's trace
    rows are rows[bounds[g]:bounds[g + 1]]."""

    rows: np.ndarray
    bounds: np.ndarray
    step_groups: list[int]  # groups per step of the trace

    @classmethod
    def of(cls, trace: LengthTrace) -> Stream:
        key = trace.step * (int(trace.prompt.max()) + 1) + trace.prompt
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        g = rank[inv]
        rows = np.argsort(g, kind="stable")
        bounds = np.searchsorted(g[rows], np.arange(order.size + 1))
        steps = trace.step[rows[bounds[:-1]]]
        return cls(rows, bounds, np.unique(steps, return_counts=True)[1].tolist())

    @property
    def n_groups(self) -> int:
        return self.bounds.size - 1

    def expand(self, uids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(trace row, index into uids) of every sequence of the groups `uids`."""
        g = uids % self.n_groups
        sizes = self.bounds[g + 1] - self.bounds[g]
        which = np.repeat(np.arange(uids.size), sizes)
        offs = np.arange(which.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.rows[self.bounds[g][which] + offs], which


@dataclass
class Jobs:
    """Outstanding sequences of a step, one entry per sequence (columns)."""

    row: np.ndarray  # trace row
    uid: np.ndarray  # stream position of its group
    worker: np.ndarray
    tokens: np.ndarray  # still to generate
    ctx0: np.ndarray  # prefill context
    done: np.ndarray  # finished in an earlier step, waiting for its group (partial mode)
    # partial mode: the step that generated the job's oldest kept token (its policy version); -1 = none kept
    born: np.ndarray

    @classmethod
    def empty(cls) -> Jobs:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, np.zeros(0, dtype=bool), z)

    def __len__(self) -> int:
        return int(self.row.size)

    def take(self, mask: np.ndarray) -> Jobs:
        return Jobs(*(getattr(self, f)[mask] for f in FIELDS))

    @staticmethod
    def cat(a: Jobs, b: Jobs) -> Jobs:
        return Jobs(*(np.concatenate([getattr(a, x), getattr(b, x)]) for x in FIELDS))


FIELDS = ("row", "uid", "worker", "tokens", "ctx0", "done", "born")
