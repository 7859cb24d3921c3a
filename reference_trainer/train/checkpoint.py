"""Training checkpoints: a usable model directory plus optimizer and loop state, written atomically.

A checkpoint is `checkpoints/step-NNNNNN/` holding config.json, model.safetensors and the tokenizer (so
`rlbench eval --model` can point at it), and trainer/ with optimizer.safetensors (+ its JSON scalars) and
trainer_state.json, kept in a subfolder so the model directory holds only the model's weights.
It is built in a temporary directory and renamed into place; `checkpoints/latest` is rewritten last, so a
kill at any moment leaves the previous checkpoint intact. Nothing is pickled.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
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


HISTORY = "rollout_history.safetensors"  # older weights a rollout run ahead still rolls out on


def save_checkpoint(
    root: Path,
    step: int,
    model: DecoderLM,
    tokenizer: Any,
    optimizer: dict[str, Any],
    trainer_state: dict[str, Any],
    history: dict[int, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write checkpoint `step` (see the module docstring). `history`: the older policy versions the next
    steps of a rollout run ahead roll out on (rollout/ahead.py), as {version: weights}."""
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
        if history:
            flat = {
                f"v{v}/{name}": t.contiguous()
                for v, weights in history.items()
                for name, t in weights.items()
            }
            write_safetensors(tmp / "trainer" / HISTORY, flat)
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
    try:
        name = pointer.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{pointer}: not a checkpoint's name ({err}); {REMEDY}") from None
    if not re.fullmatch(r"step-\d{6,}", name):  # written by save_checkpoint: never a path elsewhere
        raise UserError(f"{pointer}: {name[:40]!r} is not a checkpoint's name; {REMEDY}")
    path = root / name
    return path if (path / "trainer" / "trainer_state.json").is_file() else None


REMEDY = "the run's checkpoint is damaged: start again with --overwrite, or restore the file"
# trainer_state.json's fields and what each must be; a checkpoint from this code always passes.
STATE_FIELDS: dict[str, type] = {
    "step": int,
    "policy_version": int,
    "stream": dict,
    "strategy": dict,
    "torch_rng": list,
}


@contextmanager
def restoring(path: Path) -> Iterator[None]:
    """Where a checkpoint is read and applied (weights, optimizer, stream, strategy, RNG): whatever a damaged
    file makes fail (a truncated safetensors, a wrong field, a tensor of the wrong shape or type) is one
    line naming the checkpoint, not a traceback from deep inside torch."""
    try:
        yield
    except UserError as err:
        if str(path) not in str(err):  # not about this checkpoint's files (a device, say): as it is
            raise
        raise UserError(f"{err}; {REMEDY}") from None
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, OverflowError) as err:
        why = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise UserError(f"{path}: cannot restore it ({type(err).__name__}: {why}); {REMEDY}") from None


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimizer state_dict, trainer_state), each checked for the shape the trainer restores; the weights
    are loaded with loader.load_model(path). Call it inside `restoring(path)`."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    state_dir = path / "trainer"
    tensors_file = state_dir / "optimizer.safetensors"
    try:
        tensors = load(tensors_file.read_bytes())
    except (SafetensorError, OSError) as err:
        raise UserError(f"cannot read {tensors_file}: {err}") from None
    if bad := [k for k, v in tensors.items() if not v.is_floating_point() and k.split(".", 1)[-1] != "step"]:
        raise UserError(f"{tensors_file}: {bad[0]} is not a floating-point tensor")
    scalars = read_json(state_dir / "optimizer.json")
    if not (
        isinstance(scalars, dict)
        and isinstance(scalars.get("param_groups"), list)
        and all(isinstance(g, dict) for g in scalars["param_groups"])
        and isinstance(scalars.get("state"), dict)
        and all(isinstance(v, dict) for v in scalars["state"].values())
    ):
        raise UserError(f"{state_dir / 'optimizer.json'}: not an optimizer's state")
    state = read_json(state_dir / "trainer_state.json")
    where = state_dir / "trainer_state.json"
    if not isinstance(state, dict):
        raise UserError(f"{where}: not a trainer's state")
    for field, kind in STATE_FIELDS.items():
        value = state.get(field)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UserError(f"{where}: {field} is {json_type(value)}, not {kind.__name__}")
    rng = state["torch_rng"]
    if len(rng) != len(torch.get_rng_state()) or not all(type(b) is int and 0 <= b < 256 for b in rng):
        raise UserError(f"{where}: torch_rng is not a torch RNG state ({len(rng)} values)")
    if state["step"] < 0 or state["policy_version"] < 0:
        raise UserError(f"{where}: step and policy_version must be >= 0")
    return optimizer_state(tensors, scalars), state


def load_rollout_history(path: Path) -> dict[int, dict[str, torch.Tensor]]:
    """The older policy versions a checkpoint keeps for a rollout run ahead ({} when it keeps none). Call it
    inside `restoring(path)`."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    file = path / "trainer" / HISTORY
    if not (file.exists() or file.is_symlink()):
        return {}  # a run that keeps none; whether one was needed is the rollout's check (ahead.restore)
    if file.is_symlink() or not file.is_file():
        raise UserError(f"{file}: not a regular file (a checkpoint writes its own; was it replaced?)")
    try:
        flat = load(file.read_bytes())
    except (SafetensorError, OSError) as err:
        raise UserError(f"cannot read {file}: {err}") from None
    out: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        version, _, name = key.partition("/")
        if not (version.startswith("v") and version[1:].isdigit() and version[1:].isascii() and name):
            raise UserError(f"{file}: {key!r} is not a kept version's tensor (vN/name)")
        out.setdefault(int(version[1:]), {})[name] = tensor
    return out


def json_type(value: Any) -> str:
    return "missing" if value is None else type(value).__name__
