"""The few-query attention's implementations (model/attention.py, model/flex.py) agree with the matmul path:
per forward over paged and slot caches (GQA, decode and verify widths, rows of different lengths, padding
rows and padded rows), in the flex block mask's sparsity (what a compiled kernel reads), and in the tokens
an engine generates. Flex runs eagerly here (PyTorch's reference implementation); compiled, on CUDA only
(or on CPU with RLBENCH_COMPILE_TESTS=1)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from reference_trainer.engine import kv_cache
from reference_trainer.engine.config import ATTENTION, EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.errors import UserError
from reference_trainer.model import flex
from reference_trainer.model.attention import (
    IMPLEMENTATIONS,
    CachedBatch,
    PagedKVCache,
    SlotKVCache,
    resolve_attention,
    write_and_attend,
)
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM

# Eager flex warns once that it is unfused: that is what these tests mean to run.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

CONFIG = ModelConfig(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,  # 2 query heads per KV head
    num_key_value_heads=2,
    max_position_embeddings=4096,
    eos_token_id=2,
)
HEADS, KV_HEADS, DIM = 4, 2, 8
BLOCK = 4  # positions per block: a row spans several
STARTS = [13, 2, 0, 7, 17]  # row 2 pads the batch: start 0, scratch blocks only (as graphs.py pads)
PAD_ROW = 2


def paged_tables(num_q: int, gen: torch.Generator, num_new: list[int] | None = None) -> torch.Tensor:
    """Each row's own blocks (distinct, never the scratch block 0) for its positions, in scattered order,
    padded with block 0 to the widest; the padding row gets only block 0."""
    real = num_new or [num_q] * len(STARTS)
    need = [(s + n - 1) // BLOCK + 1 for s, n in zip(STARTS, real, strict=True)]
    free = (torch.randperm(40, generator=gen) + 1).tolist()
    rows = [[] if i == PAD_ROW else [free.pop() for _ in range(n)] for i, n in enumerate(need)]
    width = max(need)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def random_cache(layout: str, gen: torch.Generator) -> PagedKVCache | SlotKVCache:
    """A cache whose every position (scratch included) holds random K/V, as left by earlier sequences."""
    cpu = torch.device("cpu")
    cache: PagedKVCache | SlotKVCache
    if layout == "paged":
        cache = PagedKVCache(CONFIG, 41, BLOCK, cpu, torch.float32)
    else:
        cache = SlotKVCache(CONFIG, capacity=6, max_len=32, device=cpu, dtype=torch.float32)
    for pool in (*cache.k, *cache.v):
        pool.copy_(torch.randn(pool.shape, generator=gen))
    return cache


def attend_all(layout: str, num_q: int, ragged: bool) -> dict[str, tuple[torch.Tensor, object]]:
    """Each implementation's output of one layer's write-and-attend over the same cache and inputs, and
    the cache it leaves."""
    gen = torch.Generator().manual_seed(num_q * 10 + ragged)
    cache = random_cache(layout, gen)
    bsz = len(STARTS)
    num_new = [num_q, max(1, num_q - 2), num_q, 1, num_q - 1 or 1] if ragged else None
    start = torch.tensor(STARTS)
    kwargs: dict = {"num_new": None if num_new is None else torch.tensor(num_new)}
    if layout == "paged":
        rows = paged_tables(num_q, gen, num_new)
    elif layout == "slot view":  # slots 1..5 as one view of the cache
        rows = torch.arange(1, 1 + bsz)
        kwargs |= {"contiguous": True, "slot_range": (1, 1 + bsz), "key_len": max(STARTS) + num_q}
    else:  # gathered slots, in scattered order
        rows = torch.tensor([4, 1, 5, 0, 2])
        kwargs |= {"key_len": max(STARTS) + num_q}
    q = torch.randn(bsz, num_q, HEADS, DIM, generator=gen)
    k, v = (torch.randn(bsz, num_q, KV_HEADS, DIM, generator=gen) for _ in range(2))
    out = {}
    for impl in IMPLEMENTATIONS:
        mine = copy.deepcopy(cache)
        batch = CachedBatch(start, num_q, mine, rows, attention=impl, **kwargs)
        out[impl] = (write_and_attend(q, k, v, mine.k[0], mine.v[0], batch), mine)
    return out


@pytest.mark.parametrize(
    ("num_q", "ragged"), [(1, False), (4, False), (4, True)], ids=["decode", "verify", "short prefill"]
)
@pytest.mark.parametrize("layout", ["paged", "slot view", "slot gather"])
def test_implementations_match_the_matmul_path(layout, num_q, ragged):
    """sdpa and flex give the matmul path's output (fp32) for every real query, and leave the same cache.
    Ragged: rows with fewer real tokens than Q (a short batched prefill); their padding is not compared."""
    out = attend_all(layout, num_q, ragged)
    reference, reference_cache = out["matmul"]
    assert torch.isfinite(reference).all()
    num_new = [num_q, max(1, num_q - 2), num_q, 1, num_q - 1 or 1] if ragged else [num_q] * len(STARTS)
    for impl in ("sdpa", "flex"):
        got, cache = out[impl]
        assert got.shape == reference.shape == (len(STARTS), num_q, HEADS * DIM)
        for row, n in enumerate(num_new):
            torch.testing.assert_close(got[row, :n], reference[row, :n], atol=1e-5, rtol=1e-5)
        for ours, theirs in zip((*cache.k, *cache.v), (*reference_cache.k, *reference_cache.v), strict=True):
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize("num_q", [1, 4])
def test_flex_block_mask_lists_exactly_the_blocks_a_row_sees(num_q):
    """What a compiled flex kernel relies on (the eager reference ignores the sparsity): the listed blocks
    of a row are its own blocks up to its last position, in table order, and every key the mask_mod lets
    a query see lies in them, at that row's logical position <= the query's."""
    gen = torch.Generator().manual_seed(7)
    tables = paged_tables(num_q, gen)
    num_blocks, group = 41, HEADS // KV_HEADS
    start = torch.tensor(STARTS)
    mask = flex.paged_block_mask(tables, start, start + num_q - 1, num_blocks, BLOCK, num_q, group)
    dense = create_mask(mask.mask_mod, len(STARTS), 1, group * num_q, num_blocks * BLOCK, device="cpu")
    for row, first in enumerate(STARTS):
        listed = mask.kv_indices[row, 0, 0, : mask.kv_num_blocks[row, 0, 0]].tolist()
        own = tables[row, : (first + num_q - 1) // BLOCK + 1].tolist()
        assert listed == own
        expected = torch.zeros(group * num_q, num_blocks * BLOCK, dtype=torch.bool)
        for query in range(group * num_q):
            for pos in range(first + query % num_q + 1):  # causal, in the row's logical positions
                expected[query, own[pos // BLOCK] * BLOCK + pos % BLOCK] = True
        assert torch.equal(dense[row, 0], expected)


@pytest.mark.skipif(
    not os.environ.get("RLBENCH_COMPILE_TESTS"),
    reason="compiles FlexAttention with inductor's C++ backend (about 20 s cold on 2 cores; the engine "
    "compiles flex on CUDA only): set RLBENCH_COMPILE_TESTS=1 to run",
)
def test_compiled_flex_reads_the_listed_blocks_on_cpu(monkeypatch):
    """The compiled kernel visits only the block mask's listed blocks: same output as the matmul path."""
    monkeypatch.setattr(flex, "COMPILED_ON", ("cpu",))
    out = attend_all("paged", 4, ragged=False)
    torch.testing.assert_close(out["flex"][0], out["matmul"][0], atol=1e-5, rtol=1e-5)


