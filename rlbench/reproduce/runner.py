"""Run one reproduction: its runner, the verdict from its spec, result.json and report.html, atomically.

`<out>/<name>/<cpu|gpu>/result.json` is written only when the runner finishes, so a killed run leaves the
previous result intact; the runner's own scratch (`work/` beside it) lets long runners resume.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError, printable
from reference_trainer.trace.records import read_json, write_json
from rlbench.reproduce.base import Context, Outcome
from rlbench.reproduce.page import write_report
from rlbench.reproduce.spec import Spec, load_specs


def device_folder(device: str) -> str:
    return "gpu" if device.startswith("cuda") else "cpu"


def describe_device(device: str) -> str:
    """The machine in words: the GPU's name, or the CPU model and core count."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores"


def source_commit() -> str | None:
    """$RLBENCH_COMMIT where set (a copied tree without .git, as on a GPU runner), else the checkout's commit
    (with "+dirty" for uncommitted changes to the code, suites or specs), or None outside a git checkout."""
    if commit := os.environ.get("RLBENCH_COMMIT"):
        return commit
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        # only what produces results counts: the reproductions' own outputs (reports/, the README's index)
        # must not mark the next reproduction of the same run "+dirty"
        source = [":(top)rlbench", ":(top)reference_trainer", ":(top)suites", ":(top)pyproject.toml"]
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *source],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def clear_stale_work(work: Path, origin: dict[str, Any], say: Any) -> None:
    """Runners reuse finished runs kept in `work` (killed or repeated reproductions resume); runs from another
    commit or configuration must never be mixed into a result: say so, delete them, recompute."""
    stamp = work / "origin.json"
    if stamp.is_file() and (old := read_json(stamp)) != origin:
        changed = ", ".join(f"{k} {old.get(k)!r} -> {v!r}" for k, v in origin.items() if old.get(k) != v)
        say(f"{work} holds runs of another commit or configuration ({changed}); recomputing")
        shutil.rmtree(work)
    elif work.is_dir() and not stamp.is_file():
        say(f"{work} has no origin.json (an older rlbench); recomputing")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    write_json(stamp, origin)


def check_names(names: list[str]) -> dict[str, Spec]:
    specs = load_specs()
    for name in names:
        if name not in specs:
            raise UserError(f"no reproduction named {name!r}; `rlbench reproduce --list` shows them")
    return specs


def runnable_here(
    specs: dict[str, Spec], chosen: list[str], all_: bool, device: str
) -> tuple[list[str], list[str]]:
    """The reproductions to run and those `--all` leaves out: on a CPU, the real-model ones (needs_gpu); a
    reproduction named on the command line always runs."""
    left_out = [n for n in chosen if all_ and device == "cpu" and specs[n].needs_gpu]
    return [n for n in chosen if n not in left_out], left_out


def reproduce(
    name: str, spec: Spec, out: Path, device: str, quick: bool, model: str | None, seed: int = 0
) -> dict[str, Any]:
    """Run `name` and write its result.json and report.html; returns the result. `model` None: the spec's
    model, else the embedded one."""
    import torch

    model = model or spec.model

    folder = out / name / device_folder(device)
    folder.mkdir(parents=True, exist_ok=True)
    say = lambda line: print(printable(f"[{name}] {line}"), flush=True)  # noqa: E731
    ctx = Context(device=device, quick=quick, model=model, work_dir=folder / "work", seed=seed, progress=say)
    # the model's label, not only the commit: rebuilt embedded weights not yet committed are other weights
    clear_stale_work(
        folder / "work",
        {
            "commit": source_commit(),
            "device": device,
            "quick": quick,
            "model": ctx.model_label(),
            "seed": seed,
        },
        say,
    )
    start = time.perf_counter()
    outcome: Outcome = spec.run_function()(ctx)
    wall = time.perf_counter() - start
    verdict, reasons = spec.verdict(outcome.measured)
    result = {
        "name": name,
        "claim": {"source": spec.source, "text": spec.claim, "value": spec.paper_value},
        "measured": outcome.measured,
        "metric": spec.metric,
        "verdict": verdict,
        "rule": spec.rule,
        "reasons": reasons,
        "notes": outcome.notes,
        "device": describe_device(device),
        "torch": torch.__version__,
        "commit": source_commit(),
        "date": datetime.date.today().isoformat(),
        "command": "rlbench reproduce "
        + name
        + (" --quick" if quick else "")
        + (f" --device {device}" if device != "cpu" else "")
        + (f" --model {model}" if model and model != spec.model else ""),
        "quick": quick,
        "config": outcome.config,
        "seeds": outcome.seeds,
        "wall_s": round(wall, 1),
        "data": outcome.data,
    }
    write_json(folder / "result.json", result)
    write_report(folder / "report.html", result, outcome.sections)
    return result
