"""The model runner: turns scheduled sequences into batched forwards over the KV cache."""

from __future__ import annotations

import torch

from reference_trainer.config import EngineConfig
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.sequence import Sequence
from reference_trainer.model import DecoderLM

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

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """Feed each sequence's newest token: [B, V] logits, rows in the order of `seqs` (sorted by slot)."""
        slots = [s.slot for s in seqs]
        lo, hi = slots[0], slots[-1] + 1
        if len(seqs) * 2 >= hi - lo:
            # Packed slots: run the whole slot range as a view of the cache; idle slots get a dummy token.
            tokens, starts = [PAD_ID] * (hi - lo), [0] * (hi - lo)
            for seq in seqs:
                tokens[seq.slot - lo], starts[seq.slot - lo] = seq.all_ids[-1], seq.length - 1
            logits = self.model.forward_cached(
                self._long(tokens)[:, None],
                self._long(starts),
                self.slots.cache,
                torch.arange(lo, hi, device=self.device),
                contiguous=True,
            )[:, 0]
            logits = logits[self._long([s - lo for s in slots])]
        else:
            logits = self.model.forward_cached(
                self._long([s.all_ids[-1] for s in seqs])[:, None],
                self._long([s.length - 1 for s in seqs]),
                self.slots.cache,
                self._long(slots),
            )[:, 0]
        for seq in seqs:
            seq.num_cached = seq.length
        return logits

    @torch.inference_mode()
    def extend(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> torch.Tensor:
        """Append several tokens per sequence in one forward (speculative verification): [B, Qmax, V].

        The tokens are written into the cache but `num_cached` is left to the caller, who rolls back
        rejected positions simply by not counting them.
        """
        return self.model.forward_cached(
            self._tensor(new_tokens),
            self._long([s.num_cached for s in seqs]),
            self.slots.cache,
            self._long([s.slot for s in seqs]),
        )
