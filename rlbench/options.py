"""Option types shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model", help="Model directory (config.json + *.safetensors). Default: the embedded model."
    ),
]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N or auto.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed.")]
OutDir = Annotated[Path, typer.Option("--out", help="Output directory.")]
DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="RLBENCH_DATA_DIR", help="Directory of offline suite JSONL files."),
]
Mode = Annotated[
    str, typer.Option("--mode", help="baseline, sorted, sorted-partial, histopipe, rhyme or sorted+rhyme.")
]
Task = Annotated[str, typer.Option("--task", help="Embedded task: arith or kk.")]
Steps = Annotated[int, typer.Option("--steps", min=1, help="RL steps.")]
PromptsPerStep = Annotated[int | None, typer.Option("--prompts-per-step", help="Complete groups per update.")]
GroupSize = Annotated[int | None, typer.Option("--group-size", help="Samples per prompt.")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", help="Max response tokens.")]
ModeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--mode-option",
        help="KEY=VALUE for the mode (repeatable), e.g. oversubscription=3, max_staleness=2, "
        "histospec.max_draft=8. Values are JSON where they parse, else strings.",
    ),
]
Workers = Annotated[
    int,
    typer.Option(
        "--workers",
        min=1,
        help="Rollout workers: engine replicas as Ray actors (pip install 'rlbench\\[ray]'); 1 = in-process.",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option("--ray-address", help="Join this Ray cluster instead of starting a local one."),
]
Engine = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Rollout/generation engine: reference, or vllm (needs vLLM; HistoSpec modes then use vLLM's "
        "n-gram speculative decoding).",
    ),
]
