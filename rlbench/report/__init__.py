"""Self-contained HTML reports (plotly inlined once per page)."""
