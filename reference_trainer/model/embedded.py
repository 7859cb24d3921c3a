"""The embedded default model, shipped inside the package: a small character-level decoder that the
recipe in train/recipe.py trains (`rlbench embedded build`). Its files sit in `model/weights/`, with the
SHA-256 of each in `SHA256SUMS`; every load checks them, so a corrupted or swapped file is an error that
names it, never a silently different model. Nothing is trained on first use.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from reference_trainer.errors import ModelLoadError
from reference_trainer.trace.records import read_json, write_text

WEIGHTS_PACKAGE = "reference_trainer.model"
WEIGHTS_DIR = "weights"
CHECKSUMS = "SHA256SUMS"
FILES = ("config.json", "model.safetensors", "char_tokenizer.json")  # what SHA256SUMS covers
CARD = "card.json"  # the recipe's measured targets (not part of the model; not checksummed)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(directory: Path) -> Path:
    """SHA256SUMS for the model files in `directory`, in sha256sum's format (`sha256sum -c` reads it)."""
    lines = "".join(f"{sha256(directory / name)}  {name}\n" for name in FILES)
    write_text(directory / CHECKSUMS, lines)
    return directory / CHECKSUMS


def recorded_sums(directory: Path) -> dict[str, str]:
    """File name -> SHA-256 as SHA256SUMS records them ({} when it is missing)."""
    sums = directory / CHECKSUMS
    if not sums.is_file():
        return {}
    return dict(reversed(line.split(None, 1)) for line in sums.read_text().splitlines() if line.strip())


def verify(directory: Path) -> Path:
    """`directory` if each model file matches its recorded SHA-256; else ModelLoadError naming the file."""
    sums = directory / CHECKSUMS
    if not sums.is_file():
        raise ModelLoadError(f"{sums} is missing: the embedded model cannot be checked")
    expected = recorded_sums(directory)
    for name in FILES:
        path = directory / name
        if not path.is_file():
            raise ModelLoadError(f"embedded model file {path} is missing; reinstall rlbench")
        if sha256(path) != expected.get(name):
            raise ModelLoadError(
                f"embedded model file {path} does not match its SHA-256 in {CHECKSUMS} (corrupted or "
                "replaced); reinstall rlbench, or rebuild it with `rlbench embedded build --install`"
            )
    return directory


def shipped_dir() -> Path:
    """Where the shipped files are (a plain directory: the package is installed unzipped)."""
    return Path(str(resources.files(WEIGHTS_PACKAGE) / WEIGHTS_DIR))


def default_model_dir() -> Path:
    """The embedded model's directory, checked against its SHA-256 sums (3.4 MB: milliseconds)."""
    return verify(shipped_dir())


def label() -> str:
    """How results name the shipped weights: recipe version and model.safetensors' SHA-256 prefix, so numbers
    measured on different shipped weights are never mistaken for each other."""
    directory = shipped_dir()
    digest = recorded_sums(directory).get("model.safetensors", "unknown")[:12]
    card = directory / CARD
    version = read_json(card).get("recipe_version", "?") if card.is_file() else "?"  # shipped: checksummed
    return f"embedded (recipe v{version}, sha256 {digest})"
