"""Load and save model directories: config.json + *.safetensors (never pickle)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM, rope_inv_freq
from rlbench.records import atomic_path, write_json


class ModelLoadError(ValueError):
    """A model directory that cannot be used; the message is one line for the user."""


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA on a machine without it is a clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device {device!r} requested but CUDA is not available on this machine (use --device cpu)"
        )
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ModelLoadError(f"unknown device {device!r}: {err}") from None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(sorted(table))}")
    return table[dtype]


def read_config(model_dir: str | Path) -> ModelConfig:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory not found: {model_dir}")
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{model_dir} has no config.json: not a model directory")
    try:
        return ModelConfig.from_hf_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ModelLoadError(f"invalid config.json in {model_dir}: {err}") from None


def read_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            # Read into memory rather than load_file's memory map: the mapped pages would stay resident
            # (and count) beside the fused and packed copies the engine makes of the same weights.
            state.update(load(file.read_bytes()))
        except (SafetensorError, OSError) as err:
            raise ModelLoadError(f"cannot read {file}: {err}") from None
    return state


def load_model(model_dir: str | Path, device: str = "cpu", dtype: str = "auto") -> DecoderLM:
    """Build the decoder from a HF-style directory; parameter names must match exactly."""
    config = read_config(model_dir)
    torch_device = resolve_device(device)
    with torch.device("meta"):  # no random init to overwrite: the checkpoint's tensors are adopted below
        model = DecoderLM(config)
    state = read_state_dict(model_dir)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    unexpected = {k for k in unexpected if not k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ModelLoadError(
            f"weights in {model_dir} do not match the config: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.load_state_dict(state, strict=False, assign=True)  # one copy of the weights in memory, not two
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config)  # a computed buffer, not in the checkpoint
    return model.to(device=torch_device, dtype=resolve_dtype(dtype, torch_device)).eval()


def save_model(model: DecoderLM, model_dir: str | Path) -> Path:
    """Write config.json and model.safetensors, each atomically."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with atomic_path(model_dir / "model.safetensors") as tmp:  # safetensors writes the temp file itself
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_json(model_dir / "config.json", model.config.to_hf_dict())
    return model_dir
