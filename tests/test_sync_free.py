"""A decode step and a verify step move data between host and device exactly twice: one upload of the
step's inputs, one read-back of what was sampled. Nothing else reads a device value on the host or runs an
op that makes the host wait on a GPU (boolean masks, `.item()`, data-dependent output shapes).

On CPU there is no device to wait for, so the test counts what would synchronise on CUDA: Python-level
reads of tensor values (patched methods) and the ATen ops that synchronise on CUDA (a dispatch mode that
sees every op). The GPU test checks the same with CUDA's own sync debug mode."""

from __future__ import annotations

import array
import copy
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from conftest import tiny_config
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.gpu_checks import syncs_during
from reference_trainer.engine import kv_cache
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.sequence import Request
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.speculation.cost import ForwardCosts
from reference_trainer.speculation.drafters import attach

EOS = 2
FREE_VERIFY = ForwardCosts({(1, 1): 1.0, (64, 1): 1.0, (1, 16): 1.0, (64, 16): 1.0})
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
SYNCING_OPS = {
    "aten._local_scalar_dense.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.is_nonzero.default",
    "aten.equal.default",
    "aten._unique2.default",
    "aten.unique_consecutive.default",
}


class _SyncingOps(TorchDispatchMode):
    """Records the ops that synchronise on CUDA: the ones above, boolean-mask indexing (it needs the mask's
    count) and repeat_interleave without an output size."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = str(func)
        indices = args[1] if name.startswith(("aten.index.", "aten.index_put", "aten._index_put")) else ()
        if name in SYNCING_OPS or any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()
        ):
            self.seen[name] += 1
        if name.startswith("aten.repeat_interleave") and kwargs.get("output_size") is None:
            self.seen[name] += 1
        return func(*args, **kwargs)


@contextmanager
def counting():
    """Counts host reads of tensor values, uploads built from Python lists, and syncing ops."""
    reads: Counter[str] = Counter()
    uploads = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name):  # type: ignore[no-untyped-def]
        def method(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            reads[name] += 1
            return originals[name](self, *args, **kwargs)

        return method

    # A host tensor is built from Python values with torch.tensor or, through a C array, torch.frombuffer
    # (transfers.upload): both count as one upload's making.
    constructors = {name: getattr(torch, name) for name in ("tensor", "frombuffer")}

    def counted(name):  # type: ignore[no-untyped-def]
        def construct(*args, **kwargs):  # type: ignore[no-untyped-def]
            uploads["host tensor"] += 1
            return constructors[name](*args, **kwargs)

        return construct

    for name in READS:
        setattr(torch.Tensor, name, wrap(name))
    for name in constructors:
        setattr(torch, name, counted(name))
    mode = _SyncingOps()
    try:
        with mode:
            yield reads, uploads, mode.seen
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
        for name, construct in constructors.items():
            setattr(torch, name, construct)


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)
    cfg = tiny_config(48, 256)
    m = DecoderLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(4.0)  # peaked: drafts from earlier samples get accepted
    return m.eval()


LAYOUTS = ["contiguous", "contiguous-gather", "paged", "static-contiguous", "static-paged"]


def make_engine(model: DecoderLM, layout: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0 if "paged" in layout else 2**40)
    engine = Engine(model, EngineConfig(max_num_seqs=16, max_model_len=128), eos_token_ids=[EOS])
    if layout.startswith("static"):  # the graph path's static shapes, run eagerly (no CUDA here)
        engine.runner.static = StaticForward(model, engine.slots, engine.config.max_verify_tokens, False)
    return engine


def params(n: int, first_seed: int = 0) -> list[SamplingParams]:
    # Mixed rows: top-k, top-p and greedy requests in one batch.
    return [
        SamplingParams(
            temperature=0.0 if i % 4 == 3 else 1.0,
            top_k=8 if i % 4 == 1 else 0,
            top_p=0.9 if i % 4 == 2 else 1.0,
            max_tokens=24,
            seed=first_seed + i,
            ignore_eos=True,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_decode_step_uploads_once_and_reads_back_once(model, layout, monkeypatch):
    engine = make_engine(model, layout, monkeypatch)
    # Slots 0..11 with one idle slot inside the range: the contiguous layout reads a packed range, or
    # gathers when fewer than half its slots run ("contiguous-gather").
    count = 3 if layout == "contiguous-gather" else 12
    seqs = [engine.add_request(Request([5, 6, 7 + i], p)) for i, p in enumerate(params(12))]
    engine.step()  # prefill
    for seq in seqs[count:]:
        engine.abort(seq)
    if layout == "contiguous-gather":
        engine.abort(seqs[1])  # slots 0 and 2 of the range 0..2 run: decode gathers
    engine.step()
    with counting() as (reads, uploads, syncing):
        engine.step()
    assert engine.trace.events[-1]["kind"] == "decode"
    assert dict(reads) == {"tolist": 1} and dict(uploads) == {"host tensor": 1} and not syncing


@pytest.mark.parametrize("layout", ["contiguous", "paged", "static-paged"])
def test_a_verify_step_uploads_once_and_reads_back_once(model, layout, monkeypatch):
    history = make_engine(model, layout, monkeypatch).generate([[5, 6, 7]] * 4, params(4, first_seed=50))
    engine = make_engine(model, layout, monkeypatch)
    spec = attach(engine, {}, cost_model=FREE_VERIFY)
    for seq in history:
        spec.drafter.add_response([5, 6, 7], seq.response_ids)
    for p in params(6):
        engine.add_request(Request([5, 6, 7], p))
    engine.step()  # prefill
    with counting() as (reads, uploads, syncing):
        engine.step()
    event = engine.trace.events[-1]
    assert event["kind"] == "verify" and event["drafted"] > 0
    assert dict(reads) == {"tolist": 1} and dict(uploads) == {"host tensor": 1} and not syncing


def test_the_counters_see_what_they_count(model, monkeypatch):
    """The instruments work: a boolean mask, an .item() and lists built into tensors are all seen."""
    x = torch.arange(6)
    with counting() as (reads, uploads, syncing):
        x[x > 2].sum().item()
        torch.tensor([1, 2])
        torch.frombuffer(array.array("q", [1, 2]), dtype=torch.long)
        bool(x[0])
    assert reads["item"] == 1 and reads["__bool__"] == 1 and uploads["host tensor"] == 2
    assert syncing["aten.index.Tensor"] == 1 and syncing["aten._local_scalar_dense.default"] == 2


@pytest.mark.gpu
def test_on_cuda_a_decode_and_a_verify_step_synchronise_once(model):
    """CUDA's sync debug mode warns at every synchronising call: a decode or verify step whose shape was
    captured before (capturing synchronises) makes one, the read-back."""
    cuda = copy.deepcopy(model).to("cuda")
    engine = Engine(cuda, EngineConfig(max_num_seqs=16, max_model_len=128), eos_token_ids=[EOS])
    assert engine.runner.static is not None and engine.runner.static.capture
    spec = attach(engine, {}, cost_model=FREE_VERIFY)
    for seq in Engine(cuda, EngineConfig(max_num_seqs=4, max_model_len=128)).generate(
        [[5, 6, 7]] * 4, params(4, first_seed=50)
    ):
        spec.drafter.add_response([5, 6, 7], seq.response_ids)
    for p in params(6):
        engine.add_request(Request([5, 6, 7], p))
    checked: Counter[str] = Counter()
    while engine.has_unfinished():
        captured = len(engine.runner.static.graphs)
        syncs = syncs_during(engine.step)
        kind = engine.trace.events[-1]["kind"]
        if kind in ("decode", "verify") and len(engine.runner.static.graphs) == captured:
            assert syncs == 1, kind
            checked[kind] += 1
    assert checked["verify"] >= 1 and checked["decode"] + checked["verify"] >= 5
