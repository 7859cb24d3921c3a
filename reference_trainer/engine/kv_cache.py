"""Slots of the preallocated KV cache: which sequence lives where.

Every sequence owns one slot (max_model_len positions) from admission to finish. The lowest free slot is
handed out first so live slots stay packed at the bottom, which lets a decode step read the cache as one
contiguous view instead of gathering rows.
"""

from __future__ import annotations

import heapq

import torch

from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import KVCache


class SlotManager:
    def __init__(
        self, config: ModelConfig, capacity: int, max_len: int, device: torch.device, dtype: torch.dtype
    ):
        self.cache = KVCache(config, capacity, max_len, device, dtype)
        self.capacity = capacity
        self._free = list(range(capacity))
        heapq.heapify(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV-cache slot")
        return heapq.heappop(self._free)

    def release(self, slot: int) -> None:
        heapq.heappush(self._free, slot)
