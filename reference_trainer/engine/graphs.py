"""Decode and verify forwards at static shapes, replayed as CUDA graphs on the GPU.

A decode step of a small model is hundreds of short kernels; launched one by one from Python the GPU idles
between them. nano-vllm's model runner (`capture_cudagraph`) captures its decode forward once per batch-size
bucket and replays it. The same idea over this engine's cached forward (model/decoder.py `hidden_cached`):

* the shape of a forward is (batch bucket, width, key span): the batch padded to a bucket (1, 2, 4, ...,
  and the slot capacity last), the width the step's tokens per row (1 for decode, 1 + drafts for verify),
  the key span a power of two from MIN_KEY_SPAN up to the cache's length covering every row's positions;
* every input (token ids, start positions, slots or block tables) is written in place into one persistent
  device buffer, in the step's one upload together with the sampler's per-row values (transfers.py);
  rows that only pad the batch write their K/V into the cache's scratch slot or block (kv_cache.py);
* a decode forward (`decode`, given the engine's per-slot sampling table) holds the whole step: the LM
  head over every row of the bucket and the sampler (sampler.py, keyed by slot and position, so a padding
  row's draw changes no real row's), writing tokens and log-probs into persistent buffers; outside the graph
  a step is its one upload and its one read-back. The sampler's optional ops (temperature, top-k, top-p,
  greedy rows: `SamplerOps`) are part of the captured shape;
* a verify forward ends at the final norm and copies the hidden states into a persistent buffer; the LM
  head runs eagerly over the rows that are sampled (runner.py), and `Engine.verify`'s accept/reject rule
  after it.

Every decode shape of a batch's sampler ops is captured when the engine first decodes with them, before
that step (`capture_decode`, over padding rows, recorded as the trace's `capture` event, which no metric
counts); a verify shape just before its first use, as its own `capture` event (`ensure_captured`, called by
`Engine.verify`). A shape first met elsewhere is captured when it runs (a warm-up run, which does the step's
real work, then the capture, then a replay that writes the same K/V again). A grown paged pool is a new
tensor, so the graphs captured over the old one are dropped and recaptured; so under graphs the engine
preallocates the whole pool (kv_cache.py `preallocate`), and only a pool too big for half the free memory
still grows. With `capture=False` the same static forward runs eagerly: what the CPU tests compare with the
engine's own-shape forward, and on CUDA what graphs are compared with.
"""

from __future__ import annotations

from typing import Any

import torch

from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sampler import SamplerOps, SlotParams, sample
from reference_trainer.engine.transfers import PAD_ID, padded, upload
from reference_trainer.model.attention import CachedBatch
from reference_trainer.model.decoder import DecoderLM

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_KEY_SPAN = 64
VERIFY_WIDTHS = (2, 3, 5, 9, 17)  # a verify of q drafts runs at the first of these >= q + 1 (capped)


def batch_buckets(capacity: int) -> list[int]:
    """The padded batch sizes: powers of two below the capacity, then the capacity (a full batch is never
    padded)."""
    return [b for b in BATCH_BUCKETS if b < capacity] + [capacity]


Shape = tuple[int, int, int, SamplerOps | None]  # (bucket, width, key span, sampler ops of a decode)


