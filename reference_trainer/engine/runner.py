"""The model runner: turns scheduled sequences into batched forwards over the KV cache (kv_cache.py)."""

from __future__ import annotations

import torch

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sequence import Sequence
from reference_trainer.model.decoder import DecoderLM

PAD_ID = 0  # any valid id: padded columns are computed but never stored


class ModelRunner:
    def __init__(self, model: DecoderLM, config: EngineConfig, slots: SlotManager) -> None:
        self.model = model
        self.config = config
        self.slots = slots
        self.device = next(model.parameters()).device

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _forward_rows(
        self, seqs: list[Sequence], rows: list[list[int]], starts: list[int], select: bool = False
    ) -> torch.Tensor:
        """One forward continuing each sequence's row at its start position: [B, Qmax, V] logits in `seqs`
        order, or [B, 1, V] at each row's last token with `select`."""
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        for slot, row, start in zip(slots, rows, starts, strict=True):
            self.slots.reserve(slot, start + len(row))
        lo, hi = min(slots), max(slots) + 1
        if self.slots.contiguous and not select and len(seqs) * 2 >= hi - lo:
            return self._forward_slot_range(slots, rows, starts, lo, hi)
        lengths = [len(r) for r in rows]
        width = max(lengths)
        return self.model.forward_cached(
            self._padded(rows, width),
            self._long(starts),
            self.slots.cache,
            self.slots.rows(slots),
            num_new=None if min(lengths) == width else self._long(lengths),
            select=self._long([n - 1 for n in lengths]) if select else None,
        )

    def _forward_slot_range(
        self, slots: list[int], rows: list[list[int]], starts: list[int], lo: int, hi: int
    ) -> torch.Tensor:
        """Contiguous layout, slots packed low (the allocator hands out the lowest free one): run every slot
        of [lo, hi) so attention reads the cache as a view. Idle slots in the range get a one-token dummy
        row at position 0 of their own slot, which nothing live reads."""
        packed_rows: list[list[int]] = [[PAD_ID]] * (hi - lo)
        packed_starts = [0] * (hi - lo)
        for slot, row, start in zip(slots, rows, starts, strict=True):
            packed_rows[slot - lo], packed_starts[slot - lo] = row, start
        lengths = [len(r) for r in packed_rows]
        width = max(lengths)
        logits = self.model.forward_cached(
            self._padded(packed_rows, width),
            self._long(packed_starts),
            self.slots.cache,
            torch.arange(lo, hi, device=self.device),
            num_new=None if min(lengths) == width else self._long(lengths),
            contiguous=True,
        )
        return logits[self._long([s - lo for s in slots])]

    def _padded(self, rows: list[list[int]], width: int) -> torch.Tensor:
        flat = [tok for r in rows for tok in r + [PAD_ID] * (width - len(r))]
        return self._long(flat).view(len(rows), width)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Store each sequence's uncached tokens (prompt, plus response when resuming); returns the logits
        after its last token: [B, V]."""
        logits = self._forward_rows(
            seqs, [s.all_ids[s.num_cached :] for s in seqs], [s.num_cached for s in seqs], select=True
        )
        for seq in seqs:
            seq.num_cached = seq.length
        return logits[:, 0]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """Feed each sequence's newest token: [B, V] logits, rows in the order of `seqs`."""
        logits = self._forward_rows(seqs, [[s.all_ids[-1]] for s in seqs], [s.length - 1 for s in seqs])
        for seq in seqs:
            seq.num_cached = seq.length
        return logits[:, 0]

    @torch.inference_mode()
    def extend(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> torch.Tensor:
        """Append several tokens per sequence in one forward (speculative verification): [B, Qmax, V].

        The tokens are written into the cache but `num_cached` is left to the caller, who rolls back
        rejected positions simply by not counting them.
        """
        return self._forward_rows(seqs, new_tokens, [s.num_cached for s in seqs])
