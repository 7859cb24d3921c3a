"""Loading a model for inference from the CLI: the embedded default when none is given, one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbench.errors import UserError


def resolve_model_dir(model_dir: str | Path | None) -> Path:
    """What `--model` names (rlbench.models.resolve_model): a directory, a model name, or None for the
    embedded default model (shipped; checked against its SHA-256 on load)."""
    from rlbench.models import resolve_model

    return resolve_model(model_dir)


def load_model_and_tokenizer(
    model_dir: str | Path | None, device: str = "cpu", dtype: str = "auto"
) -> tuple[Any, Any]:
    from reference_trainer.model.loader import ModelLoadError, load_model
    from reference_trainer.model.tokenizer import load_tokenizer

    path = resolve_model_dir(model_dir)
    try:
        model = load_model(path, device=device, dtype=dtype)
        tokenizer = load_tokenizer(path)
    except (ModelLoadError, FileNotFoundError, ValueError) as err:
        raise UserError(str(err).splitlines()[0]) from None
    return model, tokenizer
