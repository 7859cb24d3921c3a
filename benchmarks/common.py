"""What the benchmarks share: which model to run on."""

from __future__ import annotations

import tempfile
from pathlib import Path


def resolve_model(arg: str | None) -> tuple[Path, str]:
    """`arg` as a model dir or name (`rlbench models list`); None: the shipped embedded model; "random": a
    random model of the embedded shape. Returns the directory and a label saying which."""
    import torch

    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.embedded import default_model_dir, label
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer
    from reference_trainer.train.recipe import RECIPE

    if arg and arg != "random":
        from rlbench.models import resolve_model as resolve_name  # a directory or a model name

        return resolve_name(arg), arg
    if arg is None:
        return default_model_dir(), label()  # names the recipe version and the weights' hash
    path = Path(tempfile.mkdtemp()) / "random"
    torch.manual_seed(0)
    save_model(DecoderLM(RECIPE.model), path)
    CharTokenizer().save(path)
    return path, "random model with the embedded shape (--model random)"
