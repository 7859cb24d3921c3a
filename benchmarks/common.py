"""What the benchmarks share: which model to run on."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


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


def hf_generate(model: Any, prompts: list[list[int]], max_tokens: int, eos_id: int | None, stop: bool) -> Any:
    """A transformers model's batched `generate` of the prompts (left-padded with 0), plain sampling at
    temperature 1; rows stop at `eos_id` when `stop`, else run `max_tokens`. The generated tokens."""
    import torch

    width = max(map(len, prompts))
    device = next(model.parameters()).device
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            min_new_tokens=0 if stop else max_tokens,
            eos_token_id=eos_id,
            pad_token_id=0,
        )
    return out[:, width:]
