"""`rlbench import verl FILE`, `rlbench import lengths FILE`: another framework's finished run as an rlbench
run folder (trace.jsonl, metrics.json, report.html) with what each mode would buy on its lengths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from rlbench.options import OutDir, SimGpu, SimModelSize, echo, with_options

Slots = Annotated[
    int | None,
    typer.Option(
        "--slots",
        help="Request slots per rollout engine (vLLM's --max-num-seqs). Default: every sample of a step "
        "has its own slot.",
    ),
]
Workers = Annotated[
    str | None,
    typer.Option(
        "--workers",
        help="Worker counts of the what-if replay, comma-separated. Default: those of 1,8,64,512,4096 whose "
        "replayed step stays small for this log (said in the output).",
    ),
]


Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an imported run already in --out.")]


@dataclass(frozen=True)
class ImportOptions:
    """The options every `rlbench import` command takes."""

    slots: Slots = None
    workers: Workers = None
    gpu: SimGpu = "h100"
    model_size: SimModelSize = "7b"
    overwrite: Overwrite = False


def _config(out: Path, o: ImportOptions, inputs: tuple[Path | None, ...]):
    """The checked ImportConfig (-> ImportConfig), after the new-run rule for --out (rlbench/rundirs.py)."""
    from rlbench.integrations.imports import ImportConfig
    from rlbench.rundirs import check_run_dir
    from rlbench.simulate.config import parse_worker_counts

    # the simulator's --workers rule
    counts = parse_worker_counts(o.workers) if o.workers is not None else None
    cfg = ImportConfig(out=out, slots=o.slots, workers=counts, gpu=o.gpu, model_size=o.model_size).check()
    check_run_dir(out, "import", o.overwrite, tuple(p for p in inputs if p is not None))
    return cfg


def _say(doc: dict, out: Path) -> None:
    from rlbench.report.figures import pct

    s, info = doc["summary"], doc["integration"]
    bubble = info.get("bubble_decode_steps", s["bubble_ratio"])
    over = " (over decode steps, rebuilt from the lengths)" if "bubble_decode_steps" in info else ""
    echo(f"{s['steps']} step(s): bubble {pct(bubble)}{over}, tail share {pct(s['tail_time_share'])}")
    rows = doc["integration"].get("per_step") or []
    for key in ("rollout share", "bubble_if_concurrent (lengths)", "bubble_if_concurrent (sample times)"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            echo(f"{key}: {pct(sum(values) / len(values))} (mean over steps, from the framework's log)")
    split = doc["integration"].get("length_variance") or {}
    if split.get("within_share") is not None:
        within, between = pct(split["within_share"]), pct(split["between_share"])
        echo(f"length variance: {within} within prompt groups, {between} between them")
    whatif = doc["whatif"]
    for line in whatif.get("sampling") or []:
        echo(f"what-if: {line}")
    if whatif.get("available"):
        for r in whatif["results"]:
            echo(
                f"predicted W={r['workers']:>5} {r['mode']:<15} bubble {pct(r['bubble_ratio'])}  "
                f"speed-up {r['speedup']:.2f}x"
            )
        if (best := whatif.get("best_dispatch") or {}).get("available"):
            echo(f"predicted best dispatch: {best['line']}")
    echo(f"report: {out / 'report.html'}")


@with_options(ImportOptions, "opts")
def lengths_command(
    file: Annotated[
        Path, typer.Argument(help="Length log JSONL: step, group, response_tokens [, prompt_tokens, worker].")
    ],
    out: OutDir = Path("runs/import-lengths"),
    *,
    opts: ImportOptions,
) -> None:
    """A per-step, per-group length log (from any framework) as an rlbench run: the synchronous baseline's
    bubble at --slots per worker, the within/between-group length variance, and what sorted,
    sorted-partial and histopipe would buy (a replay through the simulator, not a measurement)."""
    from rlbench.integrations.imports import import_lengths

    _say(import_lengths(file, _config(out, opts, (file,))), out)


@with_options(ImportOptions, "opts")
def verl_command(
    file: Annotated[Path, typer.Argument(help="verl's file-logger JSONL ({project}/{experiment}.jsonl).")],
    out: OutDir = Path("runs/import-verl"),
    rollout_dir: Annotated[
        Path | None, typer.Option("--rollout-dir", help="verl's trainer.rollout_data_dir: per-sample texts.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="The run's tokenizer directory (with --rollout-dir).")
    ] = None,
    *,
    opts: ImportOptions,
) -> None:
    """A verl run's file log as an rlbench run: per-step phases and rollout share, the bubble (rebuilt from
    per-sample lengths with --rollout-dir, else a stated estimate), verl's own utilisation figures beside."""
    from rlbench.integrations.imports import import_verl

    cfg = _config(out, opts, (file, rollout_dir, tokenizer))
    _say(import_verl(file, rollout_dir, tokenizer, cfg), out)


@with_options(ImportOptions, "opts")
def trl_command(
    output_dir: Annotated[Path, typer.Argument(help="TRL's output_dir (run with log_completions=True).")],
    out: OutDir = Path("runs/import-trl"),
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer", help="The run's tokenizer directory, where the length probe was not used."
        ),
    ] = None,
    *,
    opts: ImportOptions,
) -> None:
    """A finished TRL GRPOTrainer run as an rlbench run, from its completions parquet files (lengths per
    sample) and trainer_state.json (TRL's step times): the bubble in decode steps, the what-if."""
    from rlbench.integrations.imports import import_trl

    cfg = _config(out, opts, (output_dir, tokenizer))
    _say(import_trl(output_dir, tokenizer, cfg), out)
