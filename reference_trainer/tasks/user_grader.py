"""A suite's own grader, named `python:module:function` in its suite file.

The function takes (response, gold) and returns whether the response is right (a bool), or the answer it
read and whether it is right (a tuple). The module is imported from sys.path, where rlbench puts the suite
file's folder first, so a `utils.py` beside the suite file is found as `python:utils:grade`.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

from reference_trainer.errors import UserError

PREFIX = "python:"
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # importable as it stands: no relative `.mod`


def is_user_grader(grader: str) -> bool:
    return grader.startswith(PREFIX)


@functools.lru_cache(maxsize=16)
def load_grader(grader: str) -> Callable[[str, str], Any]:
    """The function `python:module:function` names; a name that does not import is one line."""
    module, _, function = grader.removeprefix(PREFIX).rpartition(":")
    if not _DOTTED.fullmatch(module) or not function.isidentifier():
        raise UserError(f"grader {grader!r}: write python:module:function (an absolute module name)")
    try:
        loaded = importlib.import_module(module)
    except ImportError as err:
        raise UserError(f"grader {grader!r}: cannot import {module} ({err})") from None
    except (Exception, SystemExit) as err:  # a SyntaxError, an error raised or sys.exit() at import time
        if isinstance(err, SystemExit):
            why = f"it called sys.exit({err.code!r})"
        elif isinstance(err, SyntaxError):
            why = f"SyntaxError at {err.filename}:{err.lineno}: {err.msg}"
        else:
            why = f"{type(err).__name__}: {err}"
        raise UserError(f"grader {grader!r}: importing {module} failed ({why})") from None
    fn = getattr(loaded, function, None)
    if fn is None:
        raise UserError(f"grader {grader!r}: {module} has no {function}")
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
