"""Slots and KV memory: which sequence runs where, and where its K/V live (model/attention.py).

A slot is a place in the running batch (the trace's occupancy unit; `max_num_seqs` of them). Two layouts:

* paged (when slots x max_len would not fit CONTIGUOUS_KV_BYTES): K/V in blocks of `block_size` positions;
  a running sequence has a block table, blocks come from a free list as it grows and go back when it ends,
  as in nano-vllm's BlockManager, and the pool itself grows on demand (by half, up to every slot at full
  length). KV memory follows the tokens in flight, not slots x max_model_len. Attention gathers the blocks.
* contiguous (small models, short contexts): every slot preallocated at full length (at most
  CONTIGUOUS_KV_BYTES). A decode over a packed range of slots reads the cache as a view with no gather, and
  for a small model that read is most of a step.

Block tables are kept in both layouts (in the contiguous one a slot's blocks are its own fixed run), so the
accounting is the same. The pool never shrinks: a later batch of the same size reuses it.

Each layout has one scratch place that no sequence owns: block 0 of the paged pool (also the padding of
block tables, read but masked), an extra slot past the last in the contiguous one, added only when a
static-shape forward (engine/graphs.py) is built: rows that only pad a batch to a static shape write their
K/V there, and nothing else does.
"""

from __future__ import annotations

import heapq

import torch

from reference_trainer.model.attention import PagedKVCache, SlotKVCache, bytes_per_token
from reference_trainer.model.config import ModelConfig

BLOCK_SIZE = 16  # positions per block (vLLM's default): small enough that the last block wastes little
INITIAL_BLOCKS_PER_SLOT = 4  # a paged pool starts at 64 positions per slot and grows from there
CONTIGUOUS_KV_BYTES = 512 * 2**20  # up to this, preallocate every slot at full length (contiguous layout)


WHOLE_POOL_SHARE = 0.5  # preallocate the whole paged pool only if it takes at most this share of free memory


def fits_whole_pool(
    blocks: int, block_size: int, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether a pool of `blocks` fits in WHOLE_POOL_SHARE of the device's free memory (CUDA); elsewhere
    (CPU, and the meta device of the rehearsal tests) memory is not queried and it does."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return blocks * block_size * bytes_per_token(config, dtype) <= WHOLE_POOL_SHARE * free


class SlotManager:
    def __init__(
        self,
        config: ModelConfig,
        capacity: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int = BLOCK_SIZE,
        contiguous: bool | None = None,
        preallocate: bool = False,
    ) -> None:
        """`preallocate`: a paged pool holds every slot at full length from the start, when that fits the
        device's free memory (`fits_whole_pool`), and never grows. CUDA graphs (graphs.py) want it: they
        are captured over the pool's tensors, and a grown pool is new tensors, so every graph would be
        dropped and recaptured inside a timed step."""
        self.capacity = capacity
        self.max_len = max_len
        self.block_size = block_size
        self.blocks_per_slot = -(-max_len // block_size)
        self.max_blocks = capacity * self.blocks_per_slot  # every slot at full length
        if contiguous is None:
            contiguous = self.max_blocks * block_size * bytes_per_token(config, dtype) <= CONTIGUOUS_KV_BYTES
        self.contiguous = contiguous
        self.cache: PagedKVCache | SlotKVCache
        if contiguous:
            self.cache = SlotKVCache(config, capacity, max_len, device, dtype)
            self.scratch: int | None = None  # the extra slot, made by `ensure_scratch` when first needed
            initial = 0
        else:
            whole = preallocate and fits_whole_pool(self.max_blocks + 1, block_size, config, dtype, device)
            initial = (
                self.max_blocks if whole else min(self.max_blocks, capacity * INITIAL_BLOCKS_PER_SLOT)
            ) + 1
            self.cache = PagedKVCache(config, initial, block_size, device, dtype)
            self.scratch = 0  # block 0
        self._free = list(range(capacity))  # sorted, so already a heap
        self._free_blocks = list(range(initial - 1, 0, -1))  # popped from the end: low blocks first
        self.tables: dict[int, list[int]] = {}

    def ensure_scratch(self) -> int:
        """The scratch place, made on first need. Only static-shape forwards (graphs.py) write padding
        rows, so the contiguous layout adds its extra slot for them alone: at capacity 1 it would double
        the cache."""
        if self.scratch is None:
            assert isinstance(self.cache, SlotKVCache)
            self.cache.add_slot()
            self.scratch = self.capacity
        return self.scratch

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def blocks_in_use(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free slot")
        slot = heapq.heappop(self._free)
        self.tables[slot] = []
        return slot

    def release(self, slot: int) -> None:
        blocks = self.tables.pop(slot, [])
        if not self.contiguous:
            self._free_blocks.extend(reversed(blocks))
        heapq.heappush(self._free, slot)

    def reserve(self, slot: int, num_tokens: int) -> None:
        """Give `slot` blocks for positions [0, num_tokens); growing the pool when the free list runs out."""
        if num_tokens > self.max_len:
            raise ValueError(f"{num_tokens} positions exceed the cache's {self.max_len} per sequence")
        table = self.tables[slot]
        need = -(-num_tokens // self.block_size) - len(table)
        if need <= 0:
            return
        if self.contiguous:  # the slot's own run of blocks
            base = slot * self.blocks_per_slot + len(table)
            table.extend(range(base, base + need))
            return
        if need > len(self._free_blocks):
            self._grow(need - len(self._free_blocks))
        table.extend(self._free_blocks.pop() for _ in range(need))

    def reserve_each(self, slots: list[int], ends: list[int]) -> None:
        """`reserve(slot, end)` for each pair, calling it only where a slot needs a new block or the end is
        past the cache (a decode step's per-row check, in series with the GPU)."""
        tables, size, max_len = self.tables, self.block_size, self.max_len
        for slot, end in zip(slots, ends, strict=True):
            if end > len(tables[slot]) * size or end > max_len:
                self.reserve(slot, end)

    def _grow(self, at_least: int) -> None:
        assert isinstance(self.cache, PagedKVCache)
        old = self.cache.num_blocks
        # x1.5: a few copies over a run, while the pool overshoots what is in flight by at most half.
        new = min(self.max_blocks + 1, max(old + old // 2, old + at_least))  # + the scratch block
        if new - old < at_least:  # cannot happen while every slot stays within max_len
            raise RuntimeError("KV cache exhausted")
        self.cache.grow(new)
        self._free_blocks[:0] = range(new - 1, old - 1, -1)  # below the old free ones: reused last

    def read(self, slot: int, layer: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V cached for `slot`'s positions [0, num_tokens) in `layer`: [kv_head, n, head_dim] each."""
        if isinstance(self.cache, SlotKVCache):
            return self.cache.read(layer, slot, num_tokens)
        return self.cache.read(layer, self.tables[slot], num_tokens)

    def where(self, slots: list[int], width: int | None = None) -> list[int]:
        """Where these slots' K/V live, flat, on the host: the slots themselves in the contiguous layout;
        block tables row by row in the paged one, each cut or padded with the scratch block (read but masked)
        to `width` blocks (default: the longest table)."""
        if self.contiguous:
            return list(slots)
        tables = [self.tables[s] for s in slots]
        width = width if width is not None else max(1, max(len(t) for t in tables))
        scratch = self.ensure_scratch()  # block 0: always there in the paged layout
        return [b for t in tables for b in t[:width] + [scratch] * (width - len(t))]
