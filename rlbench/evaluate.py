"""`rlbench eval` below the command: one checked job (`EvalJob`: a suite or a group, the model, the device,
threads and limit, where to write) and `evaluate`, which checks every suite and its data before the model is
resolved, then runs each suite (rlbench.eval.runner) and writes its results and page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from reference_trainer.errors import MAX_THREADS, Interrupted, check_integer
from reference_trainer.inputs import inside
from reference_trainer.rollout.engines import check_engine_kind
from rlbench.eval import backends
from rlbench.eval.runner import PROGRESS_FILE, REPORT_FILE, EvalConfig, EvalPlan, plan_eval, run_eval
from rlbench.eval.suite_file import Suite
from rlbench.eval.suites import group_members, resolve
from rlbench.models import EMBEDDED_NOTE, is_embedded, resolve_model
from rlbench.report.eval_report import write_eval_report
from rlbench.rundirs import claim


@dataclass
class EvalJob:
    """What `rlbench eval` was asked: `settings.suite` names a suite, a suite file or a group (each of its
    suites then runs into OUT/<suite>); sampling left None comes from each suite file."""

    settings: EvalConfig  # its model is resolved by `evaluate`, after every input is checked
    model: Path | None = None  # a directory or a model name; None: the embedded model
    out: Path | None = None  # default runs/eval-<suite>
    data_dir: Path | None = None
    include: list[Path] = field(default_factory=list)
    limit: int | None = None
    device: str = "auto"
    threads: int | None = None
    overwrite: bool = False

    def check(self) -> list[tuple[EvalPlan, Path]]:
        """Every suite's checked plan and its run directory: options, suite files (each read once) and data,
        all before the model is resolved, which can mean reading hundreds of megabytes."""
        check_engine_kind(self.settings.engine)
        if self.threads is not None:
            check_integer("--threads", self.threads, low=1, high=MAX_THREADS)
        spec = self.settings.suite
        record = resolve(spec, self.include)
        out = self.out or Path("runs") / f"eval-{Path(spec).stem}"
        if isinstance(record, Suite):
            return [(plan_eval(record, self.settings, self.data_dir, self.limit), out)]
        return [
            (
                plan_eval(member, replace(self.settings, suite=str(member.path)), self.data_dir, self.limit),
                inside(out, member.name, "suite name"),
            )  # a plain name (suite_file.py): never outside OUT
            for member in group_members(record, self.include)
        ]


def evaluate(job: EvalJob, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every suite of a checked job, one after another; each one's results (results.json)."""
    import torch  # the heavy imports, once every input has been checked

    from reference_trainer.model.loader import resolve_device, resolve_threads

    plans = job.check()
    resolve_device(job.device)  # --device cuda without a GPU: one line, before a run directory exists
    torch.set_num_threads(resolve_threads(job.threads))
    done = []
    for plan, out in plans:
        with claim(out, "eval", accepts=("eval",)):  # one writer, into an evaluation (or a new folder)
            # A directory, a model name, or the embedded default model (shipped, checked against its SHA-256).
            path = resolve_model(job.model)
            if is_embedded(path):
                say(f"note: {EMBEDDED_NOTE}")
            backend = partial(backends.make_backend, plan.config.engine, path, job.device, plan.config.seed)
            try:
                results = run_eval(
                    plan.with_model(str(path.resolve())),
                    backend,
                    out,
                    overwrite=job.overwrite,
                )
            except KeyboardInterrupt:
                kept = f"{out / PROGRESS_FILE} keeps every finished problem"
                raise Interrupted(
                    f"interrupted: {kept}; the same command continues where it stopped"
                ) from None
            write_eval_report(out / REPORT_FILE, results)
        done.append({**results, "out": str(out)})
    return done
