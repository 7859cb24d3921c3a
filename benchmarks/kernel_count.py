"""Kernels per decode step as a GPU would launch them, counted at PyTorch's dispatcher without a GPU.

    python -m benchmarks.kernel_count [--device cuda|meta] [--batches 1,64,256] [--out FILE]
    python -m benchmarks.kernel_count --admissions [--device cuda|meta] [--out FILE]

A decode step of the engine is run with every tensor on a device that holds no data: `cuda` under
FakeTensorMode (needs a CUDA build of torch, which installs and runs on a machine without a GPU), or `meta`
(any build). A TorchDispatchMode sees each ATen op after autograd and composite decompositions, i.e. what
a device backend is asked to run; ops that only make views or allocate (view, permute, slice, expand,
empty, ...) launch nothing and are not counted; every other op counts as one kernel launch. The ops run
inside `StaticForward._forward` are what a CUDA graph captures (replayed as one graph launch): the decoder
layers' (counted per layer), the forward's shared ops (embedding, RoPE table, attention mask, final norm),
then the LM head and the sampler; the rest of the step (its upload and its read-back) runs outside.
Flex attention's compiled call is counted as FLEX_KERNELS (inductor's decoding kernel and its reduction).
SDPA's backend choice queries the device, so without a GPU it always answers math; a call that a GPU of
compute capability 8.0+ runs in its flash kernel (`flash_eligible`: fp16/bf16, no mask, no GQA, head
dimension <= 256) is counted as FLASH_KERNELS, with the flash kernel's output layout.

`--admissions` counts what admitting requests costs (issue 57): a step admitting 64 requests of 32 tokens
while nothing runs (a prefill of its own: ADMISSION_BUDGET), and 8 such requests riding in a decode step of
64 running rows (what they add to a plain eager decode step), each with its slot-parameter uploads, sampler
and read-back; then the riding step on the static path a GPU replays as one CUDA graph per shape
(engine/mixed.py, `admitting_graph_counts`): what runs inside the graph and what outside it (its upload,
the admitted slots' sampling parameters, its read-back), the latter held to ADMITTING_OUTSIDE_BUDGET.
A masked SDPA call that a GPU runs in its memory-efficient kernel (`efficient_eligible`: the packed
prompts' document-causal attention) counts as EFFICIENT_KERNELS.

On `meta` a composite op may decompose differently than on `cuda` (e.g. rms_norm, which has a fused CUDA
kernel), so the budgets are stated for `cuda`; tests/test_kernel_budget.py holds the meta counts, which CI
can make, as a guard: the count outside the graph to the budget, the per-layer count to its value when the
sampler moved into the graph. The engine's tokens are read back as zeros (there is no data):
the step's host logic is the real one. Prints a table and writes the counts per op.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.gpu import SMOLLM2_SHAPE
from reference_trainer.engine import engine as engine_module
from reference_trainer.engine import kv_cache, transfers
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.sequence import Request
from reference_trainer.model import flex
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM

# Ops that only describe memory (views, metadata, allocation without a fill): no kernel.
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::permute",
    "aten::transpose", "aten::t", "aten::expand", "aten::expand_as", "aten::slice", "aten::select",
    "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::alias", "aten::detach", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::chunk", "aten::narrow", "aten::lift_fresh", "aten::view_as", "aten::unflatten",
    "aten::flatten", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::is_same_size",
    "aten::_nested_tensor_from_mask_left_aligned", "aten::resize_", "aten::set_", "aten::is_pinned",
    "aten::_has_compatible_shallow_copy_type", "aten::record_stream", "aten::_to_copy_meta",
}  # fmt: skip
FLEX_KERNELS = 2  # a compiled flex-decoding call: the attention kernel and its split reduction
FLASH_KERNELS = 1  # SDPA's flash forward (flash_eligible): one kernel
EFFICIENT_KERNELS = 1  # SDPA's memory-efficient forward with a mask (efficient_eligible): one kernel
# The budget (issue 49): kernels per decoder layer inside the graph, and outside it per step.
LAYER_BUDGET, OUTSIDE_BUDGET = 16, 10
ADMITTING_OUTSIDE_BUDGET = 40  # kernels outside the graph of a step admitting 8 x 32 into 64 running rows
ADMISSION_BUDGET = 560  # kernels of one admission of 64 x 32 tokens on SmolLM2's shape, all of it (issue 57)


SECTIONS = ("layers", "shared", "head", "outside")  # in the graph: decoder layers, shared ops, head; outside


class KernelCounter(TorchDispatchMode):
    """Counts the ops that launch a kernel, apart for inside and outside the captured forward."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend  # dispatch key whose kernels count as one launch: "CUDA" (or "CPU" for meta)
        self.inside = False
        self.head = False  # inside: in the LM head and the sampler after it
        self.in_layer = False  # inside: in a decoder layer (the rest of the forward is shared by the layers)
        self.counting = False  # set around the counted step (flex's stand-in counts only then)
        self.ops: dict[str, Counter[str]] = {k: Counter() for k in SECTIONS}

    def section(self) -> str:
        if not self.inside:
            return "outside"
        return "head" if self.head else "layers" if self.in_layer else "shared"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func._schema.name
        if name == "aten::scaled_dot_product_attention" and flash_eligible(*args, **kwargs):
            self.ops[self.section()]["scaled_dot_product_flash_attention (fused)"] += FLASH_KERNELS
            return flash_output(args[0])
        if name == "aten::scaled_dot_product_attention" and efficient_eligible(*args, **kwargs):
            self.ops[self.section()]["scaled_dot_product_efficient_attention (fused)"] += EFFICIENT_KERNELS
            return torch.empty_like(args[0])
        # A composite op (linear, matmul, rms_norm, ...) that has no kernel of the backend's own is what it
        # decomposes into: run its C++ composite with this mode active, so that its leaves are counted.
        if (
            name.startswith("aten::")
            and not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), self.backend)
            and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        ):
            with self:
                return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        if name not in NO_KERNEL and not name.startswith("prim::"):
            self.ops[self.section()][name] += 1
        return func(*args, **kwargs)


