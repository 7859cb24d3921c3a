"""The engine's configuration and a request's sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to sample one request. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class EngineConfig:
    """The rollout engine: slot capacity, cache length, device and dtype."""

    max_num_seqs: int = 64  # slot capacity: the most sequences decoding at once
    max_model_len: int = 1024  # prompt + response tokens per sequence
    max_prefill_tokens: int = 8192  # tokens per batched prefill forward
    device: str = "cpu"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    max_verify_tokens: int = 16  # headroom in the cache for multi-token verify forwards
