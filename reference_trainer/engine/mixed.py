"""Decode steps with admissions riding in them, at static shapes, replayed as CUDA graphs on the GPU.

A step that admits requests into a running batch (runner.py `mixed`) was one eager forward: on SmolLM2's
shape, 64 running rows and 8 admitted prompts of 32 tokens launched 1,193 kernels one by one, and about
half of a SortedRL step's engine steps admit. Here such a step is one graph per shape
(running-row bucket, admitted-row bucket, admitted-token bucket, key span, sampler ops):

* the running rows are a decode part exactly as graphs.py's decode forward runs them (the batch padded to
  its bucket, padding rows writing into the scratch place), attending over the cache with the engine's
  decode attention; with compiled flex that is the same compiled shape as the plain decode step's (one
  compile per batch bucket, shared), so an admitting step adds no flex compile;
* the admitted prompts, which start at position 0 (a fresh admission; a resumed one runs eagerly), are
  packed into one row of a power-of-two number of tokens (attention.PackedBatch): their K/V written at
  host-computed cache positions, attention within each prompt by a document-causal mask built on the
  device from the packing, in SDPA. No new flex shape, no per-prompt width bucket;
* the LM head and the sampler run over the sampled rows only (the running rows, then each admitted
  prompt's last token), written into persistent buffers in that order, so the step's read-back is a view.

Attention stays inside the graph, rather than run between graph pieces as vLLM's piecewise capture does
(its CUDAPiecewiseBackend splits the graph at attention ops): a piece per layer would leave each layer's
cache writes and attention (at least 4 launches per layer, 30 layers here) outside, over the 40-kernel
budget, where one graph leaves the upload and the read-back. See docs/architecture.md.

Shapes are captured when first met (a `capture` trace event of its own, before the step's clock:
`Engine._prepare`), over padding rows; with capture=False the same forward runs eagerly, which is what the
CPU tests compare with the engine's eager mixed forward and what benchmarks/kernel_count.py counts.
"""

from __future__ import annotations

import torch

from reference_trainer.engine.graphs import StaticForward, batch_buckets, capture
from reference_trainer.engine.sampler import SamplerOps, sample
from reference_trainer.engine.transfers import PAD_ID, upload
from reference_trainer.model.attention import CachedBatch, MixedBatch, PackedBatch

MIN_PACKED = 64  # the smallest admitted-token bucket; buckets double up to the engine's prefill budget

Key = tuple[int, int, int, int, SamplerOps]  # (running bucket, admitted bucket, token bucket, span, ops)


def token_buckets(most: int) -> list[int]:
    """Admitted-token buckets: powers of two from MIN_PACKED up to the first that holds `most` tokens."""
    buckets = [MIN_PACKED]
    while buckets[-1] < most:
        buckets.append(buckets[-1] * 2)
    return buckets


