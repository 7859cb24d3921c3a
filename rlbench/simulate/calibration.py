"""GPU calibrations: what a forward and an update cost on one GPU for one model shape, as measured there, one
committed file each (`calibrations/<gpu>-<model>.json`, package data) with its provenance. The replay of a
run's own schedule (gpu_replay.py) and the simulator's measured presets (cost.py `preset`) read costs only
through `Calibration`: one GPU cost model. Its terms (decode, verify, prefill, update, the optional host
seconds and `decode_scope`): docs/metrics.md, "The GPU replay".

A term never measured has no value here: it is swept over the values in `swept`, and every figure computed
with it says which value it assumed (an admission then costs a decode forward over its rows plus the assumed
seconds: at least the work of one token per row, the rest unknown). Between measured points a cost is
interpolated linearly; beyond the largest it follows the last segment, below the smallest it is held there
(`beyond` says where a figure left the measured range).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from reference_trainer.engine.fingerprint import engine_fingerprint
from reference_trainer.errors import UserError
from reference_trainer.trace.records import make_dir, read_json, write_json
from reference_trainer.trace.schema import MAX_MAGNITUDE

CALIBRATIONS = Path(__file__).with_name("calibrations")
FORMAT = 1
# The architecture numbers a calibration is for: a run replays through one only if its model has them all.
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
PROVENANCE_KEYS = ("device", "driver", "torch", "commit", "date", "command")
# The values an unmeasured term is swept over, and the one the simulator takes when it needs one (it says so).
# prefill: seconds an admission costs beyond a decode forward over its rows; update: seconds per token.
DEFAULT_SWEEPS: dict[str, dict[str, Any]] = {
    "prefill": {
        "values": [0.0, 0.005, 0.01, 0.02, 0.05],
        "simulator": 0.01,
        "unit": "s per admission beyond a decode forward over its rows",
    },
    "update": {"values": [1e-5, 3e-5, 1e-4], "simulator": 3e-5, "unit": "s per update token"},
}
TERMS = ("decode", "verify", "prefill", "update")
# What a decode cost holds: the forward alone, or a whole engine step (its host bookkeeping with it).
DECODE_SCOPES = ("forward", "engine_step")


def along(xs: list[float], ys: list[float], x: Any) -> np.ndarray:
    """Piecewise-linear y(x) through the points; held at the first below it, the last segment's slope (never
    negative: a cost does not fall with more work) beyond the last."""
    x = np.asarray(x, dtype=float)
    y = np.interp(x, xs, ys)
    if len(xs) > 1:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
    return y


def across(table: Mapping[int, Mapping[int, float]], outer: Any, inner: Any) -> np.ndarray:
    """A two-way table (outer -> inner -> value, each outer with its own inner points) read at (outer, inner):
    `along` the inner points of each measured outer value, then `along` the outer values."""
    outer, inner = np.broadcast_arrays(np.asarray(outer, dtype=float), np.asarray(inner, dtype=float))
    keys = sorted(table)
    rows = np.stack([along(sorted(table[k]), [table[k][w] for w in sorted(table[k])], inner) for k in keys])
    if len(keys) == 1:
        return rows[0]
    flat, at = rows.reshape(len(keys), -1), outer.reshape(-1)
    xs = np.asarray(keys, dtype=float)
    i = np.clip(np.searchsorted(xs, at, side="right") - 1, 0, len(xs) - 2)
    weight = np.maximum(0.0, (at - xs[i]) / (xs[i + 1] - xs[i]))
    span = np.arange(at.size)
    lo, hi = flat[i, span], flat[i + 1, span]
    rise = np.where(weight > 1.0, np.maximum(0.0, hi - lo), hi - lo)  # beyond the last: never falling
    return (lo + weight * rise).reshape(outer.shape)


@dataclass(frozen=True)
class Calibration:
    """One calibration file, read (`read_calibration`) or about to be written (`write_calibration`)."""

    gpu: str  # the preset name: h100, h200
    model: str  # the preset name: smollm2-135m, embedded
    model_label: str
    shape: dict[str, int]
    provenance: dict[str, Any]
    context: int  # cached tokens per row the forwards were timed at
    decode: dict[int, float]  # rows -> seconds
    verify: dict[int, dict[int, float]]  # rows -> width (1 + drafts) -> x a decode forward over those rows
    prefill: dict[int, dict[int, float]] | None = None  # rows -> uncached tokens per row -> seconds
    update: dict[str, Any] | None = None  # {"s_fixed", "s_per_token", "points": [[tokens, s], ...]}
    swept: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    decode_scope: str = "forward"  # DECODE_SCOPES: what one decode cost holds
    # The engine's host CPU seconds per engine step on the GPU machine: {"s_per_step": s, "by_rows": {...}}.
    host: dict[str, Any] | None = None
    # What one admission of 32 tokens adds to a decode step, in plain decode steps, by running rows
    # (Engine.measure_admission_overhead on the GPU: a mixed step against a plain decode step, each replaying
    # its graph). Recorded for the admission gate and the reader; the replay's riding admissions still take
    # the prefill term. `admission_overhead_by_tokens`: the same by admitted tokens, then running rows.
    admission_overhead: dict[int, float] | None = None
    admission_overhead_by_tokens: dict[int, dict[int, float]] | None = None

    @property
    def name(self) -> str:
        return f"{self.gpu}-{self.model}"

    @property
    def measured_terms(self) -> list[str]:
        return [t for t in TERMS if t not in self.swept]

    def sweep(self) -> list[dict[str, float]]:
        """Every combination of the swept terms' values (one empty assumption when nothing is swept)."""
        names = sorted(self.swept)
        grid = itertools.product(*(self.swept[n]["values"] for n in names))
        return [dict(zip(names, values, strict=True)) for values in grid]

    def decode_s(self, rows: Any) -> np.ndarray:
        keys = sorted(self.decode)
        return along(keys, [self.decode[k] for k in keys], rows)

    def verify_s(self, rows: Any, width: Any) -> np.ndarray:
        return self.decode_s(rows) * across(self.verify, rows, width)

    def admission_s(self, rows: Any, tokens: Any, assumed: Mapping[str, float]) -> np.ndarray:
        """An admission forward of `rows` sequences, `tokens` uncached tokens in all."""
        rows = np.maximum(np.asarray(rows, dtype=float), 1.0)
        if self.prefill is None:
            return self.decode_s(rows) + assumed["prefill"]
        return across(self.prefill, rows, np.asarray(tokens, dtype=float) / rows)

    def riding_s(self, rows: Any, tokens: Any, assumed: Mapping[str, float]) -> np.ndarray:
        """What admitted rows add to the decode (or verify) forward they ride in, beyond one token each."""
        if self.prefill is None:
            return np.where(np.asarray(rows) > 0, assumed["prefill"], 0.0)
        extra = self.admission_s(rows, tokens, assumed) - self.decode_s(np.maximum(rows, 1))
        return np.where(np.asarray(rows) > 0, np.maximum(0.0, extra), 0.0)

    def update_s(self, tokens: float, assumed: Mapping[str, float]) -> float:
        """The update of `tokens` tokens: the fit (plus an assumed residual, `update_residual_s`), or the
        swept seconds per token."""
        if self.update is None:
            return assumed["update"] * tokens
        fit = float(self.update["s_fixed"]) + float(self.update["s_per_token"]) * tokens
        return max(0.0, fit + assumed.get("update_residual", 0.0))

    def update_residual_s(self) -> float | None:
        """The update fit's residual over its measured points (root mean square, seconds): how far a step's
        update may lie from the line (None: no fit, or under 3 points to judge it by)."""
        points = (self.update or {}).get("points") or []
        if self.update is None or len(points) < 3:
            return None
        fixed, per_token = float(self.update["s_fixed"]), float(self.update["s_per_token"])
        return math.sqrt(statistics.mean((s - fixed - per_token * t) ** 2 for t, s in points))

    def beyond(self, rows: float, width: float = 1.0, tokens_per_row: float | None = None) -> bool:
        """Whether a forward of `rows` (`width` tokens each, or admitting `tokens_per_row` each) lies
        beyond the measured points, its cost extrapolated."""
        if rows > max(self.decode) or (width > 1 and width > max(max(w) for w in self.verify.values())):
            return True
        if tokens_per_row is None or self.prefill is None:
            return False
        return rows > max(self.prefill) or tokens_per_row > max(max(t) for t in self.prefill.values())

    def engine_age(self) -> dict[str, Any]:
        """The engine the costs were measured on (its source fingerprint; none recorded before it was) beside
        the one replaying them, and whether they differ ("measured on an older engine")."""
        measured_on, here = self.provenance.get("engine"), engine_fingerprint()
        return {"engine": measured_on, "replaying_engine": here, "older_engine": measured_on != here}

    def describe(self) -> dict[str, Any]:
        """What a figure computed from this calibration names: the file, the GPU, the model, where from."""
        return {
            "name": self.name,
            "model": self.model_label,
            **{k: self.provenance.get(k) for k in PROVENANCE_KEYS},
            "context": self.context,
            "measured": self.measured_terms,
            "decode_scope": self.decode_scope,
            **self.engine_age(),
            "swept": {k: {"values": v["values"], "unit": v["unit"]} for k, v in self.swept.items()},
        }

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["decode"] = {str(k): v for k, v in self.decode.items()}
        for key in ("verify", "prefill"):
            if (table := getattr(self, key)) is not None:
                doc[key] = {str(k): {str(w): v for w, v in r.items()} for k, r in table.items()}
        return {"format": FORMAT, **doc}


