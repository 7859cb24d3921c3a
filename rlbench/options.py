"""Options shared by several commands, defined once: Annotated option types, and `RunOptions`, the run
options that `train`, `profile` and `compare` share (one field = one option on all three)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
import typer.main

from reference_trainer.errors import printable
from reference_trainer.modes import MODES  # the registry alone: no torch

ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model",
        help="Model directory (config.json + *.safetensors) or a name from `rlbench models list` "
        "(e.g. smollm2-135m-instruct). Default: the embedded model.",
    ),
]
Device = Annotated[
    str, typer.Option("--device", help="auto (CUDA when there is a GPU, else the CPU), cpu, cuda or cuda:N.")
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed.")]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="CPU threads for torch. Default: every core but one (1 on a 2-core machine): more threads than "
        "free cores stall when other jobs share the CPU.",
    ),
]
OutDir = Annotated[Path, typer.Option("--out", help="Output directory.")]
OverwriteFile = Annotated[  # commands writing one --out file (audit, trace convert)
    bool, typer.Option("--overwrite", help="Replace an existing --out file, or write one inside a run.")
]
GpuCalibration = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="GPU calibration the run's schedule is replayed through (a file, or a folder searched first). "
        "Default: the one packaged for the run's model shape (rlbench/simulate/calibrations/).",
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="RLBENCH_DATA_DIR", help="Directory of offline suite JSONL files."),
]
Mode = Annotated[
    str,
    typer.Option(
        "--mode", help=f"{', '.join(MODES)}: `rlbench modes` says what each runs and which options it takes."
    ),
]
Task = Annotated[str, typer.Option("--task", help="Embedded task: arith or kk.")]
Steps = Annotated[int, typer.Option("--steps", min=1, help="RL steps.")]
PromptsPerStep = Annotated[int | None, typer.Option("--prompts-per-step", help="Complete groups per update.")]
GroupSize = Annotated[int | None, typer.Option("--group-size", help="Samples per prompt.")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", help="Max response tokens.")]
Temperature = Annotated[
    float | None,
    typer.Option(
        "--temperature", help="Rollout sampling temperature (the update scores at the same one; default 1)."
    ),
]
EvalEvery = Annotated[
    int | None,
    typer.Option(
        "--eval-every",
        min=0,
        help="Held-out evaluation (greedy accuracy, pass@1) at step 0 and every N steps; 0 turns it off.",
    ),
]
PromptPool = Annotated[
    int | None,
    typer.Option("--prompt-pool", min=1, help="Training prompts, cycled per epoch (default 512)."),
]
ModeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--mode-option",
        help="KEY=VALUE for the mode (repeatable), e.g. oversubscription=3, max_staleness=2, "
        "spec.max_draft=8. Values are JSON where they parse, else strings.",
    ),
]
TaskOption = Annotated[
    list[str] | None,
    typer.Option(
        "--task-option",
        help="KEY=VALUE for the task (repeatable), e.g. max_ops=4, num_people=2, format_reward=0.1, "
        "style=chat; `rlbench modes` lists each task's. Values are JSON where they parse, else strings.",
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


SimGpu = Annotated[str, typer.Option("--gpu", help="Simulator GPU preset: h100 or h200.")]
SimModelSize = Annotated[
    str,
    typer.Option(
        "--model-size",
        help="Simulator model preset: 1.5b, 7b or 32b (roofline models), or a model with a measured GPU "
        "calibration (smollm2-135m, embedded: h200 only).",
    ),
]
# Observing rollout servers (`rlbench observe`, `rlbench profile --engine-metrics`)
ServerCapacity = Annotated[
    str | None,
    typer.Option(
        "--capacity",
        help="Request slots per server (vLLM's --max-num-seqs), one value or one per URL, comma-separated. "
        "Default: what the server exposes, else the peak running count seen (a lower bound).",
    ),
]
IdleGap = Annotated[
    float | None,
    typer.Option(
        "--idle-gap", min=0.0, help="Seconds with no request running that end a rollout phase (default 1)."
    ),
]
RequestLog = Annotated[
    Path | None,
    typer.Option(
        "--request-log",
        help="Per-request lengths (the simulator's length-trace JSONL) for the what-if replay; default: the "
        "server's length histograms.",
    ),
]


@dataclass(frozen=True)
class ServerOptions:
    """How observed rollout servers are read and their requests replayed: `rlbench observe` and
    `rlbench profile --engine-metrics` (with_options expands it into these flags)."""

    capacity: ServerCapacity = None
    idle_gap: IdleGap = None
    request_log: RequestLog = None
    gpu: SimGpu = "h100"
    model_size: SimModelSize = "7b"


@dataclass(frozen=True)
class RunOptions:
    """The options of a reference-trainer run that `train`, `profile` and `compare` all take.

    Each field is one CLI option on all three commands: its Annotated type gives the flag and help, its
    default the CLI default. A new shared option is one new field here; `config_kwargs` passes it on to
    `rlbench.training.build_config`, whose TrainConfig field of the same name receives it. Options whose
    default or meaning differs per command (`--mode`/`--modes`, `--steps`, `--out`) stay in the commands.
    """

    task: Task = "arith"
    seed: Seed = 0
    model: ModelDir = None
    device: Device = "auto"
    threads: Threads = None
    engine: Engine = "reference"
    workers: Workers = 1
    ray_address: RayAddress = None
    prompts_per_step: PromptsPerStep = None
    group_size: GroupSize = None
    max_tokens: MaxTokens = None
    temperature: Temperature = None
    eval_every: EvalEvery = None
    prompt_pool: PromptPool = None
    mode_option: ModeOption = None
    task_option: TaskOption = None

    def config_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """`build_config` keyword arguments: every field, then the command's own values (mode, steps, ...)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, **overrides}


