"""The eval report: estimators, the pass@k curve, accuracy per subject (or level, exam, people), response
lengths, and a per-problem table. It reads `results.json` alone; `rlbench report DIR` re-renders it, and
rebuilds the results of a run killed before writing them from `problems.jsonl` and `run_config.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_json, read_jsonl
from rlbench.eval.runner import CONFIG_FILE, PROGRESS_FILE, EvalConfig, summarize
from rlbench.eval.schema import check_results, row_problem
from rlbench.eval.suites import get_suite
from rlbench.models import model_label
from rlbench.report.figures import _fig, note
from rlbench.report.page import kpis, table, write_page

EVAL_FILES = ("results.json", "run_config.json")  # what marks a directory as an eval run
_MAX_TABLE_ROWS = 2000  # every suite fits; a larger custom one is cut rather than making a huge page
_GREEN, _RED = "#1a9850", "#d73027"


def is_eval_dir(d: Path) -> bool:
    return any((d / name).is_file() for name in EVAL_FILES)


def load_results(d: Path) -> tuple[dict[str, Any], bool]:
    """(results, partial): results.json, or, for a run killed before writing it, the same summary rebuilt
    from the rows finished so far (partial=True)."""
    if (d / "results.json").is_file():
        return check_results(read_json(d / "results.json"), d / "results.json"), False

    stored = read_json(d / CONFIG_FILE)
    try:
        cfg = EvalConfig(**stored["config"])
        cfg.check()
    except (KeyError, TypeError, UserError) as err:
        raise UserError(f"{d / CONFIG_FILE}: not an eval run config ({err})") from None
    progress = d / PROGRESS_FILE
    rows = read_jsonl(progress, check=row_problem) if progress.is_file() else []
    rows = [r for r in rows if len(r.get("correct", [])) == cfg.samples]
    suite = get_suite(stored.get("suite_file") or cfg.suite)  # the file the run read, wherever it was found
    return summarize(suite, cfg, stored.get("template", "?"), rows), True


def render_eval(d: Path) -> Path:
    """Re-render D/report.html from the eval run in D."""
    results, partial = load_results(d)
    return write_eval_report(d / "report.html", results, partial=partial)


def _pass_curve(results: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    ks = sorted(int(k) for k in results["pass_at_k"])
    fig = _fig("pass@k (unbiased) against k", "k (samples drawn)", "share of problems solved", height=360)
    passed = [results["pass_at_k"][str(k)] for k in ks]
    fig.add_trace(go.Scatter(x=ks, y=passed, mode="lines+markers", name="pass@k"))
    for k, v in results["maj_at_k"].items():
        fig.add_trace(go.Scatter(x=[int(k)], y=[v], mode="markers", name=f"maj@{k}", marker={"size": 11}))
    fig.add_hline(y=results["accuracy"], line_dash="dot", annotation_text=f"avg@{results['samples']}")
    fig.update_xaxes(type="log", tickvals=ks, ticktext=[str(k) for k in ks])
    fig.update_yaxes(range=[0, 1.02])
    return fig


def _lengths(rows: list[dict[str, Any]]) -> tuple[Any, str] | None:
    import plotly.graph_objects as go

    unit = "tokens" if rows and all(r.get("response_tokens") for r in rows) else "chars"
    lengths: dict[bool, list[int]] = {True: [], False: []}
    for r in rows:
        for n, ok in zip(r.get(f"response_{unit}") or [], r["correct"], strict=False):
            lengths[bool(ok)].append(n)
    if not lengths[True] and not lengths[False]:
        return None
    fig = _fig("Response length, correct and wrong", f"response length ({unit})", "responses", height=360)
    for ok, name, colour in ((True, "correct", _GREEN), (False, "wrong", _RED)):
        fig.add_trace(go.Histogram(x=lengths[ok], name=name, marker_color=colour, opacity=0.7, nbinsx=40))
    fig.update_layout(barmode="overlay")
    return fig, unit


def _group_section(field: str, groups: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    import plotly.graph_objects as go

    fig = _fig(f"Accuracy by {field}", field, "accuracy (avg@k)", height=340)
    x, y = [str(g[field]) for g in groups], [g["accuracy"] for g in groups]
    fig.add_trace(go.Bar(x=x, y=y, text=[f"n={g['problems']}" for g in groups]))
    fig.update_yaxes(range=[0, 1])
    return f"Accuracy by {field}", [table(groups), fig]


def _problem_table(results: dict[str, Any], rows: list[dict[str, Any]]) -> list[Any]:
    groups = [f for f in ("subject", "level", "exam", "n_people") if any(f in r for r in rows)]
    unit = "tokens" if rows and all(r.get("response_tokens") for r in rows) else "chars"
    shown = []
    for r in rows[:_MAX_TABLE_ROWS]:
        lengths = r.get(f"response_{unit}") or []
        errors = [e for e in r.get("grade_errors") or [] if e]
        shown.append(
            {
                "id": r["id"],
                **{f: r.get(f) for f in groups},
                "gold": r["gold"],
                "majority answer": r.get("maj_answer"),
                "maj": "✓" if r.get("maj_correct") else "✗",
                "correct": f"{r['n_correct']}/{len(r['correct'])}",
                "samples": "".join("✓" if c else "✗" for c in r["correct"][:64]),
                f"mean length ({unit})": sum(lengths) / len(lengths) if lengths else None,
                "grading failures": len(errors) or "",
            }
        )
    parts: list[Any] = [table(shown)]
    if len(rows) > _MAX_TABLE_ROWS:
        parts.insert(0, note(f"first {_MAX_TABLE_ROWS} of {len(rows)} problems shown"))
    return parts


def _second_grader(results: dict[str, Any]) -> list[Any]:
    """The score under each grader with its version, and the samples they grade differently by answer
    type, with examples (results.json's `graders` and `disagreements`)."""
    graders = [
        {"grader": name, "version": g["version"], "accuracy (avg@k)": g["accuracy"]}
        for name, g in results["graders"].items()
    ]
    d = results["disagreements"]
    types = [
        {
            "answer type": kind,
            "samples": e["samples"],
            "right for rlbench only": e["rlbench_only"],
            f"right for {d['second_grader']} only": e["second_only"],
        }
        for kind, e in d["by_type"].items()
    ]
    second = d["second_grader"]
    mark = lambda ok: "✓" if ok else "✗"  # noqa: E731
    examples = [
        {"answer type": kind, "sample": x["id"], "gold": x["gold"], "rlbench read": x["rlbench"]["answer"],
         "rlbench": mark(x["rlbench"]["correct"]), f"{second} read": x["second"]["answer"],
         second: mark(x["second"]["correct"])}
        for kind, e in d["by_type"].items() for x in e["examples"]
    ]  # fmt: skip
    parts: list[Any] = [table(graders), table(types)]
    return parts + ([table(examples)] if examples else [note("the two graders agree on every sample")])


def write_eval_report(path: Path, results: dict[str, Any], partial: bool = False) -> Path:
    k = results["samples"]
    rows = results.get("problems", [])
    head = kpis(
        {
            f"avg@{k}": f"{results['accuracy']:.1%}",
            f"pass@{k}": f"{results['pass_at_k'][str(k)]:.1%}",
            f"maj@{k}": f"{results['maj_at_k'][str(k)]:.1%}",
            "problems": str(results["problems_evaluated"]),
            "grading failures": str(results.get("grading_failures", 0)),
            "truncated prompts": str(results.get("truncated_prompts", 0)),
        }
    )
    estimators = [{"estimator": "avg@k (accuracy)", "k": k, "value": results["accuracy"]}]
    estimators += [
        {"estimator": "pass@k (unbiased)", "k": int(kk), "value": v} for kk, v in results["pass_at_k"].items()
    ]
    estimators += [{"estimator": "maj@k", "k": int(kk), "value": v} for kk, v in results["maj_at_k"].items()]
    s = results["sampling"]
    settings = {
        "model": model_label(results["model"]),
        "model directory": results["model"],
        "engine": results["engine"],
        "template": results["template"],
        **{k: s[k] for k in ("temperature", "top_p", "max_tokens", "seed")},
    }
    first: list[Any] = [head, table(estimators), table([settings])]
    if partial:
        first.insert(0, note("partial run: results.json was never written; these are the finished problems"))
    sections: list[tuple[str, list[Any]]] = [("Accuracy", first), ("pass@k", [_pass_curve(results)])]
    sections += [_group_section(field, groups) for field, groups in results.get("by_group", {}).items()]
    if results.get("graders") and results.get("disagreements"):
        sections.append(("Second grader", _second_grader(results)))
    if lengths := _lengths(rows):
        sections.append(("Response length", [lengths[0]]))
    if rows:
        sections.append(("Per-problem results", _problem_table(results, rows)))
    title = f"rlbench eval: {results.get('title', results['suite'])}"
    subtitle = f"{settings['model']} · {results['engine']} engine · {k} sample{'s' * (k != 1)} per problem"
    return write_page(path, title, sections, subtitle=subtitle)
