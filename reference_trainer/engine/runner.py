"""The model runner: turns scheduled sequences into batched forwards over the KV cache (kv_cache.py).

Every forward takes its inputs from one upload (transfers.py) and hands the sampler device tensors only:
the logits of the rows to sample, each row's slot and the position of the token drawn from it (`Scored`);
a decode forward on the graph path samples inside its graph and hands over the tokens instead.
Nothing in a decode or verify forward reads a device value back: what the forward needs to know about its
shape (the key span, the slot range) the host already knows. On CUDA, decode and verify forwards run at
static shapes, captured as CUDA graphs (graphs.py; `EngineConfig.cuda_graphs`); prefill stays eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sampler import SamplerOps, SlotParams
from reference_trainer.engine.sequence import Sequence
from reference_trainer.engine.transfers import PAD_ID, padded, upload
from reference_trainer.model.attention import CachedBatch, resolve_attention
from reference_trainer.model.decoder import DecoderLM


@dataclass
class Scored:
    """The rows a step samples from, in sequence order (a verified sequence has one row per position)."""

    logits: torch.Tensor | None  # [N, V] float32; None when `sampled`
    slots: torch.Tensor | None  # [N] long: the slot of each row's sequence
    positions: torch.Tensor | None  # [N] long: the position, in its sequence, of the token drawn from the row
    drafts: torch.Tensor | None = None  # [N] long (extend): the input token after the row, -1 after the last
    sampled: tuple[torch.Tensor, torch.Tensor] | None = None  # (tokens, log-probs) a decode graph drew


class ModelRunner:
    def __init__(
        self, model: DecoderLM, config: EngineConfig, slots: SlotManager, sampling: SlotParams | None = None
    ) -> None:
        """`sampling`: the engine's per-slot sampling table, which the graph path's decode samples from."""
        self.model = model
        self.config = config
        self.slots = slots
        self.device = next(model.parameters()).device
        self.attention = resolve_attention(config.attention, self.device)  # decode and verify forwards
        # Forwards at their own shapes (prefill, and decode without graphs) vary with every batch: compiled
        # flex would compile each shape (flex.py), so on CUDA they attend with SDPA's fused kernel instead.
        compiled_flex = self.attention == "flex" and self.device.type == "cuda"
        self.own_shape_attention = "sdpa" if compiled_flex else self.attention
        self.static: StaticForward | None = None  # the graph path (graphs.py); None: own-shape forwards
        if config.cuda_graphs and self.device.type == "cuda":
            self.static = StaticForward(
                model, slots, config.max_verify_tokens, True, self.attention, sampling=sampling
            )

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> Scored:
        """Store each sequence's uncached tokens (prompt, plus response when resuming); one row per
        sequence: the logits after its last token."""
        rows = [s.all_ids[s.num_cached :] for s in seqs]
        starts = [s.num_cached for s in seqs]
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        lengths = [len(r) for r in rows]
        width = max(lengths)
        # A shorter row's padding is written at the row's own next positions, reserved for it (as decode and
        # verify do), where nothing reads it before a real token overwrites it: no mask of real tokens, whose
        # boolean indexing would make the host wait for the device. Only where that room would pass a
        # sequence's length does the prefill mask its padding instead (host-known, rare).
        masked = min(lengths) != width and max(starts) + width > self.slots.max_len
        for slot, row, start in zip(slots, rows, starts, strict=True):
            self.slots.reserve(slot, start + (len(row) if masked else width))
        parts = {
            "ids": padded(rows, width),
            "starts": starts,
            "rows": self.slots.where(slots),
            "select": [n - 1 for n in lengths],
            "slots": slots,
            "positions": [s.length for s in seqs],
        }
        if masked:
            parts["num_new"] = lengths
        inputs = upload(parts, self.device)
        batch = CachedBatch(
            inputs["starts"],
            width,
            self.slots.cache,
            self._rows(inputs["rows"], len(seqs)),
            num_new=inputs["num_new"] if masked else None,
            key_len=max(starts) + width,
            attention=self.own_shape_attention,  # applies to short prefills (width <= attention.SMALL_Q)
        )
        logits = self.model.forward_cached(
            inputs["ids"].view(len(seqs), width), batch, select=inputs["select"]
        )
        for seq in seqs:
            seq.num_cached = seq.length
        return Scored(logits[:, 0], inputs["slots"], inputs["positions"])

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], ops: SamplerOps | None = None) -> Scored:
        """Feed each sequence's newest token; one row per sequence (sampled already on the graph path, with
        the sequences' sampler ops: `ops` where the caller has them)."""
        static = self.static
        if static is not None and static.sampling is not None and static.fits(len(seqs), 1):
            slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
            starts = [s.num_cached for s in seqs]
            ends = [start + 1 for start in starts]  # also the position of the token each row draws
            self.slots.reserve_each(slots, ends)
            ops = ops or SamplerOps.of([s.params for s in seqs])
            sampled = static.decode([s.last_token for s in seqs], starts, slots, ends, ops)
            scored = Scored(None, None, None, sampled=sampled)
        else:
            scored = self._continue(seqs, [[s.last_token] for s in seqs], verify=False)
        for seq in seqs:
            seq.num_cached = seq.length
        return scored

    @torch.inference_mode()
    def extend(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> Scored:
        """Append several tokens per sequence in one forward (speculative verification): one row per new
        token, with `drafts` set.

        The tokens are written into the cache but `num_cached` is left to the caller, who rolls back
        rejected positions simply by not counting them.
        """
        return self._continue(seqs, new_tokens, verify=True)

    def _continue(self, seqs: list[Sequence], rows: list[list[int]], verify: bool) -> Scored:
        """One forward continuing each sequence at its first uncached position with its row of tokens.

        Rows are right-padded to the widest, and the padding is written into the cache like real tokens:
        at the row's own next positions, which nothing reads before a real token overwrites them (as for
        rejected drafts). Each row reserves room for the padding, so no write needs a mask."""
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        starts = [s.num_cached for s in seqs]
        width = max(len(r) for r in rows)
        self.slots.reserve_each(slots, [start + width for start in starts])
        if width == 1:  # a decode step: one sampled row per sequence, in order (the host's hot path)
            sample = {"slots": slots, "positions": [start + 1 for start in starts]}
            order = list(range(len(rows)))
        else:
            sample = {
                "slots": [slot for slot, row in zip(slots, rows, strict=True) for _ in row],
                "positions": [
                    start + j + 1 for start, row in zip(starts, rows, strict=True) for j in range(len(row))
                ],
            }
            # Which of the forward's [rows x width] outputs each sampled row is (none needed when all are).
            order = [b * width + j for b, row in enumerate(rows) for j in range(len(row))]
        if verify:
            sample["drafts"] = [t for row in rows for t in row[1:] + [-1]]
        if self.static is not None and self.static.fits(len(rows), width):
            hidden, inputs = self.static.run(rows, starts, slots, {"index": order, **sample})
            flat = hidden.view(-1, hidden.shape[-1])
            picked = flat[: len(rows)] if width == 1 else flat[inputs["index"]]
            logits = self.model.logits(picked).float()
        else:
            logits, inputs = self._eager(rows, starts, slots, width, order, sample)
        return Scored(logits, inputs["slots"], inputs["positions"], inputs.get("drafts"))

    def _eager(
        self,
        rows: list[list[int]],
        starts: list[int],
        slots: list[int],
        width: int,
        order: list[int],
        sample: dict[str, list[int]],
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The forward at the step's own shape: over the packed range of slots [lo, hi) in the contiguous
        layout when the batch fills at least half of it (attention then reads the cache as a view), else
        over the batch's rows."""
        lo, hi = min(slots), max(slots) + 1
        if self.slots.contiguous and len(rows) * 2 >= hi - lo:
            # Idle slots in the range get a dummy row at position 0 of their own slot, which nothing reads.
            packed: list[list[int]] = [[PAD_ID]] * (hi - lo)
            packed_starts = [0] * (hi - lo)
            for slot, row, start in zip(slots, rows, starts, strict=True):
                packed[slot - lo], packed_starts[slot - lo] = row, start
            if width == 1:  # a decode step (the host's hot path)
                order = [slot - lo for slot in slots]
            else:
                order = [
                    (slot - lo) * width + j
                    for slot, row in zip(slots, rows, strict=True)
                    for j in range(len(row))
                ]
            rows, starts, where, slot_range = packed, packed_starts, [], (lo, hi)
        else:
            where, slot_range = self.slots.where(slots), None
        needs_order = order != list(range(len(rows) * width))
        inputs = upload(
            {"ids": padded(rows, width), "starts": starts, "rows": where, **sample}
            | ({"order": order} if needs_order else {}),
            self.device,
        )
        batch = CachedBatch(
            inputs["starts"],
            width,
            self.slots.cache,
            torch.arange(lo, hi, device=self.device) if slot_range else self._rows(inputs["rows"], len(rows)),
            contiguous=slot_range is not None,
            key_len=max(starts) + width,
            slot_range=slot_range,
            attention=self.own_shape_attention,
        )
        logits = self.model.forward_cached(inputs["ids"].view(len(rows), width), batch).view(
            len(rows) * width, -1
        )
        return (logits[inputs["order"]] if needs_order else logits), inputs

    def _rows(self, where: torch.Tensor, batch: int) -> torch.Tensor:
        return where if self.slots.contiguous else where.view(batch, -1)