def generate(model, layout, attention, static, monkeypatch):  # type: ignore[no-untyped-def]
    """Greedy responses of an engine with 3 slots (requests queue and refill them), eager or through the
    static-shape forward that CUDA graphs replay (run eagerly: padding rows and power-of-two key spans)."""
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0 if layout == "paged" else 2**40)
    monkeypatch.setattr(kv_cache, "INITIAL_BLOCKS_PER_SLOT", 1)  # the pool grows mid-run
    config = EngineConfig(max_num_seqs=3, max_model_len=160, attention=attention)
    engine = Engine(model, config, eos_token_ids=[2])
    assert engine.runner.attention == attention
    if static:
        engine.runner.static = StaticForward(model, engine.slots, config.max_verify_tokens, False, attention)
    prompts = [[1, *range(5, 5 + n)] for n in (3, 40, 12, 25, 7)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    return [s.response_ids for s in engine.generate(prompts, params)]


@pytest.mark.parametrize("static", [False, True], ids=["own shape", "static shape"])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_engine_tokens_do_not_depend_on_the_implementation(layout, static, monkeypatch):
    torch.manual_seed(0)
    model = DecoderLM(CONFIG)
    runs = {impl: generate(model, layout, impl, static, monkeypatch) for impl in IMPLEMENTATIONS}
    assert runs["sdpa"] == runs["matmul"] and runs["flex"] == runs["matmul"]
    assert len({tuple(r) for r in runs["matmul"]}) > 1  # distinct responses: not a degenerate model


def test_the_choice_is_checked_and_auto_is_matmul_on_cpu_and_flex_on_cuda():
    assert ("auto", *IMPLEMENTATIONS) == ATTENTION
    with pytest.raises(
        UserError, match=r"^EngineConfig.attention must be one of auto, matmul, sdpa, flex, got 'fast'$"
    ):
        EngineConfig(attention="fast").check()
    with pytest.raises(UserError, match="attention"):
        Engine(DecoderLM(CONFIG), EngineConfig(max_num_seqs=1, max_model_len=16, attention="Flex"))
    # each device's fastest as measured: matmul on the CPU, flex on an H200 (benchmarks/results/gpu/)
    assert resolve_attention("auto", torch.device("cpu")) == "matmul"
    assert resolve_attention("auto", torch.device("cuda")) == "flex"
    assert resolve_attention("flex", torch.device("cpu")) == "flex"
    with pytest.raises(ValueError, match="attention"):
        CachedBatch(torch.tensor([0]), 1, PagedKVCache(CONFIG, 2, 4, torch.device("cpu"), torch.float32),
                    torch.tensor([[1]]), attention="auto")  # fmt: skip


def test_gpu_benchmark_times_every_implementation_on_cpu(monkeypatch):
    """benchmarks/gpu.py's attention table at toy sizes, eagerly, over a paged cache (as the SmolLM2 shape
    at 256 slots gets): a row of timings per implementation."""
    from benchmarks.gpu import attention_table  # the repository root is on sys.path under `python -m pytest`

    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0)
    torch.manual_seed(0)
    rows = attention_table(DecoderLM(CONFIG), [1, 2], context=8, qs=(1, 2), repeats=1, max_model_len=32)
    assert [row["attention"] for row in rows] == list(IMPLEMENTATIONS)
    for row in rows:
        assert "error" not in row, row
        assert set(row["ms"]) == {"1x1", "1x2", "2x1", "2x2"} and min(row["ms"].values()) > 0
        assert row["layout"] == "paged" and row["cuda_graphs"] is False


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_cuda_graphs_emit_the_same_tokens_with_every_implementation(layout, monkeypatch):
    """On CUDA (fp32, graphs captured, flex compiled): the same greedy tokens whatever the implementation."""
    torch.manual_seed(0)
    # head_dim 16: the smallest that inductor's flex kernels are sure to take (CONFIG's is 8)
    model = DecoderLM(ModelConfig(**{**vars(CONFIG), "hidden_size": 64, "head_dim": 16})).to("cuda")
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0 if layout == "paged" else 2**40)
    prompts = [[1, *range(5, 5 + n)] for n in (3, 40, 12, 25, 7)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    runs = {}
    for impl in IMPLEMENTATIONS:
        engine = Engine(model, EngineConfig(max_num_seqs=3, max_model_len=160, attention=impl), [2])
        runs[impl] = [s.response_ids for s in engine.generate(prompts, params)]
        assert engine.runner.static is not None and engine.runner.static.graphs
    assert runs["sdpa"] == runs["matmul"] and runs["flex"] == runs["matmul"]
