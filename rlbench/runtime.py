"""Loading a model for inference from the CLI: the embedded default when none is given, one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbench.errors import UserError


def resolve_model_dir(model_dir: Path | None) -> Path:
    """The given directory, or the embedded default model (built on first use)."""
    if model_dir is not None:
        return Path(model_dir)
    from rlbench.training import ensure_default_model

    return ensure_default_model()


def load_model_and_tokenizer(
    model_dir: Path | None, device: str = "cpu", dtype: str = "auto"
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
