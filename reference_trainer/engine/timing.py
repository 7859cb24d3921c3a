"""Timing the engine's own forwards on probe sequences in free slots: what a cost model is built from (the
speculator's verify gate, speculation/cost.py; the admission gate's overhead, scheduler.py).

Each cell runs through the runner's own entry points (`decode` for width 1, `extend` for a verify of width
> 1, `mixed` for a decode step with an admission riding in it), so it measures the path the engine takes:
on CUDA with `EngineConfig.cuda_graphs` the static shapes replayed as CUDA graphs (the untimed first run of
a cell captures its graph); elsewhere the eager forward at the step's own shape.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
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


def _fastest(
    run: Callable[[], object], reset: Callable[[], None], device: torch.device, repeats: int
) -> float:
    """The fastest of `repeats` runs of `run`, each after `reset`, after an untimed warm-up (which may
    capture a graph or compile): other load only ever adds time."""
    times = []
    for _ in range(repeats + 1):
        reset()
        synchronize(device)
        t0 = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def _release(slots: SlotManager, seqs: Seq[Sequence]) -> None:
    for seq in seqs:
        slots.release(seq.slot)  # type: ignore[arg-type]


@torch.inference_mode()
def time_forwards(
    runner: ModelRunner, slots: SlotManager, batches: Seq[int], widths: Seq[int], context: int, repeats: int
) -> dict[tuple[int, int], float]:
    """Seconds of one forward of `batch` rows x `width` tokens continuing `context`-token sequences, for
    every (batch, width)."""
    table: dict[tuple[int, int], float] = {}
    for b in batches:
        probes = [_probe(slots, i, context, max(widths)) for i in range(b)]

        def reset(probes: list[Sequence] = probes) -> None:
            for probe in probes:  # a decode step counts its token as cached: undone before each run
                probe.num_cached = context

        for q in widths:
            rows = [[PROBE_TOKEN] * q for _ in probes]
            run = (
                (lambda p=probes: runner.decode(p))
                if q == 1
                else (lambda p=probes, r=rows: runner.extend(p, r))
            )
            table[b, q] = _fastest(run, reset, runner.device, repeats)
        _release(slots, probes)
    return table


@torch.inference_mode()
def admission_overhead(
    runner: ModelRunner, slots: SlotManager, batches: Seq[int], tokens: int, repeats: int
) -> dict[int, float]:
    """For each batch b: (a decode step of b rows with one admission of `tokens` tokens riding in it, minus
    a plain decode step of b rows) / the plain step. A plain decode step replays its graph where the runner
    has them; a step with an admission replays its own (runner.mixed, engine/mixed.py) or runs eagerly."""
    table: dict[int, float] = {}
    for b in batches:
        probes = [_probe(slots, i, tokens, 1) for i in range(b)]
        admitted = _probe(slots, b, 0, tokens + 1)
        admitted.prompt_ids = [PROBE_TOKEN] * tokens

        def reset(probes: list[Sequence] = probes, admitted: Sequence = admitted) -> None:
            for probe in probes:
                probe.num_cached = tokens
            admitted.num_cached = 0

        plain = _fastest(lambda p=probes: runner.decode(p), reset, runner.device, repeats)
        mixed = _fastest(lambda p=probes, a=admitted: runner.mixed(p, [a]), reset, runner.device, repeats)
        table[b] = max(0.0, (mixed - plain) / plain)
        _release(slots, [*probes, admitted])
    return table


def interpolate(table: dict[int, float], x: float) -> float:
    """A value of `table` (batch -> value) at `x`: linear between its batches, flat beyond them."""
    keys = sorted(table)
    i = bisect.bisect_left(keys, x)
    if i in (0, len(keys)):  # flat beyond the batches
        return table[keys[0 if i == 0 else -1]]
    lo, hi = keys[i - 1], keys[i]
    return table[lo] + (table[hi] - table[lo]) * (x - lo) / (hi - lo)
