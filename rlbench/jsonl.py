"""Reading user-supplied JSONL: a bad row is reported as one line with its file and line number."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlbench.errors import UserError


def read_objects(path: Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One JSON object per non-blank line, each holding the `required` fields."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{lineno}: malformed JSON row ({err.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{lineno}: row is not a JSON object")
            if missing := [k for k in required if k not in row]:
                raise UserError(f"{path}:{lineno}: row lacks field(s) {', '.join(missing)}")
            rows.append(row)
    return rows