def flash_eligible(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> bool:
    """Whether a CUDA GPU of compute capability 8.0 or newer runs this SDPA call in its flash kernel:
    fp16/bf16, no attention mask (is_causal is fine), no GQA, the same head count in q, k and v, a head
    dimension up to 256 and a multiple of 8 (torch's sdp_utils checks). Without a GPU, SDPA's backend
    choice always answers math (it queries the device), so the counter decides by these rules instead."""
    dim = q.shape[-1]
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and attn_mask is None
        and not enable_gqa
        and dropout_p == 0.0
        and q.shape[1] == k.shape[1] == v.shape[1]
        and dim <= 256
        and dim % 8 == 0
    )


def efficient_eligible(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *a: Any,
    **kw: Any,
) -> bool:
    """Whether a CUDA GPU runs this masked SDPA call in its memory-efficient kernel (which takes an
    arbitrary mask, unlike flash): fp16/bf16, a mask, no dropout, no GQA, the same head count in q, k and
    v, a head dimension up to 256 and a multiple of 8. The admitting step's packed prompts
    (attention.PackedBatch) attend this way."""
    dim = q.shape[-1]
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and attn_mask is not None
        and not kw.get("enable_gqa", False)
        and kw.get("dropout_p", 0.0) == 0.0
        and q.shape[1] == k.shape[1] == v.shape[1]
        and dim <= 256
        and dim % 8 == 0
    )


