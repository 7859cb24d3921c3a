"""The eval loop: prompts → backend → grading pool → one fsync'd JSONL row per finished problem → results.

Resumable: `problems.jsonl` in the output dir is the source of truth. A re-run with the same settings
skips the problems already there; one with different settings is refused unless `overwrite`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from reference_trainer.engine.config import SamplingParams
from reference_trainer.errors import MAX_SEED, UserError, check_integer
from reference_trainer.tasks.grading import GradeItem, GradeResult, VoteItem, get_grader, text_classes
from reference_trainer.tasks.prompts import TEMPLATES, build_prompt, resolve_template
from reference_trainer.trace.records import append_jsonl, read_json, read_jsonl, trim_torn_tail, write_json
from rlbench.eval.backends import GenerationBackend
from rlbench.eval.disagreements import compare_graders
from rlbench.eval.estimators import avg_at_k, majority_correct, majority_vote, pass_at_k, pass_ks
from rlbench.eval.pool import GradingPool
from rlbench.eval.schema import GROUP_FIELDS, row_problem
from rlbench.eval.suite_file import SAMPLING_DEFAULTS, Suite, check_sampling
from rlbench.eval.suites import Problem, data_path, import_path, load_problems

PROGRESS_FILE = "problems.jsonl"
CONFIG_FILE = "run_config.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"


@dataclass
class EvalConfig:
    """One eval's settings, as stored in run_config.json. Sampling left None comes from the suite file's
    `sampling` (plan_eval fills it in)."""

    suite: str  # a name or a suite file
    model: str | None = None  # the model directory; None until resolved, after every input is checked
    engine: str = "reference"
    samples: int | None = 1
    template: str = "auto"
    temperature: float | None = 0.6
    top_p: float | None = 0.95
    max_tokens: int | None = 1024
    seed: int = 0

    def check(self) -> None:
        """Every option in range before anything loads: one line naming the first that is not."""
        check_sampling(asdict(self))
        check_integer("--seed", self.seed, low=0, high=MAX_SEED)
        if self.template not in TEMPLATES:
            raise UserError(f"unknown template {self.template!r}; choose from {', '.join(TEMPLATES)}")


@dataclass
class EvalPlan:
    """A checked run: the suite, read once, and the problems to evaluate. Everything the user typed is
    validated here, before a model is resolved (or built, on a fresh cache)."""

    suite: Suite
    problems: list[Problem]
    config: EvalConfig  # with the suite's sampling defaults filled in

    def with_model(self, model: str) -> EvalPlan:
        return replace(self, config=replace(self.config, model=model))


def plan_eval(
    suite: Suite, cfg: EvalConfig, data_dir: Path | None = None, limit: int | None = None
) -> EvalPlan:
    """The plan of `suite` (the suite `cfg.suite` names, already read) under `cfg`: its sampling defaults
    filled in, every setting checked, its problems loaded (the first `limit`)."""
    if limit is not None:
        check_integer("--limit", limit, low=1)
    unset = {k: suite.sampling[k] for k in SAMPLING_DEFAULTS if getattr(cfg, k) is None}
    settings = replace(cfg, **unset)
    settings.check()
    problems = load_problems(suite, data_dir)
    if not problems:
        where = data_path(suite, data_dir) or suite.hub_source
        raise UserError(f"suite {suite.name!r}: no problems in {where}")
    return EvalPlan(suite, problems[:limit] if limit is not None else problems, settings)


def sample_seed(seed: int, problem_id: str, sample: int) -> int:
    """Per-request seed from the problem id, not its position: --limit and resume keep samples identical."""
    return zlib.crc32(f"{seed}:{problem_id}:{sample}".encode()) & 0x7FFFFFFF


def _check_stored_config(out: Path, cfg: EvalConfig, overwrite: bool) -> None:
    path = out / CONFIG_FILE
    progress = out / PROGRESS_FILE
    if overwrite:
        for name in (PROGRESS_FILE, RESULTS_FILE, REPORT_FILE, CONFIG_FILE):
            (out / name).unlink(missing_ok=True)
        return
    if not path.is_file():
        if progress.is_file() and progress.stat().st_size:
            raise UserError(
                f"{out} holds {PROGRESS_FILE} but no {CONFIG_FILE}; use --overwrite or another --out"
            )
        return
    raw = read_json(path)
    stored = raw.get("config") if isinstance(raw, dict) else None
    if not isinstance(stored, dict):
        raise UserError(f"{path}: not an evaluation's settings; pass --overwrite to start over")
    diff = [f"{k}: {stored.get(k)!r} -> {v!r}" for k, v in asdict(cfg).items() if stored.get(k) != v]
    if diff:
        raise UserError(
            f"{out} holds a run with other settings ({'; '.join(diff)}); "
            "pass --overwrite to start over, or use another --out"
        )


def _group_values(problem: Problem) -> dict[str, Any]:
    return {k: problem.extra[k] for k in GROUP_FIELDS if problem.extra.get(k) is not None}


def _problem_row(
    problem: Problem,
    responses: list[str],
    graded: list[GradeResult],
    classes: list[int | None],
    truncated: list[bool],
    tokenizer: Any,
) -> dict[str, Any]:
    correct = [bool(g.correct) for g in graded]
    winner = majority_vote(classes)
    return {
        "id": problem.id,
        "gold": problem.answer,
        **_group_values(problem),
        "extracted": [g.extracted for g in graded],
        "correct": correct,
        "n_correct": sum(correct),
        "avg": avg_at_k(correct),
        "answer_classes": classes,
        "maj_answer": graded[winner].extracted if winner is not None else None,
        "maj_correct": majority_correct(classes, correct),
        "response_chars": [len(r) for r in responses],
        "response_tokens": [len(tokenizer.encode(r)) for r in responses] if tokenizer is not None else None,
        "truncated_prompts": sum(truncated),
        "grade_errors": [g.error for g in graded],
        "second_extracted": [g.second_extracted for g in graded],  # the second grader (disagreements.py)
        "second_correct": [g.second_correct for g in graded],
        "grading_retries": sum(g.retried for g in graded),  # graded again after a timeout (GradingPool)
        "responses": responses,
    }


def summarize(suite: Suite, cfg: EvalConfig, template: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """results.json: headline estimators, per-group accuracy, per-problem rows (without the responses).

    Every field comes from the settings and the rows alone, so a resumed run (whose rows were written by
    several processes) reports exactly what one uninterrupted run would."""
    k = cfg.samples
    n = len(rows)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    by_group: dict[str, list[dict[str, Any]]] = {}
    for field in GROUP_FIELDS:
        values = sorted({r[field] for r in rows if field in r}, key=str)
        if len(values) > 1 or (values and field in suite.group_by):
            by_group[field] = [
                {field: v, "problems": len(sel), "accuracy": mean([r["avg"] for r in sel])}
                for v in values
                for sel in [[r for r in rows if r.get(field) == v]]
            ]
    return {
        "suite": suite.name,
        "title": suite.title,
        "suite_file": str(suite.path) if suite.path else None,
        "suite_sha256": suite.sha256,
        "metrics": suite.metrics,
        "model": cfg.model,
        "engine": cfg.engine,
        "samples": k,
        "template": template,
        "template_requested": cfg.template,
        "sampling": {k: getattr(cfg, k) for k in ("temperature", "top_p", "max_tokens", "seed")},
        "problems_evaluated": n,
        "accuracy": mean([r["avg"] for r in rows]),
        "pass_at_k": {str(kk): mean([pass_at_k(k, r["n_correct"], kk) for r in rows]) for kk in pass_ks(k)},
        "maj_at_k": {str(k): mean([float(r["maj_correct"]) for r in rows])},
        "grading_failures": sum(e is not None for r in rows for e in r["grade_errors"]),
        "grading_retries": sum(int(r.get("grading_retries", 0)) for r in rows),
        "truncated_prompts": sum(int(r.get("truncated_prompts", 0)) for r in rows),
        "by_group": by_group,
        **(compare_graders(rows, suite.grader) or {}),
        "problems": [{k2: v for k2, v in r.items() if k2 != "responses"} for r in rows],
    }


@dataclass
class _Generation:
    """What generating and grading a run's unfinished problems works with."""

    plan: EvalPlan
    template: str  # resolved: chat, or a name of grading.PROMPTS
    backend: GenerationBackend
    pool: GradingPool
    progress_path: Path  # problems.jsonl: a row appended per finished problem
    done: dict[str, dict[str, Any]]  # the finished problems' rows by id, added to as they finish
    show_progress: bool


