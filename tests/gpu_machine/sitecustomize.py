"""Python as on a bare GPU machine, for tests/test_gpu_run.py: loaded at start-up as `sitecustomize` when
this folder is on PYTHONPATH (so in every process a run starts), it makes each top-level package named in
$RLBENCH_HIDE_PACKAGES (comma-separated) fail to import as an absent one does. That machine has torch,
transformers, typer, pytest and hypothesis but no package index: what docs/development.md carries as wheels
(plotly, gguf, math-verify) is installed there, the rest of rlbench's packages are not."""

from __future__ import annotations

import os
import sys

HIDDEN = frozenset(filter(None, os.environ.get("RLBENCH_HIDE_PACKAGES", "").split(",")))


class WithoutHidden:
    """A meta path finder that finds what the one it wraps finds, except the hidden packages: for those
    `importlib.util.find_spec` returns None and an import raises ModuleNotFoundError, as when absent."""

    def __init__(self, finder: object) -> None:
        self.finder = finder

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)  # type: ignore[attr-defined]

    def __getattr__(self, attribute: str) -> object:  # invalidate_caches and the like
        return getattr(self.finder, attribute)


sys.meta_path[:] = [WithoutHidden(finder) for finder in sys.meta_path]
