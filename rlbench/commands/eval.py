"""`rlbench eval` and `rlbench suites`: math / logic benchmarks with math-verify, avg@k / pass@k / maj@k."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reference_trainer.errors import MAX_THREADS, Interrupted, UserError, check_integer
from rlbench.options import DataDir, Device, Engine, ModelDir, Seed, Threads

if TYPE_CHECKING:
    from rlbench.eval.runner import EvalPlan


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
    from reference_trainer.engine.factory import check_engine_kind
    from rlbench.eval.runner import EvalConfig, plan_eval
    from rlbench.eval.suite_file import Group
    from rlbench.eval.suites import group_members, resolve

    check_engine_kind(engine)  # before the embedded model is built
    if threads is not None:
        check_integer("--threads", threads, low=1, high=MAX_THREADS)
    include = include_path or []
    grouped = isinstance(resolve(suite, include), Group)  # a group's suites each run in OUT/<suite>
    members = group_members(suite, include)
    # Options, suites and data are checked (and the data read) before the model is resolved: resolving a
    # model name can mean reading hundreds of megabytes, wasted on a typo.
    plans = [
        plan_eval(
            EvalConfig(suite=str(member.path) if grouped else suite, model="", engine=engine, samples=samples,
                       template=template, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                       seed=seed),
            data_dir, limit, include,
        )
        for member in members
    ]  # fmt: skip
    out = out or Path("runs") / f"eval-{Path(suite).stem}"
    for plan in plans:
        _evaluate(plan, model, out / plan.suite.name if grouped else out, device, threads, overwrite)


def _evaluate(plan: EvalPlan, model: Path | None, out: Path, device: str, threads: int | None,
              overwrite: bool) -> None:  # fmt: skip
    """One suite's run: the model resolved and built, the suite run, its results and page written."""
    from dataclasses import replace

    import torch  # the heavy imports, once every input has been checked

    from reference_trainer.model.loader import resolve_device, resolve_threads
    from reference_trainer.trace.locks import run_lock
    from rlbench.eval import backends
    from rlbench.eval.runner import PROGRESS_FILE, REPORT_FILE, RESULTS_FILE, run_eval
    from rlbench.models import EMBEDDED_NOTE, is_embedded, resolve_model
    from rlbench.report.eval_report import write_eval_report

    resolve_device(device)  # --device cuda without a GPU: one line, before the run directory exists
    torch.set_num_threads(resolve_threads(threads))
    with run_lock(out):  # one writer: a second eval (or train, profile) on --out is refused
        # A directory, a model name, or the embedded default model (shipped, checked against its SHA-256).
        path = resolve_model(model)
        if is_embedded(path):
            typer.echo(f"note: {EMBEDDED_NOTE}", err=True)
        cfg = replace(plan.config, model=str(path.resolve()))
        plan = replace(plan, config=cfg)
        try:
            results = run_eval(
                cfg,
                lambda: backends.make_backend(cfg.engine, path, device, cfg.seed),
                out,
                overwrite=overwrite,
                plan=plan,
            )
        except KeyboardInterrupt:
            kept = f"{out / PROGRESS_FILE} keeps every finished problem"
            raise Interrupted(f"interrupted: {kept}; the same command continues where it stopped") from None
        write_eval_report(Path(out) / REPORT_FILE, results)
    k = results["samples"]
    figures = {
        "avg@k": f"avg@{k} {results['accuracy']:.4f}",
        "pass@k": f"pass@{k} {results['pass_at_k'][str(k)]:.4f}",
        "maj@k": f"maj@{k} {results['maj_at_k'][str(k)]:.4f}",
    }
    typer.echo(
        f"{results['suite']}: {results['problems_evaluated']} problems, "
        + ", ".join(figures[m] for m in plan.suite.metrics)
        + (f", {results['grading_failures']} grading failures" if results["grading_failures"] else "")
    )
    typer.echo(f"wrote {Path(out) / RESULTS_FILE} and {Path(out) / REPORT_FILE}")


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
        table.add_row(row["suite"], row["title"], str(row["size"]), row["grader"], row["source"])
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
            typer.echo(f"{file}: {problem}", err=True)
        if not problems:
            typer.echo(f"{file}: ok")
        bad += bool(problems)
    if bad:
        raise UserError(f"{bad} of {len(files)} suite file(s) have problems")