def run_eval(
    plan: EvalPlan,
    backend_factory: Callable[[], GenerationBackend],
    out: Path,
    overwrite: bool = False,
    pool: GradingPool | None = None,
    chunk_seqs: int = 64,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate a checked plan (`plan_eval`), appending each finished problem to OUT/problems.jsonl; writes
    and returns the results (`rlbench.report.eval_report` renders them)."""
    suite, problems, cfg = plan.suite, plan.problems, plan.config
    import_path(suite)  # a python:module:function grader, imported by the pool's workers
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _check_stored_config(out, cfg, overwrite)

    progress_path = out / PROGRESS_FILE
    selected = {p.id for p in problems}
    done: dict[str, dict[str, Any]] = {}
    if progress_path.is_file():
        # A kill mid-append leaves a torn last row: cut it now (one note), so the file stays valid JSONL
        # and its problem is simply generated again below.
        trim_torn_tail(progress_path)
        for row in read_jsonl(progress_path, check=row_problem):
            if row.get("id") in selected and len(row.get("correct", [])) == cfg.samples:
                done[row["id"]] = row
    todo = [p for p in problems if p.id not in done]

    stored_cfg = out / CONFIG_FILE
    template = read_json(stored_cfg).get("template") if stored_cfg.is_file() else None
    own_pool = pool is None and bool(todo)
    pool = GradingPool() if own_pool else pool
    backend = None
    try:
        if own_pool and pool is not None:
            # The graders are forked now, before the engine's and the progress bar's threads exist: a fork
            # copies a lock another thread holds, and a worker that touched it (Ctrl-C) hung the run.
            pool.start()
        backend = backend_factory() if todo else None
        if backend is not None:
            template = resolve_template(cfg.template, suite.template, backend.tokenizer)
            suite_file = str(suite.path.resolve()) if suite.path else None
            write_json(stored_cfg, {"config": asdict(cfg), "template": template, "suite_title": suite.title,
                                    "suite_file": suite_file})  # fmt: skip
        if backend is not None and pool is not None:
            run = _Generation(plan, template or suite.template, backend, pool, progress_path, done, progress)
            _generate_and_grade(run, todo, per_chunk=max(1, chunk_seqs // cfg.samples))
    finally:
        if own_pool and pool is not None:
            pool.close()
        if backend is not None:
            backend.close()

    rows = [done[p.id] for p in problems if p.id in done]
    results = summarize(suite, cfg, template or suite.template, rows)
    write_json(out / RESULTS_FILE, results)
    return results


def _generate_and_grade(run: _Generation, todo: list[Problem], per_chunk: int) -> None:
    suite, k, total = run.plan.suite, run.plan.config.samples, len(run.plan.problems)
    columns = (TextColumn(f"{suite.name}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not run.show_progress, transient=False) as bar:
        task = bar.add_task("eval", total=total, completed=total - len(todo))

        def save(p: Problem, texts: list[str], cut: list[bool]) -> None:
            """Grade a problem whose samples are all in and append its row: a kill later loses nothing
            finished, and the bar counts problems as they complete."""
            items = [GradeItem(suite.grader, text, p.answer, p.extra.get("names"), p.extra.get("solution"),
                               id=f"{p.id}#{j}", problem=p.problem)
                     for j, text in enumerate(texts)]  # fmt: skip
            graded = run.pool.grade(items)
            classes = _answer_classes(suite.grader, [p], texts, graded, k, run.pool)[0]
            row = _problem_row(p, texts, graded, classes, cut, run.backend.tokenizer)
            append_jsonl(run.progress_path, row)  # durable before anything else happens
            run.done[p.id] = row
            bar.advance(task)

        for start in range(0, len(todo), per_chunk):
            _generate_chunk(todo[start : start + per_chunk], run, save)


def _generate_chunk(
    chunk: list[Problem], run: _Generation, save: Callable[[Problem, list[str], list[bool]], None]
) -> None:
    """Generate the samples of a chunk of problems in one batch; each problem is saved as soon as its last
    sample finishes (or, with a backend that returns only at the end, then)."""
    cfg, backend = run.plan.config, run.backend
    k = cfg.samples
    prompts, params = [], []
    for p in chunk:
        prompt = build_prompt(p.problem, run.template, run.plan.suite.template, backend.tokenizer)
        prompts += [prompt] * k
        sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens}
        params += [SamplingParams(**sampling, seed=sample_seed(cfg.seed, p.id, j)) for j in range(k)]
    texts: list[str] = [""] * len(prompts)
    waiting = [k] * len(chunk)  # samples of each problem still generating

    def complete(i: int) -> None:
        waiting[i] = 0
        # which prompts the backend cut to fit the context; stored per problem so a resume keeps them
        cut = list(getattr(backend, "last_truncated", None) or [False] * len(prompts))
        save(chunk[i], texts[i * k : (i + 1) * k], cut[i * k : (i + 1) * k])

    def on_text(index: int, text: str) -> None:
        texts[index] = text
        waiting[index // k] -= 1
        if waiting[index // k] == 0:
            complete(index // k)

    returned = backend.generate(prompts, params, on_text=on_text)
    if len(returned) != len(prompts):
        raise RuntimeError(
            f"backend {backend.name} returned {len(returned)} responses for {len(prompts)} prompts"
        )
    for i in range(len(chunk)):
        if waiting[i]:
            texts[i * k : (i + 1) * k] = returned[i * k : (i + 1) * k]
            complete(i)


def _answer_classes(
    grader: str,
    chunk: list[Problem],
    texts: list[str],
    graded: list[GradeResult],
    k: int,
    pool: GradingPool,
) -> list[list[int | None]]:
    """Each problem's answer classes for maj@k. Only problems with differing answer texts, graded by a
    grader that compares answers, need the pool (math-verify); other graders' answers are canonical texts."""
    votes = []
    for i, p in enumerate(chunk):
        samples = slice(i * k, (i + 1) * k)
        keys = [g.key for g in graded[samples]]
        votes.append(VoteItem(grader, keys, texts[samples], id=p.id, problem=p.problem))
    classes = [text_classes(v.keys) for v in votes]
    compares = get_grader(grader).compares_answers
    need = [i for i, c in enumerate(classes) if compares and len(set(c) - {None}) > 1]
    for i, found in zip(need, pool.classes([votes[i] for i in need]) if need else [], strict=True):
        classes[i] = found
    return classes
