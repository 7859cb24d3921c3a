"""The model runner: turns scheduled sequences into batched forwards over the KV cache."""

from __future__ import annotations

import torch

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sequence import Sequence
from reference_trainer.model.decoder import DecoderLM

PAD_ID = 0  # any valid id: padded positions are never read


class ModelRunner:
    def __init__(self, model: DecoderLM, config: EngineConfig, slots: SlotManager) -> None:
        self.model = model
        self.config = config
        self.slots = slots
        self.device = next(model.parameters()).device

    def _tensor(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor(
            [r + [PAD_ID] * (width - len(r)) for r in rows], dtype=torch.long, device=self.device
        )

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Write each sequence's uncached tokens (prompt, plus response when resuming) into its slot;
        returns the logits after its last token: [B, V]."""
        rows = [s.all_ids[s.num_cached :] for s in seqs]
        logits = self.model.forward_cached(
            self._tensor(rows),
            self._long([s.num_cached for s in seqs]),
            self.slots.cache,
            self._long([s.slot for s in seqs]),
            select=self._long([len(r) - 1 for r in rows]),
        )
        for seq in seqs:
            seq.num_cached = seq.length
        return logits[:, 0]

    def _forward_rows(self, seqs: list[Sequence], rows: list[list[int]], starts: list[int]) -> torch.Tensor:
        """One forward continuing each sequence's row at its start position: [B, Qmax, V] in `seqs` order."""
        slots = [s.slot for s in seqs]
        lo, hi = min(slots), max(slots) + 1
        if len(seqs) * 2 < hi - lo:  # sparse slots: gather just their cache rows
            return self.model.forward_cached(
                self._tensor(rows), self._long(starts), self.slots.cache, self._long(slots)
            )
        # Packed slots (the allocator keeps them low): run the slot range as a view of the cache; idle
        # slots in it get a dummy row, written where nothing live reads it.
        packed_rows, packed_starts = [[PAD_ID]] * (hi - lo), [0] * (hi - lo)
        for slot, row, start in zip(slots, rows, starts, strict=True):
            packed_rows[slot - lo], packed_starts[slot - lo] = row, start
        logits = self.model.forward_cached(
            self._tensor(packed_rows),
            self._long(packed_starts),
            self.slots.cache,
            torch.arange(lo, hi, device=self.device),
            contiguous=True,
        )
        return logits[self._long([s - lo for s in slots])]

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
