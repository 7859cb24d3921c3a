"""The two host-device transfers of an engine step: one upload of the step's integer inputs, one read-back
of what was sampled. Nothing else in a decode or verify step moves data between host and device, so on a GPU
the host never waits for the device except at the read-back (tests/test_sync_free.py counts them)."""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterable

import torch

PAD_ID = 0  # any valid id: padded columns are computed but never read


def padded(rows: list[list[int]], width: int) -> list[int]:
    """Rows right-padded to `width`, flat."""
    if all(len(r) == width for r in rows):  # a decode step's rows, or verify rows of one width
        return list(itertools.chain.from_iterable(rows))
    return [tok for r in rows for tok in r + [PAD_ID] * (width - len(r))]


def host_longs(values: Iterable[int]) -> torch.Tensor:
    """Python ints as a CPU int64 tensor, through a C array: a third of torch.tensor's time on 1,280 ints
    (this runs every step). Under FakeTensorMode a tensor made from a buffer stays real, so
    benchmarks/kernel_count.py builds it with torch.tensor instead."""
    longs = array.array("q", values)
    return torch.frombuffer(longs, dtype=torch.long) if longs else torch.zeros(0, dtype=torch.long)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without blocking the host: through pinned memory on CUDA (PyTorch's
    caching host allocator keeps the pinned block until the copy is done)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def upload(
    parts: dict[str, list[int]], device: torch.device, into: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Integer lists as int64 views of one device tensor, in one copy: `into`'s first elements when given (a
    persistent buffer, written in place), else a new tensor."""
    host = host_longs(itertools.chain.from_iterable(parts.values()))
    if into is None:
        flat = to_device(host, device)
    else:
        flat = into[: host.numel()]
        flat.copy_(host.pin_memory() if device.type == "cuda" else host, non_blocking=True)
    views, offset = {}, 0
    for name, values in parts.items():
        views[name] = flat[offset : offset + len(values)]
        offset += len(values)
    return views


def read_back(*rows: torch.Tensor) -> list[list[float]]:
    """The step's one device-to-host transfer: equal-length rows (token ids, flags, log-probs) as float64
    lists (exact for token ids below 2^53)."""
    return torch.stack([r.double() for r in rows]).tolist()
