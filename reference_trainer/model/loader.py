"""Load and save model directories: config.json + *.safetensors (never pickle)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from reference_trainer.errors import ModelLoadError, UserError
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM, rope_inv_freq
from reference_trainer.trace.records import make_dir, read_json, write_json, write_safetensors


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA on a machine without it is a clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device {device!r} requested but CUDA is not available on this machine (use --device cpu)"
        )
    try:
        found = torch.device(device)
    except RuntimeError as err:
        raise ModelLoadError(f"unknown device {device!r}: {err}") from None
    if found.type not in ("cpu", "cuda", "mps"):  # meta holds no data; others are not built for here
        raise ModelLoadError(f"device {device!r}: rlbench runs on cpu, cuda or mps")
    return found


def resolve_threads(threads: int | None) -> int:
    """torch's CPU threads: `threads`, or by default every usable core but one (at least one). More threads
    than free cores make OpenMP's spinning workers wait on each other whenever another process shares the
    CPU: on 2 cores beside one busy process, 3 GRPO steps of the embedded model took 25 s on 2 threads and
    13 s on 1; alone, 9 s on 2 (docs/benchmarks.md, Threads)."""
    if threads is not None:
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16")}
    table |= {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
        raw = read_json(path)  # the project's one JSON reader: a malformed file is one line naming it
    except UserError as err:
        raise ModelLoadError(str(err)) from None  # a ValueError too, as callers of load_model catch
    try:
        return ModelConfig.from_hf_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        raise ModelLoadError(f"{path}: {err}") from None


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


def tensor_shapes(model_dir: str | Path) -> dict[str, tuple[tuple[int, ...], Path]]:
    """name -> (shape, file) of every tensor in the directory's *.safetensors, read from their headers
    alone (no tensor data). A tensor that is not floating point (int8, bool, I32 weights) is refused here:
    cast silently, it would load and then fail hundreds of frames deep in the first forward."""
    from safetensors import SafetensorError, safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} has no *.safetensors weights")
    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for file in files:
        try:
            # Opened here first: safetensors reports a file it may not read as "No such file or directory"
            # (a checkpoint another user wrote 0600); the OS's own error names the real cause.
            with open(file, "rb"):
                pass
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    tensor = handle.get_slice(name)
                    if tensor.get_dtype() not in FLOAT_DTYPES:
                        raise ModelLoadError(f"{file}: {name} is {tensor.get_dtype()}, not floating point")
                    shapes[name] = (tuple(tensor.get_shape()), file)
        except OSError as err:
            raise ModelLoadError(f"cannot read {file}: {err.strerror or err}") from None
        except SafetensorError as err:
            raise ModelLoadError(f"cannot read {file}: {err}") from None
    return shapes


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the weight types a model may hold


def load_model(model_dir: str | Path, device: str = "cpu", dtype: str = "auto") -> DecoderLM:
    """Build the decoder from a HF-style directory; parameter names must match exactly, and every tensor's
    shape must be the one config.json implies (checked from the files' headers before any data is read)."""
    config = read_config(model_dir)
    torch_device = resolve_device(device)
    with torch.device("meta"):  # no random init to overwrite: the checkpoint's tensors are adopted below
        model = DecoderLM(config)
    expected = {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if not (config.tie_word_embeddings and k == "lm_head.weight")
    }
    found = {k: v for k, v in tensor_shapes(model_dir).items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        found.pop("lm_head.weight", None)
    missing, unexpected = expected.keys() - found.keys(), found.keys() - expected.keys()
    if missing or unexpected:
        raise ModelLoadError(
            f"weights in {model_dir} do not match the config: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    for name in sorted(expected):
        shape, file = found[name]
        if shape != expected[name]:
            raise ModelLoadError(
                f"{file}: {name} has shape {list(shape)}, where config.json implies {list(expected[name])}"
            )
    state = read_state_dict(model_dir)
    for name, tensor in state.items():  # a NaN weight reaches the sampler as an index past the vocabulary
        if not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(
                f"{found.get(name, (None, model_dir))[1]}: {name} holds NaN or infinite values"
            )
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=False, assign=True)  # one copy of the weights in memory, not two
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config)  # a computed buffer, not in the checkpoint
    return model.to(device=torch_device, dtype=resolve_dtype(dtype, torch_device)).eval()


def save_model(model: DecoderLM, model_dir: str | Path) -> Path:
    """Write config.json and model.safetensors, each atomically."""
    model_dir = Path(model_dir)
    make_dir(model_dir)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    write_safetensors(model_dir / "model.safetensors", state, metadata={"format": "pt"})
    write_json(model_dir / "config.json", model.config.to_hf_dict())
    return model_dir
