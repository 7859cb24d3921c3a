"""Which engine a measurement was made on, without git: a hash of the engine's and the model's source files.

A GPU calibration records it (benchmarks/gpu_calibrate.py); the replay compares it with the engine doing the
replaying and says "measured on an older engine" when they differ, so a figure from costs timed before the
engine changed says so. A copied tree without history (a GPU machine's) hashes the same as its checkout.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # reference_trainer/
SOURCES = ("engine", "model")  # what a forward's and a step's cost depend on


@cache
def engine_fingerprint() -> str:
    """12 hex digits of SHA-256 over the engine's and the model's .py files, by path and content."""
    digest = hashlib.sha256()
    for folder in SOURCES:
        for path in sorted((PACKAGE / folder).glob("*.py")):
            digest.update(f"{folder}/{path.name}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
