"""`rlbench eval` and `rlbench suites`: math / logic benchmarks with math-verify, avg@k / pass@k / maj@k."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reference_trainer.errors import MAX_THREADS, Interrupted, UserError, check_integer
from rlbench.options import DataDir, Device, Engine, ModelDir, Seed, Threads


def eval_command(
    suite: Annotated[str, typer.Option("--suite", help="Suite name (see `rlbench suites`).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Run directory (default runs/eval-SUITE).")
    ] = None,
    model: ModelDir = None,
    samples: Annotated[int, typer.Option("--samples", "-k", help="Samples per problem (K).")] = 1,
    data_dir: DataDir = None,
    template: Annotated[
        str,
        typer.Option(
            "--template", help="auto (model's chat template if any, else the suite's), chat, math, kk."
        ),
    ] = "auto",
    engine: Engine = "reference",
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature (0 = greedy).")
    ] = 0.6,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")] = 0.95,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Max response tokens.")] = 1024,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N problems.")] = None,
    device: Device = "auto",
    threads: Threads = None,
    seed: Seed = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Discard earlier progress in --out.")
    ] = False,
) -> None:
    """Evaluate a model on a suite; resumable (re-run the same command to continue)."""
    from dataclasses import replace

    from reference_trainer.engine.factory import check_engine_kind
    from rlbench.eval.runner import PROGRESS_FILE, REPORT_FILE, RESULTS_FILE, EvalConfig, plan_eval, run_eval
    from rlbench.models import EMBEDDED_NOTE, is_embedded, resolve_model
    from rlbench.rundirs import claim

    check_engine_kind(engine)  # before the embedded model is built
    cfg = EvalConfig(
        suite=suite,
        model="",  # filled in once every other input has been checked
        engine=engine,
        samples=samples,
        template=template,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
    )
    # Options, suite and data are checked (and the data read) before the model is resolved: resolving a
    # model name can mean reading hundreds of megabytes, wasted on a typo.
    plan = plan_eval(cfg, data_dir, limit)
    if threads is not None:
        check_integer("--threads", threads, low=1, high=MAX_THREADS)
    out = out or Path("runs") / f"eval-{suite}"
    import torch  # the heavy imports, once every input has been checked

    from reference_trainer.model.loader import resolve_device, resolve_threads
    from rlbench.eval import backends
    from rlbench.report.eval_report import write_eval_report

    resolve_device(device)  # --device cuda without a GPU: one line, before the run directory exists
    torch.set_num_threads(resolve_threads(threads))
    with claim(out, "eval", accepts=("eval",)):  # one writer, into an evaluation (or a new folder)
        # A directory, a model name, or the embedded default model (shipped, checked against its SHA-256).
        model = resolve_model(model)
        if is_embedded(model):
            typer.echo(f"note: {EMBEDDED_NOTE}", err=True)
        cfg = replace(cfg, model=str(model.resolve()))
        try:
            results = run_eval(
                cfg,
                lambda: backends.make_backend(engine, model, device, seed),
                out,
                overwrite=overwrite,
                plan=plan,
            )
        except KeyboardInterrupt:
            kept = f"{out / PROGRESS_FILE} keeps every finished problem"
            raise Interrupted(f"interrupted: {kept}; the same command continues where it stopped") from None
        write_eval_report(Path(out) / REPORT_FILE, results)
    k = results["samples"]
    typer.echo(
        f"{results['suite']}: {results['problems_evaluated']} problems, avg@{k} {results['accuracy']:.4f}, "
        f"pass@{k} {results['pass_at_k'][str(k)]:.4f}, maj@{k} {results['maj_at_k'][str(k)]:.4f}"
        + (f", {results['grading_failures']} grading failures" if results["grading_failures"] else "")
    )
    typer.echo(f"wrote {Path(out) / RESULTS_FILE} and {Path(out) / REPORT_FILE}")


def suites_command(data_dir: DataDir = None) -> None:
    """List the evaluation suites with their sizes and sources."""
    from rich.console import Console
    from rich.table import Table

    from rlbench.eval.suites import suite_sizes

    if data_dir is not None and not data_dir.is_dir():
        raise UserError(f"data dir not found: {data_dir}")
    table = Table("suite", "title", "size", "grader", "source")
    for row in suite_sizes(data_dir):
        table.add_row(row["suite"], row["title"], str(row["size"]), row["grader"], row["source"])
    Console(width=160).print(table)
