"""Which command's run a directory holds, and the one place a command claims a directory to write.

Every command that writes a run directory (`train`, `profile`, `compare`, `eval`, `observe`, `simulate`,
`reproduce`, `import`) enters `claim(out, command, accepts)`: it holds the directory's lock
(locks.run_lock, so a second writer is refused at once) and refuses a directory that holds another
command's run, whose files it would otherwise replace (`report.html`, `trace.jsonl`, `metrics.json` are
written by several commands). `check_new_run` is the one refusal of a finished run of the command's own kind
(without --overwrite).
What a directory holds is read from the files each command leaves first (`held_by`), so runs written
before this check are recognised too.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reference_trainer.errors import UserError
from reference_trainer.trace.locks import run_lock

# (file, kind), most specific first: a compare's or an observation's folder also holds a profile's files, a
# profile's also a trainer run's. The first file present names what the directory holds.
MARKERS: tuple[tuple[str, str], ...] = (
    ("compare.json", "compare"),
    ("run_config.json", "eval"),
    ("problems.jsonl", "eval"),
    ("results.json", "eval"),
    ("samples.jsonl", "observe"),
    ("simulate.json", "simulate"),
    ("validation.json", "simulate"),
    ("imported.json", "import"),  # an imported run also holds a profile's metrics.json and trace.jsonl
    ("metrics.json", "profile"),
    ("train_config.json", "train"),
)
# What each kind is called in a refusal.
NAMES = {
    "compare": "a comparison",
    "eval": "an evaluation",
    "observe": "an observation",
    "simulate": "a simulation",
    "import": "an imported run",
    "profile": "a profile",
    "train": "a training run",
}


def held_by(directory: Path) -> tuple[str, str] | None:
    """(kind, the file that says so) for what `directory` holds; None for an empty or foreign folder."""
    for name, kind in MARKERS:
        if (directory / name).exists() or (directory / name).is_symlink():
            return kind, name
    return None


@contextmanager
def claim(directory: str | Path, command: str, accepts: tuple[str, ...]) -> Iterator[Path]:
    """Hold `directory` as its only writer (created if needed), refusing it when it holds a run of a kind
    not in `accepts` (checked under the lock: a run that another process has just begun counts too)."""
    with run_lock(directory) as held:
        found = held_by(held)
        if found is not None and found[0] not in accepts:
            kind, marker = found
            raise UserError(f"{held} holds {NAMES[kind]} ({marker}), not {command}'s run: use another --out")
        yield held


OVERWRITE_HINT = "pass --overwrite to replace it, or use another --out"


def check_new_run(
    out: str | Path, kind: str, overwrite: bool, hint: str = OVERWRITE_HINT, marker: str | None = None
) -> None:
    """Refuse to start a run in `out` over a finished run of `kind` (its first marker file, or `marker`, is
    there) unless `overwrite`: the new run would replace its files without a word. `hint` says how to go on
    instead."""
    marker = marker or next(name for name, held in MARKERS if held == kind)
    if not overwrite and (Path(out) / marker).exists():
        raise UserError(f"{out} already holds {NAMES[kind]}: {hint}")


def check_not_input(out: str | Path, inputs: tuple[str | Path, ...]) -> None:
    """Refuse an output that is one of the command's `inputs`, is inside one, or (a folder) holds one: the
    command would write over what it reads. Never lifted by --overwrite."""
    where = Path(out).resolve(strict=False)
    for given in inputs:
        source = Path(given).resolve(strict=False)
        if where == source or source in where.parents or where in source.parents:
            how = "is" if where == source else "is inside" if source in where.parents else "holds"
            raise UserError(f"{out} {how} the input {given}: use another --out")


def check_run_dir(
    out: str | Path,
    kind: str,
    overwrite: bool,
    inputs: tuple[str | Path, ...] = (),
    marker: str | None = None,
) -> None:
    """The one rule for a command that writes a run folder from inputs (`import`, `simulate`): never over
    its inputs, and never over a finished run without `overwrite` (`claim` refuses other commands' runs)."""
    check_not_input(out, inputs)
    check_new_run(out, kind, overwrite, marker=marker)


def check_new_comparison(out: Path, modes: list[str], overwrite: bool) -> None:
    """Refuse to compare into a folder that holds a finished comparison unless `overwrite`: its compare.json
    and page would be replaced by the new modes' alone. With `overwrite`, the old comparison's mode folders
    that the new one does not rewrite are removed with it, so none is left orphaned beside the new one."""
    check_new_run(out, "compare", overwrite)
    if not (out / "compare.json").exists():
        return
    for folder in sorted(p for p in out.iterdir() if p.is_dir() and not p.is_symlink()):
        if folder.name not in modes and (held_by(folder) or ("", ""))[0] in ("train", "profile"):
            shutil.rmtree(folder)


def check_output_file(out: str | Path, inputs: tuple[str | Path, ...], overwrite: bool) -> Path:
    """The one rule for a command that writes one file (`audit --out`, `trace convert --out`): refused when
    it is one of the command's `inputs` or inside one (never overwritten, even with `overwrite`: the command
    would destroy what it reads), and, unless `overwrite`, when it is inside a run folder (a run's own files
    are its commands' to write) or names a file that is already there."""
    path = Path(out)
    where = path.resolve(strict=False)
    check_not_input(out, inputs)
    if path.is_dir():
        raise UserError(f"{out} is a folder; --out names the file to write")
    if overwrite:
        return path
    run = next((p for p in where.parents if held_by(p) is not None), None)
    if run is not None:
        kind, marker = held_by(run) or ("", "")
        raise UserError(f"{out} is inside {NAMES[kind]} ({run / marker}): {OVERWRITE_HINT}")
    if path.exists() or path.is_symlink():
        raise UserError(f"{out} exists: {OVERWRITE_HINT}")
    return path
