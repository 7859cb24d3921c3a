"""A reproduction's HTML page: the claim and the paper's number beside the measured one, the verdict and
why, the runner's plots, then how it was run."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import write_text
from rlbench.report.figures import note
from rlbench.report.page import kpis, table, write_page

VERDICT_COLOURS = {"reproduced": "#2e7d32", "not reproduced": "#c62828", "inconclusive": "#ef6c00"}


def verdict_badge(verdict: str) -> str:
    colour = VERDICT_COLOURS.get(verdict, "#616161")
    return (
        f'<p><span style="background:{colour};color:#fff;padding:4px 12px;border-radius:4px;'
        f'font-weight:bold">{html.escape(verdict)}</span></p>'
    )


def headline(result: dict[str, Any]) -> list[Any]:
    claim = result["claim"]
    measured = result["measured"]
    parts: list[Any] = [
        f"<p>{html.escape(claim['text'])}</p>",
        f"<p><i>Source:</i> {html.escape(claim['source'])}</p>",
        kpis({"paper": claim["value"], "measured here": str(measured.get("headline", "see below"))}),
        verdict_badge(result["verdict"]),
        f"<p><i>Rule:</i> {html.escape(result['rule'])}</p>",
    ]
    if result["reasons"]:
        parts.append("<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in result["reasons"]) + "</ul>")
    if result.get("quick"):
        parts.append(
            note("--quick: a CPU-sized smoke version of this reproduction, not the committed result.")
        )
    parts.extend(note(n) for n in result.get("notes", []))
    return parts


PLOTLY_JS = "plotly.min.js"  # one copy at the results root, shared by every reproduction's page


def write_plotly(root: Path) -> None:
    """The results root's shared plotly.js (rewritten only when the installed plotly's differs)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    path = root / PLOTLY_JS
    if not path.is_file() or path.read_text(encoding="utf-8") != js:
        write_text(path, js)


def write_report(path: Path, result: dict[str, Any], sections: list[tuple[str, list[Any]]]) -> Path:
    """The page, at <root>/<name>/<cpu|gpu>/report.html; plotly.js comes from <root>/plotly.min.js."""
    write_plotly(path.parents[2])
    measured_rows = [{"metric": k, "value": v} for k, v in result["measured"].items() if k != "headline"]
    run_rows = [
        {"field": k, "value": result.get(k)}
        for k in ("device", "torch", "commit", "date", "command", "wall_s")
    ]
    config_rows = [{"setting": k, "value": str(v)} for k, v in result["config"].items()]
    return write_page(
        path,
        f"{result['name']}: {result['verdict']}",
        [
            ("Claim, paper and measurement", headline(result)),
            *sections,
            ("Measured", [table(measured_rows)]),
            ("How it was run", [table(run_rows), table(config_rows)]),
        ],
        subtitle=f"{result['device']} · {result['date']} · {result['command']}",
        plotly_src=f"../../{PLOTLY_JS}",
    )
