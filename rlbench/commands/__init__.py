"""CLI commands, one module per command (or group), each a plain function that rlbench/cli.py binds by name.

Modules here import typer, the standard library and light project modules at top level; heavy imports
(torch, the trainer, plotly) happen inside the commands, so `rlbench --help` and a typo's error are instant.
"""
