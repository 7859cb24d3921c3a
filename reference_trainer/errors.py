"""User-facing errors: one clear line and a non-zero exit, never a traceback. And the range checks of
numeric settings that raise them, shared by every config and command (one wording for every option)."""

from __future__ import annotations

import math
import re
from typing import Any

MAX_SEED = 2**63 - 1  # seeds become torch and numpy int64 seeds
MAX_COUNT = 2**31 - 1  # counts and sizes (steps, tokens, samples, slots): int32 indices downstream
MAX_THREADS = 1024  # torch CPU threads: more than any machine has cores


# Control characters a terminal acts on: C0 but tab and newline (ESC starts a sequence: `ESC ] 0;` retitles
# the window, `ESC [ 2J` clears it), DEL and C1 (U+0080-U+009F: 8-bit CSI and OSC).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, newlines: bool = True) -> str:
    """`text` safe to print: every control character a terminal would act on written as an escape
    (`\\x1b`), so a suite's title, a file's line or a scraped page reaches the screen as text. With
    `newlines=False`, newline and CR are escaped too (one message, one line)."""
    if not newlines:
        text = text.replace("\r", "\\r").replace("\n", "\\n")
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class UserError(Exception):
    """Bad input or an unusable environment; the CLI prints the message alone and exits 2."""

    exit_code = 2


class ModelLoadError(UserError, ValueError):
    """A model directory (or device) that cannot be used: one line naming the file and what is wrong."""


class Interrupted(UserError):
    """Ctrl-C, turned into one line that says what the run kept and how to go on; exit 130 as for SIGINT."""

    exit_code = 130


# Where a missing module comes from: the extra that installs it, or (any other) rlbench's own requirements,
# which a partial environment may lack (a bare GPU machine has no package index).
EXTRA_OF_MODULE = {"ray": "ray", "arctic_inference": "suffix", "vllm": "vllm", "trl": "trl"}
EXTRA_OF_MODULE |= dict.fromkeys(("gguf", "accelerate", "transformers"), "gguf")  # the GGUF import's three


# arctic-inference is a source package whose build needs nanobind and ninja installed first (pip builds every
# sdist before it installs anything, so one command fails), against the environment's own Python and torch
# (without isolation, and CMake finds the Python on PATH: the virtual environment must be active).
SUFFIX_INSTALL = (
    "with the virtual environment active: pip install nanobind==2.9.2 ninja && "
    "pip install --no-build-isolation 'rlbench[suffix]'"
)


def missing_module(name: str | None) -> str:
    """One line for a ModuleNotFoundError of module `name`: what is missing and how to install it."""
    top = (name or "?").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    fix = f"pip install 'rlbench[{extra}]'" if extra else "pip install -e . (rlbench's requirements)"
    return f"the Python package {top!r} is not installed: {SUFFIX_INSTALL if extra == 'suffix' else fix}"


def flag(name: str) -> str:
    """How the CLI spells a setting (a message names what the user typed, where it was typed)."""
    return name if name.startswith("-") else "--" + name.replace("_", "-").replace(".", "-")


def check_integer(name: str, value: Any, low: int | None = None, high: int | None = MAX_COUNT) -> int:
    """`value` if it is an integer in [low, high], else a UserError naming the option."""
    name = flag(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"<= {high}" if low is None else f"in {low}..{high}"
        raise UserError(f"{name} must be {bounds}, got {value}")
    return value


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """`value` if it is a finite number in range (open or closed at each end), else a UserError."""
    name = flag(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value!r}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        lower = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        upper = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        raise UserError(f"{name} must be {' and '.join(b for b in (lower, upper) if b)}, got {value:g}")
    return value


# Sampling runs in float32: logits are divided by the temperature and a top-p mass is compared with a
# cumulative sum. A temperature of 1e-320 passes "finite and > 0" but is 0 in float32 (the logits become
# inf, and the draw an index past the vocabulary); so is a top-p of 1e-320 (no token is kept). Below these
# bounds nothing differs from greedy (temperature) or from keeping the top token (top-p) anyway.
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
MIN_TOP_P = 1e-6
# A coefficient of the update (lr, kl_coef, clip ranges, ...) multiplies float32 tensors: 1e300 does not
# convert. No useful setting comes near this bound.
MAX_COEFFICIENT = 1e6


def check_temperature(name: str, value: Any, greedy: bool = True) -> float:
    """`value` if it is 0 (greedy, where `greedy` allows it) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]."""
    check_number(name, value)
    if greedy and value == 0:
        return 0.0
    if not MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:
        zero = "0 (greedy) or " if greedy else ""
        raise UserError(
            f"{flag(name)} must be {zero}in {MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g}, got {value!r}"
        )
    return value


def check_top_p(name: str, value: Any) -> float:
    return check_number(name, value, low=MIN_TOP_P, high=1.0)


# Sequences one step or one problem holds at once (prompts x group size in training, -k samples per
# problem in eval): what a large RL step uses (1,024 prompts x 16) with room to spare. Past it, 2**31 - 1
# passes the count check and ends in a MemoryError or a minute of silence: refused up front, as simulate
# refuses its sizes.
MAX_SEQUENCES = 1 << 16


def check_sequences(what: str, count: int) -> int:
    if count > MAX_SEQUENCES:
        raise UserError(f"{what} is {count:,} sequences at once; at most {MAX_SEQUENCES:,}")
    return count
