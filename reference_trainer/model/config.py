"""The model's architecture, read from and written to Hugging Face config.json."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
MAX_DIM = 1 << 20  # vocabularies reach ~256k, widths ~32k, depths ~100: beyond this it is not a real config
MAX_CONTEXT = 1 << 24
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class ModelConfig:
    """Architecture of a Llama/Qwen2-family decoder; field names follow Hugging Face config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # QKV bias (Qwen2 has it; Llama does not by default)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    architecture: str = "LlamaForCausalLM"
    torch_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """The config a Hugging Face config.json describes, checked first (`check_hf_dict`): a wrong type or
        range is a ValueError naming the first bad field, before any tensor is built."""
        check_hf_dict(raw)
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        # transformers >= 5 keeps RoPE settings in `rope_parameters`; older configs: rope_theta/rope_scaling.
        rope_params = raw.get("rope_parameters") or {}
        rope_theta = rope_params.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_scaling = raw.get("rope_scaling")
        if rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) == "default":
            rope_scaling = None
        bias = raw.get("attention_bias", arch == "Qwen2ForCausalLM")
        # Fields read as they are, at the dataclass's default when absent (check_hf_dict required the sizes).
        as_is = {*SIZES, "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps"}
        as_is |= {"bos_token_id", "eos_token_id"}
        return cls(
            **{f.name: raw.get(f.name, f.default) for f in fields(cls) if f.name in as_is},
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            attention_bias=bool(bias),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            architecture=arch,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        arch = raw.pop("architecture")
        raw["architectures"] = [arch]
        raw["model_type"] = {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}.get(arch, "llama")
        raw["hidden_act"] = "silu"
        if raw["rope_scaling"] is None:
            raw.pop("rope_scaling")
        return raw

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf_dict(read_json(path))


def check_hf_dict(raw: Any) -> None:
    """Refuse a config.json whose shape fields a decoder cannot be built from, naming the first bad field."""
    if not isinstance(raw, dict):
        raise ValueError(f"config.json is a JSON {type(raw).__name__}, not an object")
    archs = raw.get("architectures")
    if archs is not None and not (
        isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)
    ):
        raise ValueError(f"architectures is {archs!r}, not a list of names")
    for name in SIZES:
        if name not in raw:
            raise ValueError(f"{name} is missing")
        _size(raw, name, MAX_DIM)
    heads = raw["num_attention_heads"]
    kv_heads = (
        _size(raw, "num_key_value_heads", MAX_DIM) if raw.get("num_key_value_heads") is not None else heads
    )
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if raw.get("head_dim") is not None:
        _size(raw, "head_dim", MAX_DIM)
    elif raw["hidden_size"] % heads:
        raise ValueError(f"hidden_size {raw['hidden_size']} is not a multiple of num_attention_heads {heads}")
    if raw.get("max_position_embeddings") is not None:
        _size(raw, "max_position_embeddings", MAX_CONTEXT)
    for name in ("rms_norm_eps", "rope_theta"):
        value = raw.get(name)
        if value is not None and not (_number(value) and value > 0):
            raise ValueError(f"{name} is {value!r}, not a positive number")
    for name in ("rope_scaling", "rope_parameters"):
        if raw.get(name) is not None and not isinstance(raw[name], dict):
            raise ValueError(f"{name} is {raw[name]!r}, not an object")
    for name in ("bos_token_id", "eos_token_id"):
        value = raw.get(name)
        for token in value if isinstance(value, list) else [] if value is None else [value]:
            if type(token) is not int or not 0 <= token < raw["vocab_size"]:
                raise ValueError(f"{name} is {value!r}, not a token id below vocab_size {raw['vocab_size']}")


def _size(raw: dict[str, Any], name: str, most: int) -> int:
    value = raw[name]
    if type(value) is not int or not 1 <= value <= most:
        raise ValueError(f"{name} is {value!r}, not an integer in 1..{most}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
