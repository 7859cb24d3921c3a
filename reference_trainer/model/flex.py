"""FlexAttention over the engine's KV cache: a decode or verify forward's attention in one op per layer.

The few-query path (attention.py, Q <= SMALL_Q) with `attention="flex"`. The query heads that share a KV
head are folded into the query axis, as the matmul path does ([B, Hkv, g*Q, D], row g_i*Q + q_i is query
q_i), so flex sees one query head per KV head: each K/V row is read once, and inductor's flex-decoding
kernel, which wants a power-of-two head ratio (SmolLM2 has 3), can apply to every model.

* Paged cache: K/V are the layer's whole pool seen as one sequence, [1, Hkv, blocks * block_size, D], a
  view (no gather). As in PyTorch's paged-attention helper
  (torch/nn/attention/experimental/_paged_attention.py), the block mask's kv indices are each row's block
  table (physical blocks: its kv block size is the cache's block size) and the mask_mod maps a physical key
  index back to the row's logical position through a [B, blocks] physical-to-logical table built once per
  forward; a block the row does not own maps to -1 and is masked. The compiled kernel visits only the
  listed blocks; the eager reference evaluates the mask_mod over the whole pool, so the mask alone must be
  right (the CPU tests hold both to the matmul path).
* Slot cache: K/V are what the matmul path reads (a view of the slot range, or the gathered slots), with a
  causal mask by position.

Everything is built from device tensors with shapes fixed by (batch, Q, table width, pool size): no host
sync, so it can run inside a CUDA graph capture (engine/graphs.py).

Eager `flex_attention` is PyTorch's reference implementation: it materialises the scores over every key it
is given (the whole pool, for a paged cache), behind a dynamo trace of its own on each call. Correct, and
what CPU runs (tests), but no kernel to measure. On CUDA the op is compiled (COMPILED_ON): one compile per
static shape (dynamic=False, since inductor uses its decoding kernel only for a static batch; graphs.py
runs static shapes anyway), done by graphs.py's warm-up run before a capture. The shapes are (batch
bucket, width, pool size), more than dynamo's default 8 recompiles per function: flex calls raise the limit
to RECOMPILE_LIMIT, past which dynamo runs the call uncompiled, i.e. the eager reference (correct, slow,
memory-hungry over a big pool; with fullgraph=True it would raise instead, hence no fullgraph). Not
measured on a GPU yet: compile counts and times, the kernel's choice of BLOCK_N for 16-position blocks
(its main, non-decoding kernel needs BLOCK_N to divide the kv block size) and replay under CUDA graphs are
the next GPU session's to check. On CPU, compiled flex works at a static shape, but a second shape
(dynamic) failed to build in torch 2.13 (a C++ compile error in inductor's CPU flex template), so CPU stays
eager.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

Q_TILE = 128  # rows of the block mask's query tiles (flex's default)
SLOT_KV_TILE = 128  # the slot layout's kv tile: there the mask is plain causal, any tile size works
COMPILED_ON = ("cuda",)  # device types on which flex runs compiled (see the module docstring)
RECOMPILE_LIMIT = 64  # compiled shapes of flex per process (dynamo's default is 8)


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    return torch.compile(flex_attention, dynamic=False)


def _tiles(n: int, tile: int) -> int:
    return -(-n // tile)


def paged_block_mask(
    tables: torch.Tensor,
    start: torch.Tensor,
    last: torch.Tensor,
    num_blocks: int,
    block_size: int,
    num_q: int,
    group: int,
) -> BlockMask:
    """The block mask of a forward over a paged pool of `num_blocks` blocks: row b's queries (its g*Q
    folded rows, query q at position start[b] + q) see the positions of its block table up to their own.
    `last[b]`: the row's last real position; table entries past its block are padding (scratch) and listed
    nowhere."""
    bsz, width = tables.shape
    device = tables.device
    visible = torch.clamp(last // block_size + 1, max=width)  # [B] blocks the row's queries can reach
    entry = torch.arange(width, device=device)
    real = entry[None, :] < visible[:, None]  # [B, W]
    # physical block -> its index in row b's table, -1 if row b does not own it. Padding entries are
    # scattered into a spare last column (all -1: duplicates write the same value, so the order is moot).
    owner = torch.full((bsz, num_blocks + 1), -1, dtype=torch.int32, device=device)
    owner.scatter_(
        1,
        torch.where(real, tables, num_blocks),
        torch.where(real, entry[None, :], -1).to(torch.int32),
    )

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        logical = owner[b, kv_idx // block_size]
        position = logical * block_size + kv_idx % block_size
        return (logical >= 0) & (position <= start[b] + q_idx % num_q)

    # As PyTorch's helper does, the index list is as wide as the pool (its CPU kernel asserts it covers
    # the key length); a kernel reads only the first kv_num_blocks entries of a row.
    q_tiles = _tiles(group * num_q, Q_TILE)
    indices = torch.zeros((bsz, 1, q_tiles, max(num_blocks, width)), dtype=torch.int32, device=device)
    indices[:, :, :, :width] = tables[:, None, None, :]
    return BlockMask.from_kv_blocks(
        visible.to(torch.int32)[:, None, None].expand(bsz, 1, q_tiles).contiguous(),
        indices,
        BLOCK_SIZE=(Q_TILE, block_size),
        mask_mod=mask_mod,
        seq_lengths=(group * num_q, num_blocks * block_size),
        compute_q_blocks=False,  # the backward's transposed indices: inference needs none
    )


def slot_block_mask(
    start: torch.Tensor, last: torch.Tensor, key_len: int, num_q: int, group: int
) -> BlockMask:
    """The block mask over K/V already laid out per row ([B, Hkv, key_len, D]): causal by position."""
    bsz = start.shape[0]
    tiles = _tiles(key_len, SLOT_KV_TILE)
    q_tiles = _tiles(group * num_q, Q_TILE)
    visible = torch.clamp(last // SLOT_KV_TILE + 1, max=tiles).to(torch.int32)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx <= start[b] + q_idx % num_q

    indices = torch.arange(tiles, dtype=torch.int32, device=start.device).expand(bsz, 1, q_tiles, tiles)
    return BlockMask.from_kv_blocks(
        visible[:, None, None].expand(bsz, 1, q_tiles).contiguous(),
        indices.contiguous(),
        BLOCK_SIZE=(Q_TILE, SLOT_KV_TILE),
        mask_mod=mask_mod,
        seq_lengths=(group * num_q, key_len),
        compute_q_blocks=False,
    )


def attend(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_mask: BlockMask) -> torch.Tensor:
    """Folded queries [B, Hkv, g*Q, D] over keys/values [B or 1, Hkv, K, D]: [B, Hkv, g*Q, D]."""
    scale = qg.shape[-1] ** -0.5
    if qg.device.type not in COMPILED_ON:
        return flex_attention(qg, keys, values, block_mask=block_mask, scale=scale)  # type: ignore[return-value]
    shape = (tuple(qg.shape), tuple(keys.shape), qg.dtype)
    if shape not in _COMPILED_SHAPES:
        _COMPILED_SHAPES.add(shape)
        if len(_COMPILED_SHAPES) == RECOMPILE_LIMIT + 1:  # said once, never silently
            warnings.warn(
                f"flex attention has been compiled for {RECOMPILE_LIMIT} shapes in this process; further "
                "shapes run PyTorch's eager reference (slow, and it materialises scores over the whole KV "
                "pool): set EngineConfig.attention='sdpa' for workloads of this many shapes",
                RuntimeWarning,
                stacklevel=2,
            )
    # Dynamo reads the limit when a call misses its cache, so patching around the call is enough.
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return _compiled()(qg, keys, values, block_mask=block_mask, scale=scale)


# The shapes compiled so far in this process. They are bounded by construction: only the graph path's
# decode and verify forwards use flex (prefill uses SDPA, engine/runner.py), at (batch bucket, width, pool
# size); a grown pool adds shapes, but it grows by x1.5, so a run sees a handful of sizes.
_COMPILED_SHAPES: set[tuple] = set()
