"""Timing the engine's own forwards on probe sequences in free slots: what a cost model is built from (the
speculator's verify gate, speculation/cost.py).

Each cell runs through the runner's own entry points (`decode` for width 1, `extend` for a verify of width
> 1), so it measures the path the engine takes: on CUDA with `EngineConfig.cuda_graphs` the static shapes
replayed as CUDA graphs (the untimed first run of a cell captures its graph); elsewhere the eager forward at
the step's own shape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq

import torch

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.runner import ModelRunner
from reference_trainer.engine.sequence import Sequence

PROBE_TOKEN = 3  # any valid id: the timing does not depend on the values


def _probe(slots: SlotManager, index: int, context: int, width: int) -> Sequence:
    """A sequence in a free slot with `context` tokens counted as cached (their K/V are whatever the slot
    holds) and room for `width` more."""
    seq = Sequence(f"cost-probe-{index}", [PROBE_TOKEN] * (context + 1), SamplingParams())
    seq.slot = slots.allocate()
    slots.reserve(seq.slot, context + width)
    seq.num_cached = context
    return seq


def synchronize(device: torch.device) -> None:
    """Wait for the device: CUDA runs kernels asynchronously, and a timing must cover the work, not its
    launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_forwards(
    runner: ModelRunner, slots: SlotManager, batches: Seq[int], widths: Seq[int], context: int, repeats: int
) -> dict[tuple[int, int], float]:
    """Seconds of one forward of `batch` rows x `width` tokens continuing `context`-token sequences, for
    every (batch, width): the fastest of `repeats` runs after a warm-up (other load only ever adds time)."""
    table: dict[tuple[int, int], float] = {}
    for b in batches:
        probes = [_probe(slots, i, context, max(widths)) for i in range(b)]
        for q in widths:
            times = []
            for _ in range(repeats + 1):  # the first run warms up (and captures the graph of its shape)
                for probe in probes:
                    probe.num_cached = context  # a decode step counts its token as cached: undo it
                synchronize(runner.device)
                t0 = time.perf_counter()
                if q == 1:
                    runner.decode(probes)
                else:
                    runner.extend(probes, [[PROBE_TOKEN] * q for _ in probes])
                synchronize(runner.device)
                times.append(time.perf_counter() - t0)
            table[b, q] = min(times[1:])
        for probe in probes:
            slots.release(probe.slot)  # type: ignore[arg-type]
    return table
