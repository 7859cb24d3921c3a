"""The engine's configuration and a request's sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_trainer.errors import MAX_SEED, UserError, check_integer, check_temperature, check_top_p

# How decode and verify forwards attend over the KV cache (model/attention.py IMPLEMENTATIONS, plus auto).
# Named here rather than imported so that checking a config loads no torch.
ATTENTION = ("auto", "matmul", "sdpa", "flex")


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

    def check(self) -> SamplingParams:
        """Self, if every number is finite and in range; else a one-line UserError naming the option (a NaN
        temperature would sample nothing, a seed past int64 would fail in torch's generator)."""
        check_temperature("--temperature", self.temperature)
        check_top_p("--top-p", self.top_p)
        check_integer("--top-k", self.top_k, low=0)
        check_integer("--max-tokens", self.max_tokens, low=1)
        if self.seed is not None:
            check_integer("--seed", self.seed, low=0, high=MAX_SEED)
        return self


@dataclass
class EngineConfig:
    """The rollout engine: slot capacity, cache length, device and dtype."""

    max_num_seqs: int = 64  # slot capacity: the most sequences decoding at once
    max_model_len: int = 1024  # prompt + response tokens per sequence
    max_prefill_tokens: int = 8192  # tokens per batched prefill forward
    device: str = "cpu"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    max_verify_tokens: int = 16  # headroom in the cache for multi-token verify forwards
    # Decode and verify forwards at static shapes, replayed as CUDA graphs (engine/graphs.py). Only on
    # CUDA: elsewhere (CPU) every forward runs eagerly at its own shape whatever this says.
    cuda_graphs: bool = True
    # Decode and verify attention (model/attention.py): "matmul" (gather + two matmuls), "sdpa" (gather + one
    # SDPA call) or "flex" (FlexAttention over the paged pool, no gather; compiled on CUDA, eager reference
    # math on CPU: slow there). "auto" is "matmul" on CPU, where it measured fastest (docs/limits.md), and
    # on CUDA too until benchmarks/gpu.py has measured the others there.
    attention: str = "auto"

    def check(self) -> EngineConfig:
        """Self, if the engine can honour its choices; else a one-line UserError naming the setting. (Its
        sizes are checked where the user sets them: TrainConfig.check, the commands' options.)"""
        if self.attention not in ATTENTION:
            raise UserError(
                f"EngineConfig.attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}"
            )
        return self
