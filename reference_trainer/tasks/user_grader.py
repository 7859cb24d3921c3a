"""A suite's own grader, named `python:module:function` in its suite file.

The function takes (response, gold) and returns whether the response is right (a bool), or the answer it
read and whether it is right (a tuple). The module is imported from sys.path, where rlbench puts the suite
file's folder first, so a `utils.py` beside the suite file is found as `python:utils:grade`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from reference_trainer.errors import UserError

PREFIX = "python:"


def is_user_grader(grader: str) -> bool:
    return grader.startswith(PREFIX)


@functools.lru_cache(maxsize=16)
def load_grader(grader: str) -> Callable[[str, str], Any]:
    """The function `python:module:function` names; a name that does not import is one line."""
    module, _, function = grader.removeprefix(PREFIX).rpartition(":")
    if not module or not function:
        raise UserError(f"grader {grader!r}: write python:module:function")
    try:
        fn = getattr(importlib.import_module(module), function)
    except ImportError as err:
        raise UserError(f"grader {grader!r}: cannot import {module} ({err})") from None
    except AttributeError:
        raise UserError(f"grader {grader!r}: {module} has no {function}") from None
    if not callable(fn):
        raise UserError(f"grader {grader!r}: {module}.{function} is not a function")
    return fn


def grade_with(grader: str, response: str, gold: str) -> tuple[str | None, bool]:
    """(the answer read, correct) from the user's function."""
    verdict = load_grader(grader)(response, gold)
    if isinstance(verdict, tuple) and len(verdict) == 2:
        extracted, correct = verdict
        return (None if extracted is None else str(extracted)), bool(correct)
    if isinstance(verdict, bool):
        return None, verdict
    raise TypeError(f"{grader} returned {type(verdict).__name__}, not a bool or (answer, bool)")
