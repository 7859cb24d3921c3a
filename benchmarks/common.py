"""What the benchmarks share: which model to run on."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def resolve_model(arg: str | None) -> tuple[Path, str]:
    """`arg` as a model dir or name (`rlbench models list`); None: the embedded default when built, else
    (or with "random") a random model of the embedded shape. Returns the directory and a label saying
    which."""
    import torch

    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.embedded import MODEL_CONFIG, default_model_dir
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer

    if arg and arg != "random":
        from rlbench.models import resolve_model as resolve_name  # a directory or a model name

        return resolve_name(arg), arg
    embedded = default_model_dir(build=False)
    if arg is None and (embedded / "config.json").is_file():
        return embedded, f"embedded default model ({embedded.name})"
    path = Path(tempfile.mkdtemp()) / "random"
    torch.manual_seed(0)
    save_model(DecoderLM(MODEL_CONFIG), path)
    CharTokenizer().save(path)
    why = "--model random" if arg else "embedded model not built yet"
    return path, f"random model with the embedded shape ({why})"
