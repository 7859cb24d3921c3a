"""Reproductions: each paper claim beside the value measured here, with a verdict.

A reproduction is a spec (`rlbench/reproduce/specs/<name>.toml`, package data: the claim, its source and
number, the workload, the rule that turns measured numbers into a verdict, and its runner: `runner =
"module:function"`, a function of a Context that returns an Outcome). runner.reproduce runs one and writes
`<out>/<name>/<cpu|gpu>/result.json` and `report.html`; index.write_index regenerates `reports/README.md`.
"""
