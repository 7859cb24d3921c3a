"""User-facing errors: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable environment; the CLI prints the message alone and exits 2."""

    exit_code = 2
