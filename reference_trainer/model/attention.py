"""The engine's K/V storage, in two layouts, and the cached attention that reads it.

* `PagedKVCache`: fixed-size blocks of `block_size` positions, as in vLLM's PagedAttention and nano-vllm's
  BlockManager. A sequence owns a list of blocks (its block table), so memory can grow with the tokens in
  flight rather than with slots x max_model_len. Layout per layer: [kv_head, block, position, head_dim];
  gathering a batch's blocks (per KV head, along the block axis) yields [kv_head, batch, positions, head_dim]
  contiguous, the batch of K matrices the decode matmuls want, with no permute-copy.
* `SlotKVCache`: every slot preallocated at full length, [slot, kv_head, position, head_dim]. A decode over a
  packed range of slots reads it as a view with no gather at all, which is what a small model's step time
  is made of. Meant for when slots x max_len is small (engine/kv_cache.py chooses).

Who owns which block or slot is the engine's business (engine/kv_cache.py). Both caches start zeroed and
only ever hold finite K/V: masked positions are still multiplied (by a zero attention weight), and 0 * NaN
from uninitialised memory would poison the row.

Attention for few queries per row (decode, verify: Q <= SMALL_Q) has three implementations, chosen per
forward (CachedBatch's `attention`, from `EngineConfig.attention`); all give the same result:
* "matmul": read each row's K/V (gathered blocks, or a view of the slots), two batched matmuls and an fp32
  softmax. On CPU it ties sdpa at batch 1 and beats it at batch 32 (measured); what "auto" picks;
* "sdpa": the same reads, then one `F.scaled_dot_product_attention` call;
* "flex": FlexAttention (flex.py), straight over the paged pool through the block tables, with no gather
  (compiled on CUDA; on CPU PyTorch's unfused reference, 10-100x slower: for tests).
Prefill (Q > SMALL_Q) is SDPA over the gathered K/V whatever the choice: one fused kernel already. A fresh
prefill (every row starts at position 0, `CachedBatch.fresh`) attends causally over its own new K/V, with no
read of the cache and no mask: SDPA's fused causal kernel, whatever the width.

A forward may hold several parts (`MixedBatch`): a decode step with admissions riding in it packs the
running rows' newest tokens and the admitted rows' prompts into one row of tokens, so the projections,
norms and MLP run once over all of them, and attention runs per part, each a CachedBatch of its own shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_trainer.model import flex
from reference_trainer.model.config import ModelConfig

SMALL_Q = 32  # up to this many queries per row (decode, verification) the `attention` choice applies
IMPLEMENTATIONS = ("matmul", "sdpa", "flex")  # the few-query attention's implementations (see above)


def resolve_attention(choice: str, device: torch.device) -> str:
    """The implementation "auto" stands for on `device`; any other choice is itself. "matmul" on CPU, where
    it measured fastest; "flex" on CUDA, where benchmarks/gpu.py's attention table measured it fastest at
    every batch on SmolLM2's shape (H200, torch 2.11, 2026-11-26: decode step 2.05 / 3.64 / 4.66 ms at batch
    1 / 64 / 256 against matmul's 2.61 / 4.24 / 7.16 and sdpa's 2.62 / 3.95 / 7.02;
    benchmarks/results/gpu/run-2026-11-26-h200-2a83ee8/attention.json)."""
    if choice == "auto":
        return "flex" if device.type == "cuda" else "matmul"
    if choice not in IMPLEMENTATIONS:
        raise ValueError(f"attention must be auto or one of {', '.join(IMPLEMENTATIONS)}, got {choice!r}")
    return choice


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of one position in every layer."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize


class PagedKVCache:
    """K/V blocks for every layer; `grow` enlarges the pool (copying it), blocks keep their indices."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.block_size = block_size
        self._shape = (config.num_key_value_heads, block_size, config.head_dim)
        self.device, self.dtype = device, dtype
        self.k: list[torch.Tensor] = [self._zeros(num_blocks) for _ in range(config.num_hidden_layers)]
        self.v: list[torch.Tensor] = [self._zeros(num_blocks) for _ in range(config.num_hidden_layers)]

    def _zeros(self, num_blocks: int) -> torch.Tensor:
        heads, size, dim = self._shape
        return torch.zeros((heads, num_blocks, size, dim), device=self.device, dtype=self.dtype)

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[1]

    def read(self, layer: int, blocks: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions [0, num_tokens) stored in `blocks` (a block table): [kv_head, n, head_dim]."""
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        heads, _, dim = self._shape
        k, v = (pool[layer].index_select(1, index).reshape(heads, -1, dim) for pool in (self.k, self.v))
        return k[:, :num_tokens], v[:, :num_tokens]

    def grow(self, num_blocks: int) -> None:
        """Enlarge every layer's pool to `num_blocks`, keeping the blocks already written."""
        old = self.num_blocks
        for pool in (self.k, self.v) if num_blocks > old else ():
            for i, tensor in enumerate(pool):
                bigger = self._zeros(num_blocks)
                bigger[:, :old] = tensor
                pool[i] = bigger  # the old tensor is freed here, so the peak is one layer's copy


class SlotKVCache:
    """`capacity` slots of `max_len` positions per layer, preallocated: [slot, kv_head, pos, head_dim]."""

    def __init__(
        self, config: ModelConfig, capacity: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        shape = (capacity, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]

    def add_slot(self) -> None:
        """One more slot past the last, zeroed (the existing slots keep their K/V)."""
        self.k = [torch.cat([k, k.new_zeros((1, *k.shape[1:]))]) for k in self.k]
        self.v = [torch.cat([v, v.new_zeros((1, *v.shape[1:]))]) for v in self.v]

    def read(self, layer: int, slot: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the slot's positions [0, num_tokens): [kv_head, n, head_dim]."""
        return self.k[layer][slot, :, :num_tokens], self.v[layer][slot, :, :num_tokens]


class CachedBatch:
    """Per-forward indexing shared by all layers: where each row's new tokens go and what it may attend to.

    Row b continues its sequence at position start_pos[b] with num_new[b] real tokens (default: all Q; the
    rest is right padding, computed but never stored). `rows` says where each row's K/V live: its block
    table ([B, blocks], padded with any valid block: positions past a row's own are masked) for a paged
    cache, its slot ([B]) for a slot cache; `contiguous` says those slots are a consecutive range, read as a
    view of the cache. For a slot cache the caller may pass what it knows on the host — `key_len` (positions
    attended to, at least every row's last position + 1) and `slot_range` (the range `rows` covers) —
    since reading them from the device tensors would make the host wait for the device. `attention`: the
    few-query implementation (IMPLEMENTATIONS). `fresh` (host-known): every row starts at position 0, so
    each attends causally over its own new tokens only (a right-padded row's real tokens never see its
    padding, which comes after them).
    """

    def __init__(
        self,
        start_pos: torch.Tensor,
        num_q: int,
        cache: PagedKVCache | SlotKVCache,
        rows: torch.Tensor,
        num_new: torch.Tensor | None = None,
        contiguous: bool = False,
        key_len: int | None = None,
        slot_range: tuple[int, int] | None = None,
        attention: str = "matmul",
        fresh: bool = False,
    ) -> None:
        if attention not in IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {attention!r}")
        self.num_q, self.start_pos, self.cache = num_q, start_pos, cache
        self.fresh = fresh and num_q > 1
        self.flex = attention == "flex" and num_q <= SMALL_Q and not self.fresh
        self.sdpa = attention == "sdpa"
        self.block_mask: flex.BlockMask | None = None
        device = start_pos.device
        offsets = torch.arange(num_q, device=device)
        self.positions = start_pos[:, None] + offsets[None, :]  # [B, Q]
        real = None if num_new is None else offsets[None, :] < num_new[:, None]  # [B, Q]
        self.paged = isinstance(cache, PagedKVCache)
        if isinstance(cache, PagedKVCache):
            size = cache.block_size
            self.flat_tables = rows.reshape(-1)
            self.key_len = rows.shape[1] * size  # the gathered span, whole blocks
            # Flat pool index (block * size + offset) of every real new token, in row-major (b, q) order.
            block_of = (self.positions // size).clamp(max=rows.shape[1] - 1)
            flat = (rows.gather(1, block_of) * size + self.positions % size).reshape(-1)
            self.real = None if real is None else real.reshape(-1)
            self.write_index = flat if real is None else flat[self.real]
            self.rows, self.block_size, self.pool_blocks = rows, size, cache.num_blocks
        else:
            self.slots = rows
            self.key_len = key_len if key_len is not None else int(self.positions.max().item()) + 1
            if contiguous and slot_range is None:
                slot_range = (int(rows[0]), int(rows[-1]) + 1)
            self.slot_range = slot_range if contiguous else None
            slot_of = rows[:, None].expand_as(self.positions)
            self.write_at = (
                (slot_of, self.positions) if real is None else (slot_of[real], self.positions[real])
            )
            self.real = real
        if self.flex:  # each row's last real position: flex lists no block past it
            self.last = start_pos + (num_q - 1 if num_new is None else num_new - 1)
        elif not self.fresh:  # flex masks by its own mask_mod; a fresh prefill is causal
            keys = torch.arange(self.key_len, device=device)
            self.mask = keys[None, None, :] <= self.positions[:, :, None]  # [B, Q, K]
            self._grouped: dict[tuple[int, bool], torch.Tensor] = {(1, True): self.mask}
            # Only the few-query matmul path adds a bias (SDPA takes the mask): built once for every layer.
            if num_q <= SMALL_Q and not self.sdpa:
                self._grouped[1, False] = torch.where(self.mask, 0.0, float("-inf"))
        self._buffers: dict[int, torch.Tensor] = {}  # gather targets for K and V, shared by the layers

    def gather(self, pool: torch.Tensor, which: int) -> torch.Tensor:
        """A paged layer's K (which=0) or V (1), [Hkv, blocks, block, D], as [Hkv, B, K, D]: each row's
        blocks in order, contiguous. One dim-0 index_select per KV head (whole 4 KiB blocks), into a buffer
        that every layer of this forward reuses. On CPU one index_select along dim 1 copied far slower: in a
        batch-32 SmolLM2 decode step the gathers took 38 ms that way and take 26 ms this way."""
        heads, _, size, dim = pool.shape
        buffer = self._buffers.get(which)
        if buffer is None:
            buffer = torch.empty(
                (heads, len(self.flat_tables), size, dim), dtype=pool.dtype, device=pool.device
            )
            self._buffers[which] = buffer
        if pool.is_cuda:  # one kernel for every head (a launch per head is what costs there)
            torch.index_select(pool, 1, self.flat_tables, out=buffer)
        else:
            for head in range(heads):
                torch.index_select(pool[head], 0, self.flat_tables, out=buffer[head])
        return buffer.view(heads, -1, self.key_len, dim)

    def grouped_bias(self, group: int, boolean: bool = False) -> torch.Tensor:
        """The bias (or boolean mask) for g query heads per KV head folded into the query axis: [B, g*Q, K],
        row g_i*Q + q_i is query q_i's. Built once per forward, not per layer."""
        if (group, boolean) not in self._grouped:
            self._grouped[group, boolean] = self._grouped[1, boolean].repeat(1, group, 1)
        return self._grouped[group, boolean]

    def flex_mask(self, group: int) -> flex.BlockMask:
        """The flex block mask (flex.py), built by the first layer and shared by the rest."""
        if self.block_mask is None:
            if self.paged:
                self.block_mask = flex.paged_block_mask(
                    self.rows, self.start_pos, self.last, self.pool_blocks, self.block_size, self.num_q, group
                )
            else:
                self.block_mask = flex.slot_block_mask(
                    self.start_pos, self.last, self.key_len, self.num_q, group
                )
        return self.block_mask


def write_and_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: CachedBatch | MixedBatch | PackedBatch,
) -> torch.Tensor:
    """Store the new k/v ([B, Q, Hkv, D]) in the cache, then attend q ([B, Q, H, D]) over each row's cached
    positions; returns [B, Q, H * D]."""
    if isinstance(batch, MixedBatch | PackedBatch):
        return batch.write_and_attend(q, k, v, k_cache, v_cache)
    bsz, num_q, heads, dim = q.shape
    kv_heads = k.shape[2]
    _write(k, v, k_cache, v_cache, batch)
    if batch.fresh:  # each row over its own new tokens, causally: no cache read, no mask
        if kv_heads != heads:  # every query head's K/V: SDPA's fused kernels take no GQA (enable_gqa: math)
            k, v = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        return out.transpose(1, 2).reshape(bsz, num_q, heads * dim)
    if batch.flex and batch.paged:  # the pool itself, no gather (a cast only if the cache's dtype differs)
        keys, values = (c.view(kv_heads, -1, dim)[None].to(q.dtype) for c in (k_cache, v_cache))
        out = flex.attend(_fold(q, kv_heads), keys, values, batch.flex_mask(heads // kv_heads))
        return _unfold(out, num_q)
    keys, values, batch_first = _read_cache(k_cache, v_cache, batch, q.dtype)
    if num_q > SMALL_Q:  # prefill: SDPA's fused kernel wins
        keys, values = (keys, values) if batch_first else (keys.transpose(0, 1), values.transpose(0, 1))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=batch.mask[:, None], enable_gqa=kv_heads != heads
        )
        return out.transpose(1, 2).reshape(bsz, num_q, heads * dim)
    # Few queries per row. The query heads that share a KV head are folded into the query axis (HF's head
    # order: kv head h serves h*g .. h*g+g-1), so each K/V row is read once and no GQA support is needed.
    group = heads // kv_heads
    qg = _fold(q, kv_heads)
    if batch.flex:  # slot cache: flex over the same reads
        return _unfold(flex.attend(qg, keys, values, batch.flex_mask(group)), num_q)
    if batch.sdpa:
        keys, values = (keys, values) if batch_first else (keys.transpose(0, 1), values.transpose(0, 1))
        # The boolean mask: a float one would have to be cast to the model's dtype first.
        mask = batch.grouped_bias(group, boolean=True)[:, None]
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=dim**-0.5)
        return _unfold(out, num_q)
    # "matmul": two small batched matmuls beat SDPA's masked kernel on CPU. Batch dims are [B, Hkv] for the
    # slot layout, [Hkv, B] for the paged one.
    bias = batch.grouped_bias(group)
    qg, bias = (qg, bias[:, None]) if batch_first else (qg.transpose(0, 1), bias[None])
    # The softmax runs in fp32 whatever the model's dtype (as HF's eager attention does).
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * dim**-0.5 + bias
    out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)  # [.., .., g*Q, D]
    return _unfold(out if batch_first else out.transpose(0, 1), num_q)


def _read_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, batch: CachedBatch, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The rows' cached keys and values in `dtype`, and whether they are batch first: [B, Hkv, K, D]
    (slots) or [Hkv, B, K, D] (paged)."""
    if batch.paged:
        keys, values = (batch.gather(pool, i) for i, pool in enumerate((k_cache, v_cache)))
        return keys.to(dtype), values.to(dtype), False
    if batch.slot_range is not None:
        lo, hi = batch.slot_range
        keys, values = k_cache[lo:hi, :, : batch.key_len], v_cache[lo:hi, :, : batch.key_len]
    else:  # slice before gathering: copy only the positions attended to, not whole slots
        keys = k_cache[:, :, : batch.key_len].index_select(0, batch.slots)
        values = v_cache[:, :, : batch.key_len].index_select(0, batch.slots)
    return keys.to(dtype), values.to(dtype), True


def _write(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: CachedBatch
) -> None:
    """Store the real new tokens' K/V ([B, Q, Hkv, D]) at their positions of each row's blocks or slot."""
    bsz, num_q, kv_heads, dim = k.shape
    if batch.paged:
        for new, pool in ((k, k_cache), (v, v_cache)):
            heads_first = new.permute(2, 0, 1, 3)  # [Hkv, B, Q, D], a view: index_put reads it strided
            if batch.real is None:
                index, values = batch.write_index.view(bsz, num_q), heads_first
            else:
                flat = heads_first.reshape(kv_heads, bsz * num_q, dim)
                index, values = batch.write_index, flat[:, batch.real]
            pool.view(kv_heads, -1, dim)[:, index] = values.to(pool.dtype)
    else:
        slot_of, pos = batch.write_at
        for new, cache in ((k, k_cache), (v, v_cache)):
            cache[slot_of, :, pos] = (new if batch.real is None else new[batch.real]).to(cache.dtype)


def _fold(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, Q, H, D] -> [B, Hkv, g*Q, D]: query heads folded into the query axis, row g_i*Q + q_i."""
    bsz, num_q, heads, dim = q.shape
    group = heads // kv_heads
    return q.reshape(bsz, num_q, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(bsz, kv_heads, -1, dim)


def _unfold(out: torch.Tensor, num_q: int) -> torch.Tensor:
    """[B, Hkv, g*Q, D] -> [B, Q, H * D], the inverse of `_fold`."""
    bsz, kv_heads, rows, dim = out.shape
    group = rows // num_q
    return out.view(bsz, kv_heads, group, num_q, dim).permute(0, 3, 1, 2, 4).reshape(bsz, num_q, -1)


class MixedBatch:
    """A forward over several parts packed into one row of N tokens ([1, N] ids): the dense ops run once over
    every token, attention per part. `parts`: (the part's CachedBatch, its rows, its width), in token order.
    Parts attend in that order within every layer, so a part that writes padding K/V into another part's
    slot (the packed-range decode of the contiguous layout, runner.py) must come before it: the later part
    writes its real K/V over it in the same layer."""

    def __init__(self, parts: list[tuple[CachedBatch | PackedBatch, int, int]]) -> None:
        self.parts = parts
        self.cache = parts[0][0].cache
        self.positions = torch.cat([b.positions.reshape(-1) for b, _, _ in parts])[None]  # [1, N]

    def write_and_attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """`write_and_attend` of each part over its slice of the packed q/k/v ([1, N, heads, D]); returns
        [1, N, H * D]."""
        outs, start = [], 0
        for batch, rows, width in self.parts:
            n = rows * width
            q_, k_, v_ = (t[0, start : start + n].view(rows, width, *t.shape[2:]) for t in (q, k, v))
            outs.append(write_and_attend(q_, k_, v_, k_cache, v_cache, batch).reshape(1, n, -1))
            start += n
        return torch.cat(outs, dim=1)


class PackedBatch:
    """Fresh sequences (each from position 0) packed into one row of T tokens ([1, T]), as a static shape:
    token t of document doc[t] sits at position positions[t] and writes its K/V at `write` (paged: the
    flat pool index, block * block_size + offset; slot cache: (slot, position)). Each token attends
    causally within its own document only, by a [T, T] mask built on the device from `doc` and `positions`,
    so a captured graph holds it for any packing of up to T tokens (engine/mixed.py). Padding tokens are
    a document of their own that writes into the cache's scratch place and is never sampled."""

    def __init__(
        self,
        positions: torch.Tensor,
        doc: torch.Tensor,
        write: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        cache: PagedKVCache | SlotKVCache,
    ) -> None:
        self.cache, self.write = cache, write
        self.positions = positions[None]  # [1, T]
        same = doc[:, None] == doc[None, :]
        self.mask = (same & (positions[None, :] <= positions[:, None]))[None, None]  # [1, 1, T, T]

    def write_and_attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Store k/v ([1, T, Hkv, D]) and attend q ([1, T, H, D]) over the packed tokens; [1, T, H * D]."""
        _, n, heads, dim = q.shape
        kv_heads = k.shape[2]
        for new, pool in ((k, k_cache), (v, v_cache)):
            if isinstance(self.write, tuple):  # slot cache [slot, Hkv, pos, D]
                pool[self.write[0], :, self.write[1]] = new[0].to(pool.dtype)
            else:
                pool.view(kv_heads, -1, dim)[:, self.write] = new[0].transpose(0, 1).to(pool.dtype)
        if kv_heads != heads:  # every query head's K/V, as the fresh prefill path does
            k, v = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=self.mask
        )
        return out.transpose(1, 2).reshape(1, n, heads * dim)
