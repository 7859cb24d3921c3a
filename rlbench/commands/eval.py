"""`rlbench eval` and `rlbench suites`: math / logic benchmarks with math-verify, avg@k / pass@k / maj@k."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import UserError, printable
from rlbench.options import DataDir, Device, Engine, ModelDir, Seed, Threads, echo

SuiteSpec = Annotated[
    str,
    typer.Option(
        "--suite",
        help="A suite or group name (see `rlbench suites`), or a suite file (YAML or JSON; docs/eval.md).",
    ),
]
IncludePath = Annotated[
    list[Path] | None,
    typer.Option(
        "--include-path", help="A folder of your own suite files, searched before the built-in ones."
    ),
]


def eval_command(
    suite: SuiteSpec,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Run directory (default runs/eval-SUITE; a group's in OUT/SUITE)."),
    ] = None,
    model: ModelDir = None,
    samples: Annotated[
        int | None, typer.Option("--samples", "-k", help="Samples per problem (K). Default: the suite's.")
    ] = None,
    data_dir: DataDir = None,
    include_path: IncludePath = None,
    template: Annotated[
        str,
        typer.Option(
            "--template", help="auto (model's chat template if any, else the suite's), chat, math, kk."
        ),
    ] = "auto",
    engine: Engine = "reference",
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="Sampling temperature (0 = greedy). Default: the suite's (0.6)."),
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", help="Nucleus sampling mass. Default: the suite's (0.95).")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Max response tokens. Default: the suite's (1024).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N problems.")] = None,
    device: Device = "auto",
    threads: Threads = None,
    seed: Seed = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Discard earlier progress in --out.")
    ] = False,
) -> None:
    """Evaluate a model on a suite (or each suite of a group); resumable (re-run the same command)."""
    from rlbench.eval.runner import REPORT_FILE, RESULTS_FILE, EvalConfig
    from rlbench.evaluate import EvalJob, evaluate

    settings = EvalConfig(suite=suite, engine=engine, samples=samples, template=template,
                          temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)  # fmt: skip
    job = EvalJob(settings, model=model, out=out, data_dir=data_dir, include=include_path or [], limit=limit,
                  device=device, threads=threads, overwrite=overwrite)  # fmt: skip
    for results in evaluate(job, say=lambda line: echo(printable(line), err=True)):
        k, run = results["samples"], Path(results["out"])
        figures = {
            "avg@k": f"avg@{k} {results['accuracy']:.4f}",
            "pass@k": f"pass@{k} {results['pass_at_k'][str(k)]:.4f}",
            "maj@k": f"maj@{k} {results['maj_at_k'][str(k)]:.4f}",
        }
        failures = results["grading_failures"]
        echo(
            f"{results['suite']}: {results['problems_evaluated']} problems, "
            + ", ".join(figures[m] for m in results["metrics"])
            + (f", {failures} grading failures" if failures else "")
        )
        echo(f"wrote {run / RESULTS_FILE} and {run / REPORT_FILE}")


def suites_command(ctx: typer.Context, data_dir: DataDir = None, include_path: IncludePath = None) -> None:
    """List the evaluation suites and groups with their sizes and sources; `validate` checks suite files."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console
    from rich.table import Table

    from rlbench.eval.suites import check_data_dir, suite_sizes

    if data_dir is not None:
        check_data_dir(data_dir)
    table = Table("suite", "title", "size", "grader", "source")
    for row in suite_sizes(data_dir, include_path or []):
        # a suite's title comes from its file: control bytes are shown, not sent to the terminal
        table.add_row(*(printable(str(row[k])) for k in ("suite", "title", "size", "grader", "source")))
    Console(width=160).print(table)


def validate_command(
    files: Annotated[list[Path], typer.Argument(help="Suite or group files (YAML or JSON).")],
    data_dir: DataDir = None,
    include_path: IncludePath = None,
) -> None:
    """Check suite files before any model loads: keys, values, the prompt, the grader, the data.
    One line per problem; exit 2 when there is any."""
    from rlbench.eval.suites import validate

    bad = 0
    for file in files:
        problems = validate(file, data_dir, include_path or [])
        for problem in problems:
            echo(printable(f"{file}: {problem}", newlines=False), err=True)
        if not problems:
            echo(printable(f"{file}: ok", newlines=False))
        bad += bool(problems)
    if bad:
        raise UserError(f"{bad} of {len(files)} suite file(s) have problems")


def download_command(
    names: Annotated[list[str], typer.Argument(help="Suite or group names (`rlbench suites`), or files.")],
    to: Annotated[Path, typer.Option("--to", help="The data dir to write (what --data-dir then reads).")],
    include_path: IncludePath = None,
) -> None:
    """On a connected machine: write each suite's data from the hub into DIR, one JSONL file per suite (its
    data.file), exactly what `--data-dir DIR` reads on a machine without the network."""
    from rlbench.eval.suites import download

    for suite, path, rows in download(names, to, include_path or []):
        echo(f"{suite.name}: {rows} problems -> {path}")