class MixedForward:
    """Admitting decode steps over a StaticForward's model, cache and sampling table (sharing its graph
    memory pool)."""

    def __init__(self, static: StaticForward, max_tokens: int) -> None:
        self.static, self.slots = static, static.slots
        self.tokens_buckets = token_buckets(max_tokens)
        self.rows_buckets = batch_buckets(self.slots.capacity)
        cap, most = self.rows_buckets[-1], self.tokens_buckets[-1]
        blocks = static._blocks(static.limit)
        # ids (running + packed), starts, block tables, packed positions, documents, write places (2 per token
        # in the slot layout), then the sampled rows' index, slot and position.
        size = cap + most + cap + cap * blocks + 4 * most + 3 * 2 * cap
        self.inputs = torch.zeros(size, dtype=torch.long, device=static.device)
        self.tokens = torch.zeros(2 * cap, dtype=torch.long, device=static.device)
        self.logprobs = torch.zeros(2 * cap, dtype=torch.float32, device=static.device)
        self.graphs: dict[Key, torch.cuda.CUDAGraph] = {}
        self.ran: set[Key] = set()
        self._captured_over = 0

    def fits(self, running: int, admitted: list[list[int]], fresh: bool) -> bool:
        """Whether a step of `running` rows admitting prompts `admitted` (their uncached tokens; `fresh`:
        all start at position 0) runs here rather than eagerly."""
        total = sum(len(r) for r in admitted)
        return (
            fresh
            and self.static.sampling is not None
            and 0 < running <= self.rows_buckets[-1]
            and 0 < len(admitted) <= self.rows_buckets[-1]
            and total <= self.tokens_buckets[-1]
        )

    def key(self, running: int, admitted: list[list[int]], longest: int, ops: SamplerOps) -> Key:
        """The shape of such a step whose running rows reach position `longest` - 1."""
        total = sum(len(r) for r in admitted)
        rows = next(b for b in self.rows_buckets if b >= len(admitted))
        packed = next(b for b in self.tokens_buckets if b >= total)
        return (self.static.bucket(running), rows, packed, self.static.span(longest, 1), ops)

    def run(
        self,
        tokens: list[int],
        starts: list[int],
        slots: list[int],
        admitted: list[list[int]],
        admitted_slots: list[int],
        ops: SamplerOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: running row i feeds `tokens[i]` at `starts[i]` in `slots[i]`; admitted prompt j (its
        slot's cache reserved for it) is stored in `admitted_slots[j]`. Returns the drawn tokens and
        log-probs, running rows first ([len(tokens) + len(admitted)] device views)."""
        key = self.key(len(tokens), admitted, max(starts) + 1, ops)
        bucket, rows, packed, span, _ = key
        n, a, pad = len(tokens), len(admitted), bucket - len(tokens)
        blocks = self.static._blocks(span)
        scratch = self.static.scratch
        ids, positions, docs, write, last = self._pack(admitted, admitted_slots, packed)
        sampled_pad = pad + rows - a  # the sampled rows: bucket + rows, whatever n and a are
        parts = {
            "ids": tokens + [PAD_ID] * pad + ids,
            "starts": starts + [0] * pad,
            "rows": self.slots.where(slots, blocks) + [scratch] * (pad * blocks),
            "positions": positions,
            "docs": docs,
            "write": write,
            # running rows, then each prompt's last token; padding rows sample the last packed token
            "select": list(range(n)) + [bucket + i for i in last] + [bucket + packed - 1] * sampled_pad,
            "slots": slots + admitted_slots + [0] * sampled_pad,
            "draws": [s + 1 for s in starts] + [len(r) for r in admitted] + [0] * sampled_pad,
        }
        self._execute(key, self._args(upload(parts, self.static.device, into=self.inputs), key))
        return self.tokens[: n + a], self.logprobs[: n + a]

    def _pack(
        self, admitted: list[list[int]], slots: list[int], packed: int
    ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """The packed row of admitted prompts: ids, positions, document of each token, where each writes
        its K/V (paged: flat pool index; slots: slot indices, then positions), and each prompt's last
        token's index. Padding tokens: document -1 at position 0, written into the scratch place."""
        ids, positions, docs, last = [], [], [], []
        for doc, row in enumerate(admitted):
            ids += row
            positions += range(len(row))
            docs += [doc] * len(row)
            last.append(len(ids) - 1)
        pad = packed - len(ids)
        scratch = self.static.scratch
        if self.slots.contiguous:
            slot_of = [s for s, row in zip(slots, admitted, strict=True) for _ in row]
            write = slot_of + [scratch] * pad + positions + [0] * pad
        else:
            size = self.slots.block_size
            write = []
            for slot, row in zip(slots, admitted, strict=True):
                table = self.slots.tables[slot]
                write += [table[p // size] * size + p % size for p in range(len(row))]
            write += [scratch * size + i % size for i in range(pad)]
        return ids + [PAD_ID] * pad, positions + [0] * pad, docs + [-1] * pad, write, last

    def _args(self, inputs: dict[str, torch.Tensor], key: Key) -> tuple:
        bucket, _, packed, span, ops = key
        rows = inputs["rows"]
        where = rows if self.slots.contiguous else rows.view(bucket, self.static._blocks(span))
        write = inputs["write"]
        place = (write[:packed], write[packed:]) if self.slots.contiguous else write
        sampled = (inputs["select"], inputs["slots"], inputs["draws"], ops)
        return (
            inputs["ids"],
            inputs["starts"],
            where,
            span,
            inputs["positions"],
            inputs["docs"],
            place,
            sampled,
        )

    def padding_args(self, key: Key) -> tuple:
        """Arguments of shape `key` over padding only (written into the scratch place), where `run` puts
        its inputs: what a capture runs."""
        bucket, rows, packed, span, _ = key
        blocks, scratch = self.static._blocks(span), self.static.scratch
        if self.slots.contiguous:
            write = [scratch] * packed + [0] * packed
        else:
            write = [scratch * self.slots.block_size + i % self.slots.block_size for i in range(packed)]
        parts = {
            "ids": [PAD_ID] * (bucket + packed),
            "starts": [0] * bucket,
            "rows": [scratch] * (bucket * blocks),
            "positions": [0] * packed,
            "docs": [-1] * packed,
            "write": write,
            "select": [0] * (bucket + rows),
            "slots": [0] * (bucket + rows),
            "draws": [0] * (bucket + rows),
        }
        return self._args(upload(parts, self.static.device, into=self.inputs), key)

    def _forward(self, ids, starts, where, span, positions, docs, place, sampled) -> None:  # type: ignore[no-untyped-def]
        """The captured region: the running rows' decode part and the packed prompts in one forward, the LM
        head and the sampler over the sampled rows, into `tokens` and `logprobs`."""
        static = self.static
        assert static.sampling is not None
        bucket, cache = starts.shape[0], self.slots.cache
        decode = CachedBatch(starts, 1, cache, where, key_len=span, attention=static.attention_for(1))
        batch = MixedBatch(
            [(decode, bucket, 1), (PackedBatch(positions, docs, place, cache), 1, docs.numel())]
        )
        select, slots, draws, ops = sampled
        hidden = static.model.hidden_cached(ids[None], batch, select=select)
        logits = static.model.logits(hidden.view(select.shape[0], -1)).float()
        tokens, logprobs = sample(logits, static.sampling.gather(slots, draws, ops))
        self.tokens[: select.shape[0]].copy_(tokens)
        self.logprobs[: select.shape[0]].copy_(logprobs)

    def _execute(self, key: Key, args: tuple) -> None:
        self.ran.add(key)
        if not self.static.capture:
            self._forward(*args)
            return
        self._drop_stale()
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(args)
        graph.replay()

    @torch.inference_mode()
    def ensure_captured(self, key: Key) -> bool:
        """Capture shape `key` over padding if it is not yet (True if it captured): the engine calls this
        before the step's clock starts, so a capture is its own trace event."""
        if not self.static.capture:
            return False
        self._drop_stale()
        if key in self.graphs:
            return False
        self.graphs[key] = self._capture(self.padding_args(key))
        return True

    def _drop_stale(self) -> None:
        cache_ptr = self.slots.cache.k[0].data_ptr()
        if cache_ptr != self._captured_over:  # a grown pool: graphs captured over the old one are stale
            self.graphs.clear()
            self._captured_over = cache_ptr

    def _capture(self, args: tuple) -> torch.cuda.CUDAGraph:
        graph = capture(self._forward, args, self.static._pool)  # in the decode graphs' memory pool
        self.static._pool = graph.pool()
        return graph