def _number(value: Any) -> bool:
    """A finite number a calibration can hold (a cost, a ratio): JSON also allows Infinity and 10^400."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= MAX_MAGNITUDE and (not isinstance(value, float) or math.isfinite(value))


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _non_negative(value: Any) -> bool:
    return _number(value) and value >= 0


def _costs(raw: Any, what: str) -> dict[int, float]:
    """A {count: seconds or ratio} map from JSON (keys are strings there), every value a positive number."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{what} is not a non-empty map")
    try:
        table = {int(k): v for k, v in raw.items()}
    except ValueError:
        raise ValueError(f"{what} has a key that is not a count") from None
    if min(table) < 1 or not all(_positive(v) for v in table.values()):
        raise ValueError(f"{what} holds a count below 1 or a value that is not a positive number")
    return {k: float(table[k]) for k in sorted(table)}


def _two_way(raw: Any, what: str) -> dict[int, dict[int, float]]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{what} is not a non-empty map")
    outer = _costs({k: 1 for k in raw}, what)  # the outer keys, checked as counts
    return {k: _costs(raw[str(k)], f"{what}[{k}]") for k in outer}


def _unmeasured(prefill: Any, update: Any) -> list[str]:
    """The swept terms a calibration did not measure."""
    return [term for term, value in (("prefill", prefill), ("update", update)) if value is None]


