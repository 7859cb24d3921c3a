"""A GGUF file (llama.cpp's format) in, a normal Hugging Face model directory out (its files:
docs/smollm2.md).

transformers' GGUF loader does the conversion: `gguf` dequantizes, transformers reverses llama.cpp's Q/K
row permutation and rebuilds the `tokenizers` tokenizer from the GGUF metadata. This module checks the
file first (magic, truncation, architecture, quant types), so a bad file fails in one line before the slow
part, and it publishes the directory atomically: a failure (disk full, no permission) leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import (
    replace_dir,
    temp_beside,
    write_json,
    write_safetensors,
    write_text,
)

GGUF_EXTRA = "pip install 'rlbench[gguf]'"
# GGUF architecture -> the Hugging Face class our decoder implements (and transformers' GGUF loader knows).
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SOURCE_FILE = "rlbench_source.json"  # where an imported directory came from (shown by `models list`)
_MAGIC = b"GGUF"


class GGUFImportError(ValueError):
    """A GGUF file that cannot be imported, or a missing dependency; the message is one line."""


@dataclass
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    quant_types: dict[str, int]  # tensor type name -> tensor count
    num_params: int


def require_gguf_support() -> None:
    """gguf, accelerate and transformers importable, or one line saying how to install them."""
    missing = [m for m in ("gguf", "accelerate", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise GGUFImportError(
            f"importing a GGUF file needs {', '.join(missing)}; the one step left: {GGUF_EXTRA}, then run "
            "this command again (it imports the model into the cache on first use)"
        )


def supported_quant_types() -> set[str]:
    """The tensor types `gguf` can dequantize: float32/16 as they are, plus its quantization codecs."""
    from gguf.quants import _type_traits  # the codec table; no public accessor exists

    return {"F32", "F16"} | {t.name for t in _type_traits}


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read a GGUF file's header and tensor table, and refuse what the import could not convert."""
    path = Path(path)
    if not path.is_file():
        raise GGUFImportError(f"GGUF file not found: {path}")
    with open(path, "rb") as fh:
        if fh.read(4) != _MAGIC:
            raise GGUFImportError(f"{path} is not a GGUF file (no GGUF magic at the start)")
    require_gguf_support()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as err:  # what a cut-off header or table raises
        raise GGUFImportError(f"{path} is truncated or corrupt ({type(err).__name__}: {err})") from None
    size = path.stat().st_size
    if any(t.data_offset + t.n_bytes > size for t in reader.tensors):
        raise GGUFImportError(f"{path} is truncated: its tensor data runs past the end of the file")
    arch = _field_text(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"{path}: unsupported architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    types = Counter(t.tensor_type.name for t in reader.tensors)
    if unsupported := sorted(set(types) - supported_quant_types()):
        raise GGUFImportError(f"{path}: unsupported tensor type(s) {', '.join(unsupported)}")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=_field_text(reader, "general.name") or path.stem,
        quant_types=dict(types),
        num_params=sum(int(t.n_elements) for t in reader.tensors),
    )


def _field_text(reader: Any, key: str) -> str:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return ""
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def convert_gguf(
    source: str | Path | GGUFInfo, out_dir: str | Path, on_phase: Callable[[str], None] | None = None
) -> Path:
    """Convert a GGUF file (a path, or what `inspect_gguf` read from it) into the model directory
    `out_dir`, published atomically: an older directory there is replaced only once the new one is
    complete."""
    info = source if isinstance(source, GGUFInfo) else inspect_gguf(source)
    out_dir = Path(out_dir)
    say = on_phase or (lambda _msg: None)
    tmp = temp_beside(out_dir, f".tmp{os.getpid()}")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        build_directory(info, tmp, say)
        replace_dir(tmp, out_dir)
    except OSError as err:  # disk full, no permission: one line, and no half-written model
        raise GGUFImportError(f"cannot write {out_dir}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def build_directory(info: GGUFInfo, out: Path, say: Callable[[str], None]) -> None:
    """Write the model directory's files into `out` (created; the caller publishes it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # keep the progress bar, drop the "some keys were not parsed" notes
    hf_logging.enable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    where, name = str(info.path.parent), info.path.name
    say(f"reading the tokenizer of {name}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name, local_files_only=True)
        say(f"dequantizing {info.num_params / 1e6:.1f}M parameters ({_types_text(info)})")
        model = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, local_files_only=True, dtype=torch.float32
        )
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as err:
        raise GGUFImportError(f"{info.path}: transformers cannot convert it: {_first_line(err)}") from None
    say("writing config.json, model.safetensors and the tokenizer")
    _write_weights(model, out)
    write_json(out / "config.json", _hf_config(model, info))
    write_json(out / "generation_config.json", _generation_config(model))
    _write_tokenizer(tokenizer, out)
    write_json(
        out / SOURCE_FILE,
        {
            "gguf": str(info.path.resolve()),
            "bytes": info.path.stat().st_size,
            "tensor_types": info.quant_types,
        },
    )


def _types_text(info: GGUFInfo) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(info.quant_types.items(), key=lambda kv: -kv[1]))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _write_weights(model: Any, out: Path) -> None:
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # one copy of the shared matrix, as HF checkpoints store it
        state.pop("lm_head.weight", None)
    write_safetensors(out / "model.safetensors", state, metadata={"format": "pt"})


def _hf_config(model: Any, info: GGUFInfo) -> dict[str, Any]:
    raw = model.config.to_dict()
    # GGUF-loading leftovers and transformers' generic defaults, which say nothing about this model.
    noise = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")
    noise += ("id2label", "label2id", "problem_type", "return_dict", "output_hidden_states")
    noise += ("output_attentions", "chunk_size_feed_forward", "is_encoder_decoder")
    for key in noise:
        raw.pop(key, None)
    raw["architectures"] = [ARCHITECTURES[info.architecture]]
    raw["dtype"] = raw["torch_dtype"] = "float32"
    return raw


def _generation_config(model: Any) -> dict[str, Any]:
    cfg = model.config
    return {k: getattr(cfg, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def _write_tokenizer(tokenizer: Any, out: Path) -> None:
    """tokenizer.json from `tokenizers`, and one tokenizer_config.json holding the chat template (rather
    than transformers' separate chat_template.jinja), so the directory has one place for each."""
    write_text(out / "tokenizer.json", tokenizer.backend_tokenizer.to_str(pretty=True))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if (value := getattr(tokenizer, key, None)) is not None:
            config[key] = str(value)
    if isinstance(template := getattr(tokenizer, "chat_template", None), str) and template:
        config["chat_template"] = template
    write_json(out / "tokenizer_config.json", config)
