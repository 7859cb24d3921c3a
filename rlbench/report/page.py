"""One self-contained HTML page: plotly.js inlined once, figures and HTML fragments in sections."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import write_text

_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;padding:0 16px;
  max-width:1200px;color:#222}
h1{font-size:1.6em;margin-bottom:4px} h2{font-size:1.2em;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0} table{border-collapse:collapse;margin:8px 0;max-width:100%}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:right} th{background:#f4f4f4}
th{max-width:9em} td{max-width:20em}
td:first-child,th:first-child{text-align:left}
.note{background:#fff8e1;padding:8px 12px;border-left:4px solid #f0b400}
.kpis{display:flex;gap:16px;flex-wrap:wrap} .kpi{background:#f6f8fa;padding:10px 16px;border-radius:6px}
.kpi b{display:block;font-size:1.5em}
table.legend td,table.legend th{text-align:left;max-width:40em;font-size:.9em} .verdict li{margin:4px 0}
"""


# A table wider than this many columns is split into several, each repeating the first column, so that
# it fits the page (max-width 1200 px: a 1,400-px window) rather than running off its right edge.
MAX_TABLE_COLUMNS = 11


_BREAK_AFTER = re.compile(r"[/_]")


def _breakable(header: str) -> str:
    return _BREAK_AFTER.sub(lambda m: m.group(0) + "<wbr>", html.escape(header))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """An HTML table from dict rows; floats shown with 4 significant digits, from 10,000 up as whole numbers
    with separators, and a nonzero float under 0.001 as "<0.001" (e-notation reads badly in a table; the
    JSON beside the page keeps the exact value). More than MAX_TABLE_COLUMNS columns become several tables
    of the first column and the next ones in turn."""
    if not rows:
        return "<p><i>no rows</i></p>"
    columns = list(columns or rows[0].keys())
    if len(columns) > MAX_TABLE_COLUMNS:
        pieces = -(-(len(columns) - 1) // (MAX_TABLE_COLUMNS - 1))
        width = -(-(len(columns) - 1) // pieces)  # pieces of near-equal width, not one column left over
        parts = [columns[i : i + width] for i in range(1, len(columns), width)]
        return "".join(
            f'<p class="sub">columns {i * width + 2}-{i * width + 1 + len(part)} of {len(columns)}</p>'
            + table(rows, [columns[0], *part])
            for i, part in enumerate(parts)
        )

    def cell(value: Any) -> str:
        if isinstance(value, float):
            if 0 < abs(value) < 1e-3:
                return html.escape("-<0.001" if value < 0 else "<0.001")
            return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
        return html.escape("" if value is None else str(value))

    # a header may break after "/" or "_" (verl's "fully_async/rollouter/idle_ratio" has no space to break at)
    head = "".join(f"<th>{_breakable(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def kpis(items: dict[str, str]) -> str:
    """A row of headline numbers."""
    return (
        '<div class="kpis">'
        + "".join(f'<div class="kpi">{html.escape(k)}<b>{html.escape(v)}</b></div>' for k, v in items.items())
        + "</div>"
    )


def render_page(
    title: str,
    sections: Sequence[tuple[str, Sequence[Any]]],
    subtitle: str = "",
    plotly_src: str | None = None,
) -> str:
    """Sections are (heading, parts); a part is an HTML string or a plotly Figure. plotly.js is inlined,
    or with `plotly_src` loaded from that (relative) path, so that many pages can share one copy."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    figure_html = partial(pio.to_html, include_plotlyjs=False, full_html=False, config={"displaylogo": False})
    body: list[str] = []
    n_fig = 0
    for heading, parts in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        for part in parts:
            if isinstance(part, str):
                body.append(part)
            else:
                n_fig += 1
                body.append(figure_html(part, div_id=f"fig{n_fig}"))
    sub = f'<p class="sub">{html.escape(subtitle)}</p>' if subtitle else ""
    script = (
        f"<script type='text/javascript' src='{html.escape(plotly_src)}'></script>"
        if plotly_src
        else f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style>{script}</head>"
        f"<body><h1>{html.escape(title)}</h1>{sub}{''.join(body)}</body></html>"
    )


def write_page(
    path: str | Path,
    title: str,
    sections: Sequence[tuple[str, Sequence[Any]]],
    subtitle: str = "",
    plotly_src: str | None = None,
) -> Path:
    """Render and write atomically."""
    path = Path(path)
    write_text(path, render_page(title, sections, subtitle, plotly_src))
    return path