def _swept(swept: Any, prefill: Any, update: Any) -> dict[str, Any]:
    """A calibration's `swept`, checked: exactly the terms it did not measure, each with its values, the
    simulator's value and a unit."""
    unmeasured = set(_unmeasured(prefill, update))
    if not isinstance(swept, dict) or set(swept) != unmeasured:
        raise ValueError(
            f"swept must name exactly the unmeasured terms ({', '.join(sorted(unmeasured)) or 'none'})"
        )
    for term, sweep in swept.items():
        values = sweep.get("values") if isinstance(sweep, dict) else None
        if not isinstance(values, list) or not values or not all(_non_negative(v) for v in values):
            raise ValueError(f"swept {term} needs values, numbers >= 0")
        if not _non_negative(sweep.get("simulator")) or not isinstance(sweep.get("unit"), str):
            raise ValueError(f"swept {term} needs the simulator's value and a unit")
    return swept


def from_json(doc: Any) -> Calibration:
    """A calibration from its JSON, checked: a ValueError naming the first field that is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a calibration (format {FORMAT})")
    for key in ("gpu", "model", "model_label"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise ValueError(f"{key} is not a name")
    shape, provenance = doc.get("shape"), doc.get("provenance")
    if not isinstance(shape, dict) or any(type(shape.get(k)) is not int for k in SHAPE_KEYS):
        raise ValueError(f"shape needs the integers {', '.join(SHAPE_KEYS)}")
    if not isinstance(provenance, dict) or any(not provenance.get(k) for k in PROVENANCE_KEYS):
        raise ValueError(f"provenance needs {', '.join(PROVENANCE_KEYS)}")
    if type(doc.get("context")) is not int or doc["context"] < 0:
        raise ValueError("context is not a token count")
    verify = _two_way(doc.get("verify"), "verify")
    if any(widths.get(1) != 1.0 for widths in verify.values()):
        raise ValueError("verify needs width 1 at 1.0 in every row (the decode forward it is a multiple of)")
    prefill = None if doc.get("prefill") is None else _two_way(doc["prefill"], "prefill")
    scope, host = doc.get("decode_scope", "forward"), doc.get("host")
    if scope not in DECODE_SCOPES:
        raise ValueError(f"decode_scope is {scope!r}, not one of {', '.join(DECODE_SCOPES)}")
    if host is not None and not (isinstance(host, dict) and _positive(host.get("s_per_step"))):
        raise ValueError("host needs s_per_step, a positive number of seconds")
    per_mode = (host or {}).get("controller_s_per_step")
    if per_mode is not None and not (
        isinstance(per_mode, dict) and all(_non_negative(v) for v in per_mode.values())
    ):
        raise ValueError("host's controller_s_per_step needs seconds >= 0 per mode")
    overhead = doc.get("admission_overhead")
    if overhead is not None:  # values may be 0 (admitting cost nothing more)
        bad = not isinstance(overhead, dict) or not all(_positive(v) or v == 0 for v in overhead.values())
        overhead = _costs({k: 1 for k in ({} if bad else overhead)}, "admission_overhead") and {
            int(k): float(v) for k, v in overhead.items()
        }
    by_tokens = doc.get("admission_overhead_by_tokens")
    if by_tokens is not None:
        rows = by_tokens.values() if isinstance(by_tokens, dict) else [None]
        if not all(isinstance(r, dict) and all(_non_negative(v) for v in r.values()) for r in rows):
            raise ValueError("admission_overhead_by_tokens needs, per admitted tokens, numbers >= 0 by rows")
        by_tokens = {int(t): {int(b): float(v) for b, v in r.items()} for t, r in by_tokens.items()}
    update = doc.get("update")
    if update is not None and not (
        isinstance(update, dict) and all(_non_negative(update.get(k)) for k in ("s_fixed", "s_per_token"))
    ):
        raise ValueError("update needs s_fixed and s_per_token, numbers >= 0")
    swept = _swept(doc.get("swept") or {}, prefill, update)
    return Calibration(
        gpu=doc["gpu"], model=doc["model"], model_label=doc["model_label"],
        shape={k: shape[k] for k in SHAPE_KEYS}, provenance=dict(provenance), context=doc["context"],
        decode=_costs(doc.get("decode"), "decode"), verify=verify,
        prefill=prefill, update=update, swept=swept, notes=list(doc.get("notes") or []),
        decode_scope=scope, host=host, admission_overhead=overhead, admission_overhead_by_tokens=by_tokens,
    )  # fmt: skip


def read_calibration(path: str | Path) -> Calibration:
    """A calibration file, checked: one line naming the file and the first wrong field."""
    try:
        return from_json(read_json(path))
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def fit_update(points: Iterable[tuple[float, float]]) -> dict[str, Any]:
    """The update term from measured (tokens, seconds) points: a least-squares line, or, where noise makes
    its fixed part or slope negative, the pooled seconds per token (total seconds / total tokens)."""
    pts = [(float(t), float(s)) for t, s in points]
    if not pts:
        raise ValueError("no update points to fit")
    tokens, seconds = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    fixed, per_token = 0.0, float(seconds.sum() / tokens.sum())
    if len(set(tokens)) > 1:
        slope, intercept = np.polyfit(tokens, seconds, 1)
        if slope > 0 and intercept >= 0:
            fixed, per_token = float(intercept), float(slope)
    return {"s_fixed": fixed, "s_per_token": per_token, "points": [list(p) for p in pts]}


def with_sweeps(calibration: Calibration) -> Calibration:
    """The calibration with a sweep (DEFAULT_SWEEPS) for each term it did not measure, and none other."""
    unmeasured = _unmeasured(calibration.prefill, calibration.update)
    return replace(calibration, swept={t: DEFAULT_SWEEPS[t] for t in unmeasured})


def write_calibration(directory: str | Path, calibration: Calibration) -> Path:
    """Write `directory/<gpu>-<model>.json` (`with_sweeps`), checked as a reader will check it first."""
    doc = with_sweeps(calibration).to_json()
    from_json(doc)  # a ValueError names what is wrong, before anything is written
    path = make_dir(directory) / f"{calibration.name}.json"
    write_json(path, doc)
    return path


def packaged() -> list[Calibration]:
    return [read_calibration(p) for p in sorted(CALIBRATIONS.glob("*.json"))]


def model_shape(model_dir: str | Path) -> dict[str, int] | None:
    """The SHAPE_KEYS of a model directory's config.json (KV heads default to the attention heads); None
    without one."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    raw = read_json(path)
    raw.setdefault("num_key_value_heads", raw.get("num_attention_heads"))
    return {k: raw.get(k) for k in SHAPE_KEYS}


