"""Atomic file writes and durable appends: an interrupted run never leaves a half-written result."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: str | Path, text: str) -> None:
    """Write to a temp file beside `path`, fsync, then rename over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON line and fsync: once this returns, the row survives a kill."""
    with open(path, "a") as fh:
        fh.write(json.dumps(obj, default=_json_default) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | Path) -> list[Any]:
    """Read JSONL, ignoring a torn last line left by a kill mid-write."""
    rows = []
    with open(path) as fh:
        lines = fh.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # only the final line may be torn
                break
            raise
    return rows


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