def flash_output(q: torch.Tensor) -> torch.Tensor:
    """The flash kernel's output: q's shape [B, H, Q, D], laid out [B, Q, H, D] as torch's flash attention
    allocates it, so the caller's transpose back is a view."""
    b, h, n, d = q.shape
    return torch.empty((b, n, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)


@contextlib.contextmanager
def no_data(device: str) -> Iterator[None]:
    """Tensors without data on `device`: FakeTensorMode for cuda, the meta device's own tensors for meta."""
    if device == "cuda":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            yield
    else:
        yield


def fake_host_longs(values: Iterable[int]) -> torch.Tensor:
    """transfers.host_longs through torch.tensor, which FakeTensorMode sees."""
    return torch.tensor(list(values), dtype=torch.long)


@contextlib.contextmanager
def counted_engine(
    capacity: int, shape: ModelConfig, device: str, layout: str, max_model_len: int = 128
) -> Iterator[tuple[Engine, KernelCounter]]:
    """An engine of `capacity` slots over a data-less model of `shape` on `device` (eager: no graphs), with a
    KernelCounter that counts while `counter.counting` is set and the counter is entered."""
    counter = KernelCounter("CUDA" if device == "cuda" else "CPU")
    contiguous_bytes = 2**62 if layout == "contiguous" else 0
    real_randint = torch.randint
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(kv_cache, "CONTIGUOUS_KV_BYTES", contiguous_bytes))
        # No data to read back: the sampled tokens come back as zeros; the host logic around them is real.
        stack.enter_context(mock.patch.object(engine_module, "read_back", counted_read_back(counter)))
        stack.enter_context(mock.patch.object(flex, "attend", counted_flex(counter)))
        # no random init: a CPU build of torch has no CUDA generator, and the weights' values never matter
        for init in ("uniform_", "normal_"):
            stack.enter_context(mock.patch.object(torch.Tensor, init, lambda self, *a, **k: self))
        # pinned host memory needs a driver; the upload's one host-to-device copy is counted all the same
        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self))
        # a tensor made from a buffer would stay real under FakeTensorMode (and its copy run on a real GPU)
        stack.enter_context(mock.patch.object(transfers, "host_longs", fake_host_longs))
        stack.enter_context(no_data(device))
        torch.manual_seed(0)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the device: fake tensors cannot move
        try:
            with torch.device(device):
                model = DecoderLM(shape)
        finally:
            torch.set_default_dtype(default_dtype)
        config = EngineConfig(
            max_num_seqs=capacity, max_model_len=max_model_len, device=device, cuda_graphs=False
        )
        # the engine seeds its unseeded-request stream from torch (a real number, not a fake one)
        with mock.patch.object(torch, "randint", lambda *a, **k: real_number(real_randint, *a, **k)):
            engine = Engine(model, config, eos_token_ids=[])
        yield engine, counter


PARAMS = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=64, ignore_eos=True, seed=0)


def _count_admitting_step(engine: Any, counter: Any, running: int, rows: int, tokens: int) -> None:
    """Count the kernels of the step that admits `rows` requests of `tokens` tokens into `running` decoding
    rows (their prefill first, not counted)."""
    for i in range(running):
        engine.add_request(Request([1, *range(3, 34)], PARAMS, seq_id=f"r{i}"))
    if running:
        engine.step()  # their prefill, not counted
    for i in range(rows):
        engine.add_request(Request([1, *range(3, 2 + tokens)], PARAMS, seq_id=f"a{i}"))
    counter.counting = True
    with counter:
        engine.step()
    counter.counting = False


def decode_step_counts(
    batch: int, shape: ModelConfig, device: str, attention: str, layout: str
) -> dict[str, Any]:
    """Kernels of one decode step at `batch` rows, each row 32 tokens into its sequence."""
    with counted_engine(batch, shape, device, layout) as (engine, counter):
        static = StaticForward.eager(engine, attention)
        engine.runner.static = static
        forward = static._forward

        def captured(*args: Any) -> None:  # what a CUDA graph would hold
            counter.inside = True
            try:
                forward(*args)
            finally:
                counter.inside = counter.head = False

        logits = engine.model.logits

        def head(*args: Any, **kwargs: Any) -> torch.Tensor:  # the LM head, then the sampler, to the end
            counter.head = counter.inside
            return logits(*args, **kwargs)

        static._forward = captured  # type: ignore[method-assign]
        engine.model.logits = head  # type: ignore[method-assign]
        for layer in engine.model.model.layers:
            layer.register_forward_pre_hook(lambda *_: setattr(counter, "in_layer", True))
            layer.register_forward_hook(lambda *_: setattr(counter, "in_layer", False))
        for i in range(batch):
            engine.add_request(Request([1, *range(3, 34)], PARAMS, seq_id=str(i)))
        engine.step()  # the prefill, not counted
        counter.counting = True
        with counter:
            engine.step()
        counter.counting = False
    layers = shape.num_hidden_layers
    in_layers, shared, head, outside = (sum(counter.ops[k].values()) for k in SECTIONS)
    return {
        "batch": batch, "device": device, "attention": attention, "layout": layout,
        "per_layer": in_layers / layers, "shared": shared, "head_and_sampler": head,
        "graph": in_layers + shared + head, "outside": outside,
        "within_budget": in_layers / layers <= LAYER_BUDGET and outside <= OUTSIDE_BUDGET,
        **{f"ops_{k}": dict(counter.ops[k].most_common()) for k in SECTIONS},
    }  # fmt: skip


