"""Top-level folders of the source tree that ship as package data (suites/ as rlbench._suites, reports/ as
rlbench._reports): found beside the package in a checkout, else installed."""

from __future__ import annotations

from pathlib import Path


def shipped_dirs(folder: str, package: str) -> list[Path]:
    """`folder` beside the package in a source checkout, then the copy installed as `package`."""
    dirs = []
    checkout = Path(__file__).resolve().parents[1] / folder
    if checkout.is_dir():
        dirs.append(checkout)
    try:
        from importlib.resources import files

        installed = Path(str(files(package)))
        if installed.is_dir() and installed not in dirs:
            dirs.append(installed)
    except (ModuleNotFoundError, TypeError):
        pass
    return dirs