class StaticForward:
    def __init__(
        self,
        model: DecoderLM,
        slots: SlotManager,
        max_width: int,
        capture: bool,
        attention: str = "matmul",
        sampling: SlotParams | None = None,
    ) -> None:
        """`sampling`: the engine's per-slot sampling table; with it `decode` samples inside the graph."""
        self.model, self.slots, self.capture, self.sampling = model, slots, capture, sampling
        self.scratch = slots.ensure_scratch()  # where padding rows write their K/V
        self.attention = attention  # model/attention.py IMPLEMENTATIONS: every path is static-shape
        self.device = next(model.parameters()).device
        self.buckets = batch_buckets(slots.capacity)
        self.max_width = max_width
        most = self.buckets[-1] * max_width  # rows of the widest forward
        # Inputs, then the sampler's per-row values: index, slot, position and draft of each sampled row.
        self.inputs = torch.zeros(
            most + self.buckets[-1] * (1 + self._blocks(self.limit)) + 4 * most,
            dtype=torch.long,
            device=self.device,
        )
        dtype = next(model.parameters()).dtype
        self.hidden = torch.zeros(most, model.config.hidden_size, dtype=dtype, device=self.device)
        # what a sampling decode forward writes: one token and its log-prob per row of the bucket
        self.tokens = torch.zeros(self.buckets[-1], dtype=torch.long, device=self.device)
        self.logprobs = torch.zeros(self.buckets[-1], dtype=torch.float32, device=self.device)
        self.graphs: dict[Shape, torch.cuda.CUDAGraph] = {}
        self._pool: object = None
        self._captured_over = 0  # data pointer of the cache the graphs write (a grown pool is a new one)
        # Shapes prepared before a run (`prepare`: captured, or with capture=False only listed) and shapes
        # run since: what tests/test_static_forward.py holds to "nothing is captured inside a timed step".
        self.prepared: set[Shape] = set()
        self.ran: set[Shape] = set()

    @classmethod
    def eager(cls, engine: Any, attention: str) -> StaticForward:
        """An engine's static-shape forward as the runner builds it on CUDA, run eagerly (no capture): the
        shapes a GPU replays, on any device."""
        width = engine.config.max_verify_tokens
        return cls(engine.model, engine.slots, width, False, attention, sampling=engine.sampling)

    @property
    def limit(self) -> int:
        """The longest key span: the cache's positions per sequence."""
        if self.slots.contiguous:
            return self.slots.max_len
        return self.slots.blocks_per_slot * self.slots.block_size

    def _blocks(self, span: int) -> int:
        return 1 if self.slots.contiguous else span // self.slots.block_size

    def bucket(self, batch: int) -> int:
        """The padded batch size a forward of `batch` rows runs at."""
        return next(b for b in self.buckets if b >= batch)

    def fits(self, batch: int, width: int) -> bool:
        return batch <= self.buckets[-1] and width <= self.max_width

    def width_bucket(self, width: int) -> int:
        """The padded width a forward of `width` tokens per row runs at: 1 for decode; a verify's padded up
        the VERIFY_WIDTHS (its padding is written at each row's own next positions, never sampled)."""
        if width == 1:
            return 1
        return min(next((w for w in VERIFY_WIDTHS if w >= width), self.max_width), self.max_width)

    def attention_for(self, width: int) -> str:
        """The attention of a forward `width` tokens per row: the engine's choice, except that compiled
        flex (flex.py: one compile per shape) runs decode only; a verify runs SDPA's fused kernel, so the
        compiles a run needs are one per batch bucket."""
        return "sdpa" if self.attention == "flex" and width > 1 else self.attention

    def span(self, longest: int, width: int = 1) -> int:
        """The key span of a forward `width` tokens per row whose rows reach position `longest` - 1: a power
        of two; for flex decode the whole cache (flex visits only each row's own blocks, whatever the table
        width, and one span is one compile per batch bucket instead of one per span)."""
        if self.attention_for(width) == "flex":
            return self.limit
        span = MIN_KEY_SPAN
        while span < longest:
            span *= 2
        return min(span, self.limit)

    def run(
        self, rows: list[list[int]], starts: list[int], slots: list[int], extras: dict[str, list[int]]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Hidden states [bucket, width, H] of rows continuing at `starts` in `slots` (padding rows past
        len(rows)), and `extras` uploaded with the inputs, as device views."""
        bucket = self.bucket(len(rows))
        width = self.width_bucket(max(len(r) for r in rows))
        span = self.span(max(starts) + width, width)
        pad = bucket - len(rows)
        blocks = self._blocks(span)
        where = self.slots.where(slots, blocks) + [self.scratch] * (pad * blocks)
        ids = padded(rows, width) + [PAD_ID] * (pad * width)
        inputs = upload(
            {"ids": ids, "starts": starts + [0] * pad, "rows": where, **extras}, self.device, into=self.inputs
        )
        self._execute((bucket, width, span, None), self._args(inputs, bucket, width, span))
        return self.hidden[: bucket * width].view(bucket, width, -1), inputs

    def decode(
        self, tokens: list[int], starts: list[int], slots: list[int], positions: list[int], ops: SamplerOps
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step, sampled: each row feeds `tokens[i]` at `starts[i]` in `slots[i]` and draws the
        token at `positions[i]`; returns the drawn tokens and their log-probs ([len(tokens)] device views)."""
        n, bucket = len(tokens), self.bucket(len(tokens))
        span = self.span(max(starts) + 1, 1)
        pad, blocks = bucket - n, self._blocks(span)
        parts = {
            "ids": tokens + [PAD_ID] * pad,
            "starts": starts + [0] * pad,
            "rows": self.slots.where(slots, blocks) + [self.scratch] * (pad * blocks),
            "slots": slots + [0] * pad,  # a padding row samples with slot 0's settings; nothing reads it
            "positions": positions + [0] * pad,
        }
        inputs = upload(parts, self.device, into=self.inputs)
        self._execute((bucket, 1, span, ops), self._args(inputs, bucket, 1, span, ops))
        return self.tokens[:n], self.logprobs[:n]

    def _args(
        self,
        inputs: dict[str, torch.Tensor],
        bucket: int,
        width: int,
        span: int,
        ops: SamplerOps | None = None,
    ) -> tuple:
        """`_forward`'s arguments from the uploaded inputs: a sampling decode's (`ops` given) end with its
        slots, positions and ops."""
        where = inputs["rows"] if self.slots.contiguous else inputs["rows"].view(bucket, self._blocks(span))
        args = (inputs["ids"].view(bucket, width), inputs["starts"], where, span)
        return args if ops is None else (*args, (inputs["slots"], inputs["positions"], ops))

    def _execute(self, shape: Shape, args: tuple) -> None:
        self.ran.add(shape)
        if self.capture:
            self._replay(shape, args)
        else:
            self._forward(*args)

    def spans(self, width: int = 1) -> list[int]:
        """Every key span a forward of `width` tokens per row can have: powers of two from MIN_KEY_SPAN,
        then the cache's limit (flex decode: the limit only)."""
        if self.attention_for(width) == "flex":
            return [self.limit]
        spans = [MIN_KEY_SPAN]
        while spans[-1] < self.limit:
            spans.append(min(spans[-1] * 2, self.limit))
        return spans

    def padding_args(self, bucket: int, width: int, span: int, ops: SamplerOps | None = None) -> tuple:
        """Forward arguments of shape (bucket, width, span) over padding rows only, which write nothing
        but the scratch slot or block; the inputs where `run` and `decode` put them (ids, starts, rows, then
        a decode's slots and positions lead the input buffer), since a captured graph reads those addresses
        on every replay."""
        blocks = self._blocks(span)
        parts = {
            "ids": [PAD_ID] * (bucket * width),
            "starts": [0] * bucket,
            "rows": [self.scratch] * (bucket * blocks),
        }
        if ops is not None:
            parts |= {"slots": [0] * bucket, "positions": [0] * bucket}
        return self._args(upload(parts, self.device, into=self.inputs), bucket, width, span, ops)

    def shapes(self, ops: SamplerOps | None, verify: bool) -> list[Shape]:
        """Every shape a run's decode steps can take (each batch bucket and key span; sampling with `ops`,
        or without a sampling table ending at the hidden states) and, with `verify`, every verify shape
        (each bucket, verify width and span)."""
        ops = ops if self.sampling is not None else None
        widths = [1] + (sorted({self.width_bucket(w) for w in VERIFY_WIDTHS}) if verify else [])
        return [
            (bucket, width, span, ops if width == 1 else None)
            for width in widths
            for bucket in self.buckets
            for span in self.spans(width)
        ]

    @torch.inference_mode()  # as every engine forward: a capture outside it records autograd state (and
    # compiled flex, seeing inputs that require grad, refuses a block mask built for inference only)
    def prepare(self, ops: SamplerOps | None, verify: bool = False) -> int:
        """Capture every shape a run can take (`shapes`) now, before its first timed step, so that no
        timed step pays a capture or, on CUDA with flex, a compile. Returns the number of graphs captured
        (none with capture=False, which only lists the shapes in `prepared`)."""
        shapes = self.shapes(ops, verify)
        self.prepared.update(shapes)
        if not self.capture:
            return 0
        self._drop_stale()
        before = len(self.graphs)
        for shape in shapes:
            if shape not in self.graphs:
                self._replay(shape, self.padding_args(*shape))
        return len(self.graphs) - before

    def compile_keys(self) -> set[tuple[int, int, int, int, str]]:
        """The compiled-flex shapes of every shape prepared or run: (bucket, width, table blocks, pool
        size, the model's dtype). Compiled flex compiles once per such key in a process (flex.py; its
        compiled function is one per process, whichever engine calls it), so the keys of every engine of a
        process, together, are its compile count."""
        pool = self.slots.cache.num_blocks if not self.slots.contiguous else self.slots.capacity + 1
        dtype = str(next(self.model.parameters()).dtype)
        return {
            (bucket, width, self._blocks(span), pool, dtype)
            for bucket, width, span, _ in self.prepared | self.ran
            if self.attention_for(width) == "flex"
        }

    def decode_graph_missing(self, batch: int, longest: int, ops: SamplerOps) -> bool:
        """Whether a decode of `batch` rows reaching position `longest` - 1 with sampler ops `ops` would
        run a shape not captured yet (ops not prepared for, or after a grown pool dropped the graphs)."""
        if not self.capture:
            return False
        self._drop_stale()
        ops_or_none = ops if self.sampling is not None else None
        return (self.bucket(batch), 1, self.span(longest, 1), ops_or_none) not in self.graphs

    @torch.inference_mode()
    def ensure_captured(self, batch: int, width: int, longest: int) -> bool:
        """Capture the shape a verify of `batch` rows of `width` tokens reaching position `longest` - 1
        will run at, if it is not yet captured (not prepared for); True if it captured. The engine's verify
        calls this before timing its forward, so such a capture is its own trace event."""
        if not self.capture or not self.fits(batch, width):
            return False
        width = self.width_bucket(width)
        shape = (self.bucket(batch), width, self.span(longest, width), None)
        self._drop_stale()
        if shape in self.graphs:
            return False
        self._replay(shape, self.padding_args(*shape))
        return True

    def _forward(
        self,
        ids: torch.Tensor,
        starts: torch.Tensor,
        where: torch.Tensor,
        span: int,
        sampled: tuple[torch.Tensor, torch.Tensor, SamplerOps] | None = None,
    ) -> None:
        """The captured region. `sampled` (a decode: slots, positions, ops): then the LM head over every
        row and the sampler, into `tokens` and `logprobs`; else the hidden states, into `hidden`."""
        width = ids.shape[1]
        batch = CachedBatch(
            starts, width, self.slots.cache, where, key_len=span, attention=self.attention_for(width)
        )
        hidden = self.model.hidden_cached(ids, batch)
        if sampled is None:
            self.hidden[: ids.numel()].view_as(hidden).copy_(hidden)
            return
        assert self.sampling is not None
        slots, positions, ops = sampled
        logits = self.model.logits(hidden.view(ids.shape[0], -1)).float()
        tokens, logprobs = sample(logits, self.sampling.gather(slots, positions, ops))
        self.tokens[: ids.shape[0]].copy_(tokens)
        self.logprobs[: ids.shape[0]].copy_(logprobs)

    def _drop_stale(self) -> None:
        """Forget the graphs captured over an older cache: first use, or the paged pool grew (new tensors)."""
        cache_ptr = self.slots.cache.k[0].data_ptr()
        if cache_ptr != self._captured_over:
            self.graphs.clear()
            self._pool, self._captured_over = None, cache_ptr

    def _replay(self, shape: Shape, args: tuple) -> None:
        self._drop_stale()
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self.graphs[shape] = self._capture(args)
        graph.replay()

    def _capture(self, args: tuple) -> torch.cuda.CUDAGraph:
        graph = capture(self._forward, args, self._pool)  # one memory pool shared by every shape
        self._pool = graph.pool()
        return graph


def capture(forward: Any, args: tuple, pool: object) -> torch.cuda.CUDAGraph:
    """`forward(*args)` as a CUDA graph captured in memory pool `pool` (None: a new one). Warmed up first on a
    side stream (lazy initialisations must not happen inside a capture), as PyTorch's CUDA graph notes
    prescribe; the warm-up does the step's real work."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        forward(*args)
    return graph
