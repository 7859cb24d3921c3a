"""The GPU path rehearsed on the CPU: decode and verify steps through the static (graph) forward at SmolLM2's
shape with every tensor on the `meta` device, which holds no data. A host sync inside the step (`.item()`,
`bool(tensor)`, a data-dependent shape) raises there, as does a CPU tensor mixed into the device path; and
inside the region a CUDA graph captures, every tensor read must be a parameter, a buffer, the KV cache, the
static input/output buffers, or made inside the region (a graph replays fixed addresses: anything else
would be stale on replay). Only the capture itself needs CUDA (tests/test_static_forward.py on a GPU)."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchmarks.gpu import SMOLLM2_SHAPE
from reference_trainer.engine import engine as engine_module
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.sampler import SamplerOps
from reference_trainer.engine.sequence import Request
from reference_trainer.model.decoder import DecoderLM

SHAPE = dataclasses.replace(SMOLLM2_SHAPE, num_hidden_layers=2)  # every width of SmolLM2, two layers


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class CapturedReads(TorchDispatchMode):
    """Inside the captured region: the storages each op reads that were neither allowed nor made there."""

    def __init__(self, allowed: set[int]) -> None:
        super().__init__()
        self.allowed, self.made, self.strays = allowed, set(), []
        self.inside = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if self.inside:
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and t.dim() > 0 and storage(t) not in self.allowed | self.made:
                    self.strays.append((str(func), tuple(t.shape), t.dtype))
            self.made |= {storage(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
        return out


def rehearse(layout: str, attention: str, stray: torch.Tensor | None = None) -> tuple[CapturedReads, list]:
    """A prefill, a decode step and a verify step of 3 drafts on meta; `stray`: a tensor made outside the
    captured region that the forward is made to read (the check's own test)."""
    from reference_trainer.engine import kv_cache
    from reference_trainer.model import flex

    with torch.device("meta"):
        model = DecoderLM(SHAPE).to(torch.bfloat16)
    batch = 4
    zeros = lambda *rows: [[5.0] * rows[0].shape[0] for _ in rows]  # noqa: E731 (no data to read back)
    with mock.patch.object(kv_cache, "CONTIGUOUS_KV_BYTES", 2**62 if layout == "contiguous" else 0), \
            mock.patch.object(engine_module, "read_back", zeros), \
            mock.patch.object(flex, "attend", lambda q, k, v, mask: torch.empty_like(q)):  # fmt: skip
        # (flex's compiled kernel is the GPU's; its eager reference is tested against matmul elsewhere)
        engine = Engine(model, EngineConfig(max_num_seqs=batch, max_model_len=128, device="meta"), [])
        static = StaticForward(engine.model, engine.slots, engine.config.max_verify_tokens, False, attention,
                               sampling=engine.sampling)  # fmt: skip
        engine.runner.static = static
        allowed = {storage(t) for t in [*engine.model.parameters(), *engine.model.buffers()]}
        table = engine.sampling  # the per-slot sampling settings the decode graph's sampler gathers
        buffers = [static.inputs, static.hidden, static.tokens, static.logprobs]
        tables = [table.key, table.divisor, table.top_p, table.top_k, table.greedy]
        allowed |= {storage(t) for t in [*engine.slots.cache.k, *engine.slots.cache.v, *buffers, *tables]}
        reads = CapturedReads(allowed)
        forward = static._forward

        def captured(*args):  # type: ignore[no-untyped-def]
            reads.inside, reads.made = True, set()
            try:
                forward(*args)
            finally:
                reads.inside = False

        static._forward = captured  # type: ignore[method-assign]
        if stray is not None:
            norm = engine.model.model.norm.forward
            engine.model.model.norm.forward = lambda x: norm(x) + stray  # type: ignore[method-assign]
        params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16, ignore_eos=True, seed=1)
        for i in range(batch):
            engine.add_request(Request([1, *range(3, 3 + 5 * (i + 1))], params))
        engine.step()  # prefill (eager, outside any graph)
        with reads:
            engine.step()  # a decode step
            seqs = engine.running
            scored = engine.runner.extend(
                seqs, [[s.all_ids[-1], 7, 8, 9] for s in seqs]
            )  # a verify of 3 drafts
    assert scored.logits.shape == (4 * batch, SHAPE.vocab_size) and scored.logits.device.type == "meta"
    return reads, seqs


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("attention", ["matmul", "flex"])
def test_decode_and_verify_steps_on_meta_sync_nowhere_and_read_only_static_tensors_inside(layout, attention):
    reads, seqs = rehearse(layout, attention)
    assert all(len(s.response_ids) == 2 for s in seqs)  # the step's tokens went through the host logic
    assert reads.strays == [], reads.strays[:5]