def find_calibration(shape: Mapping[str, int] | None, source: str | Path | None = None) -> Calibration | None:
    """The calibration for a model shape: `source` if it is a file (refused if made for another shape), else
    the newest matching one in `source` (a folder), else in the packaged ones; None if none matches."""
    if source is not None and Path(source).is_file():
        found = read_calibration(source)
        if shape is None or found.shape != dict(shape):
            raise UserError(
                f"{source} is a calibration of {found.model_label}, not of this run's model's shape"
            )
        return found
    if source is not None and not Path(source).is_dir():
        raise UserError(f"{source}: no such calibration file or folder")
    for pool in (
        [read_calibration(p) for p in sorted(Path(source).glob("*.json"))] if source else [],
        packaged(),
    ):
        matches = [c for c in pool if shape is not None and c.shape == dict(shape)]
        if matches:
            return max(matches, key=lambda c: (str(c.provenance["date"]), c.name))
    return None


def missing(shape: Mapping[str, int] | None) -> str:
    """Why a run has no replay: the shapes there are calibrations for."""
    known = ", ".join(f"{c.name} ({c.model_label})" for c in packaged()) or "none"
    what = "this model's shape" if shape is not None else "a model without a config.json"
    return f"no GPU calibration measured for {what}; calibrated: {known}"