def admission_counts(
    rows: int, tokens: int, shape: ModelConfig, device: str, layout: str, running: int = 0
) -> dict[str, Any]:
    """Kernels of the engine step that admits `rows` requests of `tokens` prompt tokens: everything the step
    launches, its slot-parameter uploads, sampler and read-back included. With `running` sequences already
    decoding, the admissions ride in their decode step: the count is then that step's, and
    `ride_extra` what the admissions add to a plain (eager) decode step of the same rows."""
    plain = None
    if running:
        with counted_engine(running, shape, device, layout) as (engine, counter):
            for i in range(running):
                engine.add_request(Request([1, *range(3, 34)], PARAMS, seq_id=f"r{i}"))
            engine.step()  # their prefill, not counted
            counter.counting = True
            with counter:
                engine.step()  # a plain eager decode step of the running rows
            plain = sum(sum(c.values()) for c in counter.ops.values())
    with counted_engine(running + rows, shape, device, layout) as (engine, counter):
        _count_admitting_step(engine, counter, running, rows, tokens)
    ops: Counter[str] = Counter()
    for section in counter.ops.values():
        ops.update(section)
    total = sum(ops.values())
    return {
        "rows": rows, "tokens": tokens, "running": running, "device": device, "layout": layout,
        "kernels": total, "ride_extra": None if plain is None else total - plain,
        "within_budget": total <= ADMISSION_BUDGET if not running else None,
        "ops": dict(ops.most_common()),
    }  # fmt: skip


def admitting_graph_counts(
    rows: int,
    tokens: int,
    running: int,
    shape: ModelConfig,
    device: str,
    layout: str,
    attention: str = "flex",
) -> dict[str, Any]:
    """Kernels of the engine step that admits `rows` requests of `tokens` tokens into `running` decoding
    rows on the static path a GPU replays as one CUDA graph (engine/mixed.py): inside the graph (what
    `MixedForward._forward` runs) and outside it (the upload, the admitted slots' sampling parameters, the
    read-back). `outside` is what launches one by one: ADMITTING_OUTSIDE_BUDGET."""
    with counted_engine(running + rows, shape, device, layout) as (engine, counter):
        engine.runner.static = StaticForward.eager(engine, attention)  # no graph to launch without a GPU
        admitting = engine.runner.admitting
        assert admitting is not None
        forward = admitting._forward

        def captured(*args: Any) -> None:
            counter.inside = True
            try:
                forward(*args)
            finally:
                counter.inside = False

        admitting._forward = captured  # type: ignore[method-assign]
        _count_admitting_step(engine, counter, running, rows, tokens)
    assert admitting.ran, "the step did not take the static admitting path"
    inside = sum(sum(counter.ops[k].values()) for k in ("layers", "shared", "head"))
    outside = sum(counter.ops["outside"].values())
    return {
        "rows": rows, "tokens": tokens, "running": running, "device": device, "layout": layout,
        "attention": attention, "graph": inside, "outside": outside,
        "within_budget": outside <= ADMITTING_OUTSIDE_BUDGET, "shape": str(sorted(admitting.ran)[0][:4]),
        "ops_outside": dict(counter.ops["outside"].most_common()),
    }  # fmt: skip


