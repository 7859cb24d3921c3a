"""KV memory: in the paged layout blocks follow the tokens in flight, are reused after a sequence ends, and
the pool grows on demand; neither that nor the choice of layout changes what the engine generates."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from reference_trainer.engine import kv_cache
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.model.decoder import DecoderLM

CONFIG = tiny_config(99, 4096, eos_token_id=2)
CPU = torch.device("cpu")


def test_blocks_follow_tokens_and_are_reused():
    slots = SlotManager(CONFIG, capacity=4, max_len=4096, device=CPU, dtype=torch.float32, contiguous=False)
    # not 4 x 4096 positions; + the scratch block that padding rows write to, which no sequence gets
    assert slots.cache.num_blocks == 4 * kv_cache.INITIAL_BLOCKS_PER_SLOT + 1 and slots.scratch == 0
    a, b = slots.allocate(), slots.allocate()
    slots.reserve(a, 1)
    slots.reserve(a, 16)
    assert len(slots.tables[a]) == 1
    slots.reserve(a, 17)
    slots.reserve(b, 40)
    assert len(slots.tables[a]) == 2 and len(slots.tables[b]) == 3 and slots.blocks_in_use == 5
    assert not set(slots.tables[a]) & set(slots.tables[b]) and 0 not in slots.tables[a] + slots.tables[b]
    freed = set(slots.tables[a])
    slots.release(a)
    c = slots.allocate()
    slots.reserve(c, 32)
    assert set(slots.tables[c]) == freed  # a finished sequence's blocks serve the next one
    with pytest.raises(ValueError, match="exceed"):
        slots.reserve(c, 4097)


def test_pool_grows_keeping_its_blocks():
    slots = SlotManager(CONFIG, capacity=2, max_len=256, device=CPU, dtype=torch.float32, contiguous=False)
    start = slots.cache.num_blocks
    a = slots.allocate()
    slots.reserve(a, 16 * start)
    block = slots.tables[a][0]
    slots.cache.k[1][:, block] = 7.0
    b = slots.allocate()
    slots.reserve(b, 256)  # more than is free: the pool grows, capped at 2 x 256 positions
    assert start < slots.cache.num_blocks <= slots.max_blocks + 1 and slots.max_blocks == 2 * 256 // 16
    assert bool((slots.cache.k[1][:, block] == 7.0).all())
    assert slots.blocks_in_use == start + 16


def test_a_preallocated_pool_never_grows(monkeypatch):
    """The graph path's pool (preallocate): every slot at full length from the start, so reserving all of it
    keeps the same tensors the graphs were captured over; on CUDA only while it fits half the free memory."""
    slots = SlotManager(CONFIG, capacity=4, max_len=256, device=CPU, dtype=torch.float32, contiguous=False,
                        preallocate=True)  # fmt: skip
    assert slots.cache.num_blocks == slots.max_blocks + 1
    pointer = slots.cache.k[0].data_ptr()
    for slot in [slots.allocate() for _ in range(4)]:
        slots.reserve(slot, 256)
    assert slots.cache.k[0].data_ptr() == pointer and slots.blocks_in_use == slots.max_blocks
    per_block = kv_cache.BLOCK_SIZE * kv_cache.bytes_per_token(CONFIG, torch.float32)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * per_block * 65, 0))
    assert kv_cache.fits_whole_pool(65, kv_cache.BLOCK_SIZE, CONFIG, torch.float32, torch.device("cuda"))
    assert not kv_cache.fits_whole_pool(66, kv_cache.BLOCK_SIZE, CONFIG, torch.float32, torch.device("cuda"))


def test_layout_follows_the_size_of_a_full_preallocation(monkeypatch):
    small = SlotManager(CONFIG, capacity=4, max_len=256, device=CPU, dtype=torch.float32)
    # every slot at full length, and no more: the scratch slot waits for a static-shape forward
    assert small.contiguous and small.cache.k[0].shape == (4, 2, 256, 8) and small.scratch is None
    small.allocate()
    b = small.allocate()
    small.reserve(b, 20)
    assert small.tables[b] == [16, 17] and small.blocks_in_use == 2  # slot 1's own run of blocks
    small.cache.k[1][b] = 7.0
    assert small.ensure_scratch() == 4 and small.ensure_scratch() == 4  # added once, past the last slot
    assert small.cache.k[0].shape == (5, 2, 256, 8) and bool((small.cache.k[1][b] == 7.0).all())
    assert not small.cache.k[1][4].any()
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 2**20)  # slots x max_len would exceed it: paged
    big = SlotManager(CONFIG, capacity=4, max_len=4096, device=CPU, dtype=torch.float32)
    assert not big.contiguous and big.cache.num_blocks < big.max_blocks


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_does_not_depend_on_layout_or_pool_growth(monkeypatch, temperature):
    torch.manual_seed(0)
    model = DecoderLM(CONFIG)
    prompts = [[1, *range(5, 5 + n)] for n in (3, 30, 12, 50, 7)]
    params = [SamplingParams(temperature=temperature, max_tokens=60, seed=i) for i in range(len(prompts))]

    def run(contiguous: bool, initial: int = 4) -> tuple[list[list[int]], int]:
        monkeypatch.setattr(kv_cache, "INITIAL_BLOCKS_PER_SLOT", initial)
        monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 2**40 if contiguous else 0)
        engine = Engine(model, EngineConfig(max_num_seqs=3, max_model_len=4096), eos_token_ids=[2])
        assert engine.slots.contiguous == contiguous
        out = [s.response_ids for s in engine.generate(prompts, params)]
        assert engine.slots.blocks_in_use == 0  # every block back on the free list
        return out, 0 if contiguous else engine.slots.cache.num_blocks

    small, grown = run(False, initial=1)  # starts at 3 blocks: grows several times mid-run
    large, _ = run(False, initial=64)
    contiguous, _ = run(True)
    assert small == large == contiguous
    assert 3 < grown <= 3 * -(-(51 + 60) // 16) * 1.5  # sized by the tokens in flight, not by max_model_len
