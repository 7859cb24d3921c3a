"""CLI commands, one module each; every module exposes `register(app)`.

Modules here import only typer and the standard library at top level so `rlbench --help` stays instant.
They are discovered, so adding a command is adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def _discover() -> list[ModuleType]:
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


COMMAND_MODULES = _discover()
