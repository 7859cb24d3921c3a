"""Training checkpoints: a usable model directory plus optimizer and loop state, written atomically.

A checkpoint is `checkpoints/step-NNNNNN/` holding config.json, model.safetensors and the tokenizer (so
`rlbench eval --model` can point at it), and trainer/ with optimizer.safetensors (+ its JSON scalars) and
trainer_state.json, kept in a subfolder so the model directory holds only the model's weights.
It is built in a temporary directory and renamed into place; `checkpoints/latest` is rewritten last, so a
kill at any moment leaves the previous checkpoint intact. Nothing is pickled.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import UserError
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import save_model
from reference_trainer.trace.records import (
    make_dir,
    read_json,
    replace_dir,
    write_json,
    write_safetensors,
    write_text,
)

KEEP = 2  # checkpoints kept on disk


def optimizer_tensors(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state_dict into safetensors-able tensors and JSON-able scalars."""
    tensors, scalars = {}, {"param_groups": state["param_groups"], "state": {}}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars["state"].setdefault(str(idx), {})[key] = value
    return tensors, scalars


def optimizer_state(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, entry in scalars["state"].items():
        state.setdefault(int(idx), {}).update(entry)
    return {"state": state, "param_groups": scalars["param_groups"]}


def save_checkpoint(
    root: Path,
    step: int,
    model: DecoderLM,
    tokenizer: Any,
    optimizer: dict[str, Any],
    trainer_state: dict[str, Any],
) -> Path:
    if root.is_symlink():  # its old checkpoints are pruned below: never in a folder outside the run
        raise UserError(f"{root}: is a symlink; a run's checkpoints must be its own folder (remove it)")
    make_dir(root)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model(model, tmp)
        tokenizer.save(tmp)
        tensors, scalars = optimizer_tensors(optimizer)
        (tmp / "trainer").mkdir()
        write_safetensors(tmp / "trainer" / "optimizer.safetensors", tensors)
        write_json(tmp / "trainer" / "optimizer.json", scalars)
        write_json(tmp / "trainer" / "trainer_state.json", {"step": step, **trainer_state})
        replace_dir(tmp, final)  # replaces the step's older copy when a step is redone after a resume
    finally:  # a failed write (disk full) leaves no half checkpoint behind; the previous one stays
        shutil.rmtree(tmp, ignore_errors=True)
    write_text(root / "latest", final.name + "\n")
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "trainer" / "trainer_state.json").is_file() else None


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimizer state_dict, trainer_state); the weights are loaded with loader.load_model(path)."""
    from safetensors.torch import load_file

    state_dir = path / "trainer"
    optimizer = optimizer_state(
        load_file(str(state_dir / "optimizer.safetensors")),
        read_json(state_dir / "optimizer.json"),
    )
    return optimizer, read_json(state_dir / "trainer_state.json")
