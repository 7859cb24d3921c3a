"""`rlbench reproduce NAME | --all`: each paper claim beside the measured value, with a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reference_trainer.errors import UserError, missing_module
from rlbench.options import ModelDir, echo

if TYPE_CHECKING:
    from rlbench.reproduce.spec import Spec

QUICK_OUT = Path("runs/reproduce-quick")
RUNS_OUT = Path("runs/reproduce")
REPORTS = Path("reports")  # the committed results, and the README's table: written only when asked


def reproduce_command(
    names: Annotated[
        list[str] | None, typer.Argument(help="Reproductions to run (--list names them).")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Run every reproduction.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the reproductions and their claims.")] = False,
    device: Annotated[
        str, typer.Option("--device", help="auto (cuda when there is a GPU: gpu/ results), cpu or cuda.")
    ] = "auto",
    quick: Annotated[
        bool, typer.Option("--quick", help="CPU-sized versions (a smoke test, not a result).")
    ] = False,
    model: ModelDir = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help=f"Results root (default {RUNS_OUT}, or {QUICK_OUT} with --quick)."),
    ] = None,
    update_reports: Annotated[
        bool,
        typer.Option(
            "--update-reports", help="Write the committed results: reports/ and the README's table."
        ),
    ] = False,
) -> None:
    """Run reproductions: write <out>/<name>/<cpu|gpu>/result.json and report.html, and the index
    <out>/README.md."""
    from rlbench.reproduce.runner import check_names, runnable_here
    from rlbench.reproduce.spec import load_specs

    if list_:
        for name, spec in load_specs().items():
            echo(list_entry(name, spec))
        return
    if all_ == bool(names):
        raise UserError("name reproductions or give --all (not both); --list shows them")
    specs = check_names(list(names or []))
    chosen = list(specs) if all_ else list(names or [])
    device = _device(device)
    root = results_root(out, quick, update_reports)
    chosen, left_out = runnable_here(specs, chosen, all_, device)
    for name in left_out:
        echo(
            f"{name}: a real model at full size, left out on the CPU "
            f"(run it with `rlbench reproduce {name} --device cuda`)"
        )
    failed = run_reproductions(specs, chosen, root, device, quick, str(model) if model else None)
    if failed:
        raise UserError(f"{len(failed)} reproduction(s) failed: {', '.join(failed)}")


def run_reproductions(
    specs: dict[str, Spec], chosen: list[str], root: Path, device: str, quick: bool, model: str | None
) -> list[str]:
    """Run the `chosen` reproductions into `root` (one writer of it: a folder holding another command's
    run is refused), each one's failure said and kept from losing the others' results, then write the
    index. Returns the failed ones."""
    from rlbench.reproduce.index import write_index
    from rlbench.reproduce.runner import reproduce as run_one
    from rlbench.rundirs import claim

    failed = []
    with claim(root, "reproduce", accepts=()):
        for name in chosen:
            echo(f"== {name}")
            try:
                result = run_one(name, specs[name], root, device, quick, model)
            except UserError:
                raise
            except ModuleNotFoundError as err:  # e.g. Ray, which histopipe and scale run workers on
                failed.append(name)
                echo(f"{name}: {missing_module(err.name)}", err=True)
                continue
            except Exception as err:  # one reproduction failing must not lose the others' results
                failed.append(name)
                echo(f"{name}: failed: {type(err).__name__}: {err}", err=True)
                continue
            verdict = f"{result['verdict']} (quick)" if quick else result["verdict"]
            echo(f"{name}: {verdict}: {result['measured'].get('headline', '')}, {result['wall_s']:.0f} s")
        echo(f"index: {write_index(specs, root)}")
    return failed


def _device(device: str) -> str:
    """cpu or cuda: `auto` resolved here; cuda only where a CUDA device is visible."""
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu":
        return device
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible")
    return "cuda" if torch.cuda.is_available() else "cpu"


def results_root(out: Path | None, quick: bool, update_reports: bool) -> Path:
    """Where results go: runs/ unless `update_reports` (the committed reports/ and the README's table, never
    rewritten by a plain run), or `out`."""
    if update_reports and (out is not None or quick):
        raise UserError("--update-reports writes reports/: not with --out, nor with --quick (smoke results)")
    return REPORTS if update_reports else out or (QUICK_OUT if quick else RUNS_OUT)


def list_entry(name: str, spec: Spec, width: int = 100) -> str:
    """One reproduction as `--list` shows it: its name, then the paper's number, where it runs and the
    claim, wrapped to `width` columns under an indent."""
    import textwrap

    where = f"GPU, {spec.model or 'embedded model'}" if spec.needs_gpu else "CPU or GPU, embedded model"
    indent = " " * 4
    body = [f"paper: {spec.paper_value}", f"runs on: {where}", spec.claim]
    wrapped = [textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent) for line in body]
    return "\n".join([name, *wrapped])