def with_options(record: type, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a Typer command whose signature has a `NAME: RECORD` parameter (RECORD a dataclass of
    Annotated options): in the signature Typer reads, that parameter becomes one option per field (in its
    place, so --help keeps the order), and the command is called with the collected values as one record."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = get_type_hints(record, include_extras=True)  # the Annotated types, not bare str/int
        shared = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=f.default
            )
            for f in fields(record)
        ]
        own = inspect.signature(func, eval_str=True).parameters
        if name not in own:
            raise TypeError(f"{func.__name__} has no `{name}: {record.__name__}` parameter")
        params: list[inspect.Parameter] = []
        # Typer calls commands with keyword arguments only, so every parameter can be keyword-only; that lets
        # the shared ones sit anywhere without breaking the positional-before-keyword rule of a Signature.
        for p in own.values():
            if p.name == name:
                params.extend(shared)
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = record(**{f.name: kwargs.pop(f.name) for f in fields(record)})
            return func(**{name: values}, **kwargs)

        # Typer reads __signature__ and resolves hints from __annotations__: both describe the expanded
        # command.
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


# A command's `run: RunOptions`, expanded into the shared run options.
with_run_options = with_options(RunOptions, "run")


def echo(message: object, err: bool = False) -> None:
    """A command's line of output, with every control byte escaped (`printable`): the lines name files,
    runs, suites, servers and keys that come from outside, whose escape sequences a terminal would act on
    (colours and progress bars are rich's, which writes them itself)."""
    typer.echo(printable(str(message)), err=err)


def given_flags(ctx: typer.Context, exclude: tuple[str, ...] = ()) -> list[str]:
    """The flags the running command was given (on its command line or in the environment), not left at
    their defaults, but the parameters named in `exclude`: what a command that would ignore them names."""
    params = {p.name: p for p in ctx.command.params}
    return [
        params[name].opts[0] if name in params and params[name].opts else "--" + name.replace("_", "-")
        for name in ctx.params
        if name not in exclude and ctx.get_parameter_source(name).name != "DEFAULT"
    ]


def numeric_options(app: typer.Typer) -> list[tuple[tuple[str, ...], str, type]]:
    """(command path, flag, int or float) of every numeric option of every command of `app`: what the
    option fuzzing (tests/test_option_fuzz.py, faults/fault_fuzz.py) feeds bad numbers to."""

    def walk(command: Any, path: tuple[str, ...]) -> Any:
        if hasattr(command, "commands"):
            if command.params:  # a group that runs on its own (`rlbench simulate`): its options too
                yield path, command
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield path, command

    def kind(param: Any) -> type | None:
        # typer >= 0.24 keeps the annotation (`type_descriptor`); older typers (a GPU image's, where reading
        # it stopped test collection) have only click's parameter type, named "integer", "float range"...
        if (descriptor := getattr(param, "type_descriptor", None)) is not None:
            kinds = {int, float} & {descriptor.annotation, *typing.get_args(descriptor.annotation)}
            return kinds.pop() if kinds else None
        name = getattr(getattr(param, "type", None), "name", "")
        return {"integer": int, "integer range": int, "float": float, "float range": float}.get(name)

    found = []
    for path, command in walk(typer.main.get_command(app), ()):
        for param in command.params:
            if param.opts and (found_kind := kind(param)):
                found.append((path, param.opts[0], found_kind))
    return found