def test_a_tensor_from_outside_read_inside_the_captured_region_is_reported():
    with torch.device("meta"):
        stray = torch.empty(SHAPE.hidden_size, dtype=torch.bfloat16)
    reads, _ = rehearse("paged", "matmul", stray=stray)
    assert {shape for _, shape, _ in reads.strays} == {(SHAPE.hidden_size,)}


def test_a_cpu_tensor_in_the_device_path_is_caught_on_meta():
    """The rehearsal's premise: a host tensor mixed into a meta forward raises (as it would fail on CUDA)."""
    with torch.device("meta"):
        x = torch.empty(4, 8)
    with pytest.raises(RuntimeError):
        _ = x + torch.ones(4, 8)
    with pytest.raises((RuntimeError, NotImplementedError)):
        bool(x.sum() > 0)  # a host sync has no value to read


def test_the_decode_shapes_captured_before_step_0_run_on_meta_in_inference_mode():
    """What `prepare` captures on CUDA before an engine's first step: every (bucket, span) decode forward
    over padding rows, with its inputs where `run` puts them, run here on meta; and the capture itself in
    inference mode, as every engine forward (outside it, compiled flex refuses the block mask)."""
    with torch.device("meta"):
        model = DecoderLM(SHAPE).to(torch.bfloat16)
    engine = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=256, device="meta"), [])
    static = StaticForward(engine.model, engine.slots, engine.config.max_verify_tokens, False, "matmul",
                           sampling=engine.sampling)  # fmt: skip
    ops = SamplerOps.of([SamplingParams(temperature=0.7, top_p=0.9)])
    shapes = static.shapes(ops, verify=False)
    with torch.inference_mode():
        for shape in shapes:
            args = static.padding_args(*shape)
            static._forward(*args)
            ids, starts, where = args[0], args[1], args[2]  # views of the persistent buffer, where `decode`
            slots, positions, _ = args[
                4
            ]  # writes them: ids, starts, rows, then the sampler's slots, positions
            bucket = shape[0]
            assert {storage(t) for t in (ids, starts, slots, positions)} == {storage(static.inputs)}
            offsets = [t.storage_offset() for t in (ids, starts, slots, positions)]
            assert offsets == [0, bucket, 2 * bucket + where.numel(), 3 * bucket + where.numel()]
    spans = static.spans()
    assert spans[0] == 64 and spans[-1] == static.limit and len(set(spans)) == len(spans)
    assert shapes == [(b, 1, s, ops) for b in static.buckets for s in spans]
    modes = []
    static.capture = True  # the capture itself needs CUDA: record the mode it would run in instead
    static._replay = lambda shape, args: modes.append(torch.is_inference_mode_enabled())  # type: ignore[method-assign]
    static.prepare(ops)
    assert static.prepared == set(shapes)
    assert modes == [True] * len(shapes)


def test_a_verify_width_is_captured_once_before_its_first_forward():
    """`ensure_captured` (called by the speculator before it times a verify forward): the shape the forward
    will run at, once, in inference mode, over padding arguments of that shape; nothing past the graphs'
    widest verify."""
    with torch.device("meta"):
        model = DecoderLM(SHAPE).to(torch.bfloat16)
    engine = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=256, device="meta"), [])
    static = StaticForward(engine.model, engine.slots, engine.config.max_verify_tokens, True, "matmul")
    seen = []

    def replay(shape, args):  # type: ignore[no-untyped-def]
        seen.append((shape, tuple(args[0].shape), torch.is_inference_mode_enabled()))
        static.graphs[shape] = object()  # type: ignore[assignment]

    static._replay = replay  # type: ignore[method-assign]
    assert static.ensure_captured(3, 5, 100) is True
    assert seen == [((4, 5, 128, None), (4, 5), True)]  # bucket 4, width 5, the span covering position 99
    assert static.ensure_captured(4, 5, 120) is False and len(seen) == 1  # the same shape: not again
    assert static.ensure_captured(3, static.max_width + 1, 100) is False  # too wide for the graphs