def real_number(fn: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """fn's result as a real CPU tensor even under FakeTensorMode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return fn(*args, **kwargs, device="cpu")


def counted_read_back(counter: KernelCounter):  # type: ignore[no-untyped-def]
    """transfers.read_back as the GPU runs it (its kernels and its one device-to-host copy, counted), with
    zeros for the values, which a device without data does not have."""

    def read_back(*rows: torch.Tensor) -> list[list[float]]:
        torch.stack([r.double() for r in rows])
        if counter.counting:
            counter.ops["outside"]["copy (device to host)"] += 1
        return [[0.0] * rows[0].shape[0] for _ in rows]

    return read_back


def counted_flex(counter: KernelCounter):  # type: ignore[no-untyped-def]
    """flex.attend as a GPU runs it compiled: FLEX_KERNELS launches, an output of the query's shape."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
        if counter.counting:
            counter.ops[counter.section()]["flex_attention (compiled)"] += FLEX_KERNELS
        return torch.empty_like(q)

    return attend


def print_table(rows: list[dict[str, Any]]) -> None:
    head = "| attention | layout | batch | graph | per layer | shared | head + sampler | outside | budget |"
    print(head + "\n|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        cells = [r["attention"], r["layout"], r["batch"], r["graph"], f"{r['per_layer']:.1f}", r["shared"],
                 r["head_and_sampler"], r["outside"], "within" if r["within_budget"] else "over"]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "meta"])
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--attention", default="flex,matmul")
    parser.add_argument("--layouts", default="paged,contiguous")
    parser.add_argument(
        "--admissions", action="store_true", help="count admissions instead: 64 x 32 alone, 8 x 32 riding"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.backends.cuda.is_built():
        sys.exit(
            "error: --device cuda needs a CUDA build of torch (no GPU needed); --device meta runs on any"
        )
    if args.admissions:
        rows = [
            admission_counts(r, 32, SMOLLM2_SHAPE, args.device, layout, running)
            for layout in args.layouts.split(",")
            for r, running in ((64, 0), (8, 64))
        ]
        print("| layout | admitted | running | kernels | added to the decode step | budget |")
        print("|---|---:|---:|---:|---:|---|")
        for r in rows:
            budget = {True: "within", False: "over", None: "-"}[r["within_budget"]]
            print(f"| {r['layout']} | {r['rows']} x {r['tokens']} | {r['running']} | {r['kernels']} | "
                  f"{r['ride_extra'] if r['ride_extra'] is not None else '-'} | {budget} |")  # fmt: skip
        graph = [
            admitting_graph_counts(8, 32, 64, SMOLLM2_SHAPE, args.device, layout)
            for layout in args.layouts.split(",")
        ]
        print("\nOn the static path (engine/mixed.py), replayed as one CUDA graph per shape:\n")
        print("| layout | admitted | running | shape | in the graph | outside | budget (outside) |")
        print("|---|---:|---:|---|---:|---:|---|")
        for r in graph:
            budget = "within" if r["within_budget"] else "over"
            print(f"| {r['layout']} | {r['rows']} x {r['tokens']} | {r['running']} | {r['shape']} | "
                  f"{r['graph']} | {r['outside']} | {budget} |")  # fmt: skip
        _write(
            args, rows + graph, {"admission": ADMISSION_BUDGET, "admitting_outside": ADMITTING_OUTSIDE_BUDGET}
        )
        return
    rows = [
        decode_step_counts(int(b), SMOLLM2_SHAPE, args.device, attention, layout)
        for attention in args.attention.split(",")
        for layout in args.layouts.split(",")
        for b in args.batches.split(",")
    ]
    print_table(rows)
    _write(args, rows, {"per_layer": LAYER_BUDGET, "outside": OUTSIDE_BUDGET})


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], budget: dict[str, int]) -> None:
    if args.out:
        from reference_trainer.trace.records import write_json
        from rlbench.reproduce.runner import source_commit

        write_json(args.out, {"command": " ".join(["python -m benchmarks.kernel_count", *sys.argv[1:]]),
                              "torch": torch.__version__, "commit": source_commit(), "shape": "smollm2-135m",
                              "budget": budget, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
