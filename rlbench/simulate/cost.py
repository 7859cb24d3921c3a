"""GPU cost model of one rollout worker: prefill, decode step, k-draft verify and update times; which preset
is which model: docs/simulate.md.

`Measured`: a GPU calibration (calibration.py), its unmeasured terms at the value the file names for the
simulator (`describe` says which). `Roofline`, for the shapes no GPU run measured: a forward's time is the
larger of (bytes moved / memory bandwidth) and (FLOPs / peak), each at an achievable fraction of the
datasheet, plus a fixed per-forward overhead. Decoding reads every weight once per forward and the KV cache
of every live token, so at RL batch sizes it is memory-bound and its time grows with the batch's total
context, not with the batch size. Verifying k drafted tokens per sequence is one forward over (k+1) tokens
per sequence: the same bytes, (k+1)x FLOPs. `FittedRun`: a least-squares fit of a run's own engine events
(time vs live slots and context), which is how a replay is checked against a measured run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from reference_trainer.errors import UserError
from reference_trainer.trace.schema import DECODE, FORWARD_KINDS, PREFILL, ROLLOUT, SEQUENCE, UPDATE
from rlbench.simulate.calibration import Calibration, packaged


@dataclass(frozen=True)
class GPU:
    name: str
    mem_bw: float  # bytes/s, datasheet
    flops: float  # dense bf16 FLOP/s, datasheet
    mem_bytes: float


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> float:  # K and V, every layer, bf16
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params


GPUS = {
    "h100": GPU("H100 SXM", mem_bw=3.35e12, flops=989e12, mem_bytes=80e9),
    "h200": GPU("H200 SXM", mem_bw=4.8e12, flops=989e12, mem_bytes=141e9),
}
# Qwen2.5 shapes (config.json of the released checkpoints)
MODELS = {
    "1.5b": ModelShape("1.5B (Qwen2.5-1.5B shape)", 1.54e9, 28, 1536, 12, 2, 128),
    "7b": ModelShape("7B (Qwen2.5-7B shape)", 7.62e9, 28, 3584, 28, 4, 128),
    "32b": ModelShape("32B (Qwen2.5-32B shape)", 32.8e9, 64, 5120, 40, 8, 128),
}


class CostModel:
    """Vectorised over workers: every method takes numpy arrays (one entry per worker) and returns seconds.

    `gap` is time per forward in which slots hold sequences but the engine does no work for them
    (scheduling, sampling on the host): it counts in the rollout wall time but not in busy slot-time.
    """

    name = "cost model"
    gap: float = 0.0
    rollout_fixed: float = 0.0  # per RL step, inside the rollout phase but outside engine forwards

    def decode(self, batch: np.ndarray, ctx: np.ndarray, q: float = 1.0) -> np.ndarray:
        """One forward over `batch` sequences of total context `ctx`, `q` query tokens per sequence."""
        raise NotImplementedError

    def prefill(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        """One batched prefill of `n_seqs` sequences, `tokens` in all, sum of squared lengths `tokens_sq`."""
        raise NotImplementedError

    def riding(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        """What admitting `n_seqs` sequences (`tokens` uncached tokens in all) adds to the decode or verify
        forward they ride in, beyond one row each (the engine admits into running batches that way)."""
        raise NotImplementedError

    def update(self, tokens: float, workers: int) -> float:
        """Update (old log-probs + forward + backward + optimizer) over `tokens`, data parallel."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class Roofline(CostModel):
    gpu: GPU
    model: ModelShape
    bw_eff: float = 0.8  # achievable share of datasheet bandwidth (decode kernels reach ~75-85%)
    flop_eff: float = 0.6  # achievable share of peak for large GEMMs in prefill/verify
    train_mfu: float = 0.4  # model FLOPs utilisation of the update
    overhead: float = 3e-4  # per forward: launches/CUDA-graph replay and sampling
    update_flops_per_token: float = 8.0  # 6P forward+backward, 2P for the old policy's log-probs

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.gpu.name}, {self.model.name}"

    def decode(self, batch: np.ndarray, ctx: np.ndarray, q: float = 1.0) -> np.ndarray:
        m = self.model
        mem = (m.weight_bytes + m.kv_bytes_per_token * ctx) / (self.gpu.mem_bw * self.bw_eff)
        attn = 4.0 * m.layers * m.heads * m.head_dim * ctx * q
        flops = (2.0 * m.params * batch * q + attn) / (self.gpu.flops * self.flop_eff)
        return np.where(batch > 0, self.overhead + np.maximum(mem, flops), 0.0)

    def _prompts(self, tokens: np.ndarray, tokens_sq: np.ndarray, weights: float) -> np.ndarray:
        """Prompt tokens' forward: their KV writes (and `weights` bytes read) against their FLOPs."""
        m = self.model
        mem = (weights + m.kv_bytes_per_token * tokens) / (self.gpu.mem_bw * self.bw_eff)
        flops = 2.0 * m.params * tokens + 2.0 * m.layers * m.heads * m.head_dim * tokens_sq
        return np.maximum(mem, flops / (self.gpu.flops * self.flop_eff))

    def prefill(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        prompts = self._prompts(tokens, tokens_sq, self.model.weight_bytes)
        return np.where(n_seqs > 0, self.overhead + prompts, 0.0)

    def riding(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        # the decode forward already reads the weights and pays the overhead: the prompts add their FLOPs
        # and their KV writes
        return np.where(n_seqs > 0, self._prompts(tokens, tokens_sq, 0.0), 0.0)

    def update(self, tokens: float, workers: int) -> float:
        flops = self.update_flops_per_token * self.model.params * tokens
        return flops / (max(1, workers) * self.gpu.flops * self.train_mfu)

    def kv_capacity_tokens(self) -> float:
        """KV tokens that fit beside the weights in 90% of GPU memory (a capacity sanity check)."""
        free = 0.9 * self.gpu.mem_bytes - self.model.weight_bytes
        return max(0.0, free / self.model.kv_bytes_per_token)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "gpu": asdict(self.gpu),
            "model": {**asdict(self.model), "kv_bytes_per_token": self.model.kv_bytes_per_token},
            "bw_eff": self.bw_eff,
            "flop_eff": self.flop_eff,
            "train_mfu": self.train_mfu,
            "overhead_s": self.overhead,
            "kv_capacity_tokens": self.kv_capacity_tokens(),
        }


@dataclass
class Measured(CostModel):
    """A GPU calibration as the simulator's cost model: each forward at the cost measured for its shape (a
    decode forward over its live sequences, a verify of q tokens each, an admission of its sequences and
    prompt tokens), the update at the measured cost per token; terms never measured at the file's value for
    the simulator. The context is the calibration's, whatever the batch holds."""

    calibration: Calibration

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.calibration.provenance['device']}, {self.calibration.model_label} (measured)"

    @property
    def assumed(self) -> dict[str, float]:
        return {term: float(sweep["simulator"]) for term, sweep in self.calibration.swept.items()}

    def decode(self, batch: np.ndarray, ctx: np.ndarray, q: float = 1.0) -> np.ndarray:
        rows = np.maximum(batch, 1)
        return np.where(batch > 0, self.calibration.verify_s(rows, q), 0.0)

    def prefill(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        return np.where(n_seqs > 0, self.calibration.admission_s(n_seqs, tokens, self.assumed), 0.0)

    def riding(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        return self.calibration.riding_s(n_seqs, tokens, self.assumed)

    def update(self, tokens: float, workers: int) -> float:
        return self.calibration.update_s(tokens / max(1, workers), self.assumed)

    def describe(self) -> dict[str, Any]:
        assumed = {
            t: {"value": v, "unit": self.calibration.swept[t]["unit"]} for t, v in self.assumed.items()
        }
        return {"kind": "measured", "calibration": self.calibration.describe(), "assumed": assumed}


def preset(gpu: str, model: str, **kw: Any) -> CostModel:
    """The cost model of a GPU and a model: its calibration where one was measured (`Measured`), else the
    roofline for the model sizes that have a shape here (MODELS)."""
    gpu, model = gpu.lower(), model.lower()
    measured = {(c.gpu, c.model): c for c in packaged()}
    if (gpu, model) in measured:
        return Measured(measured[gpu, model])
    if gpu not in GPUS:
        raise UserError(f"unknown GPU preset {gpu!r}; valid: {', '.join(GPUS)}")
    if model not in MODELS:
        calibrated = ", ".join(f"{g} x {m}" for g, m in sorted(measured)) or "none"
        raise UserError(
            f"no preset for {model!r} on {gpu}: roofline models {', '.join(MODELS)}; measured: {calibrated}"
        )
    return Roofline(GPUS[gpu], MODELS[model], **kw)


@dataclass
class FittedRun(CostModel):
    """Linear fits of a measured run: decode = a + b*live + c*context; prefill = a + b*seqs + c*tokens;
    admissions riding in a decode forward add d*seqs + e*tokens."""

    decode_coef: tuple[float, float, float]
    prefill_coef: tuple[float, float, float]
    riding_coef: tuple[float, float]
    update_per_token: float
    gap: float = 0.0
    rollout_fixed: float = 0.0
    source: str = ""
    fit_r2: float | None = None

    name = "fitted"

    def decode(self, batch: np.ndarray, ctx: np.ndarray, q: float = 1.0) -> np.ndarray:
        a, b, c = self.decode_coef
        # verify work scales with the query tokens on a host-bound engine; context reads do not
        return np.where(batch > 0, np.maximum(0.0, a + b * batch * q + c * ctx), 0.0)

    def prefill(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        a, b, c = self.prefill_coef
        return np.where(n_seqs > 0, np.maximum(0.0, a + b * n_seqs + c * tokens), 0.0)

    def riding(self, n_seqs: np.ndarray, tokens: np.ndarray, tokens_sq: np.ndarray) -> np.ndarray:
        d, e = self.riding_coef
        return np.where(n_seqs > 0, d * n_seqs + e * tokens, 0.0)

    def update(self, tokens: float, workers: int) -> float:
        return self.update_per_token * tokens / max(1, workers)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "fitted",
            "source": self.source,
            "decode_s": dict(
                zip(("per_forward", "per_live_seq", "per_context_token"), self.decode_coef, strict=True)
            ),
            "prefill_s": dict(zip(("per_forward", "per_seq", "per_token"), self.prefill_coef, strict=True)),
            "riding_s": dict(zip(("per_seq", "per_token"), self.riding_coef, strict=True)),
            "update_s_per_token": self.update_per_token,
            "gap_s": self.gap,
            "rollout_fixed_s": self.rollout_fixed,
            "decode_fit_r2": self.fit_r2,
        }


def _lstsq(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float | None]:
    """Least squares with non-negative coefficients (a negative per-token cost is noise, not physics).

    Stalls of a shared machine are kept: they are part of the measured time a replay must reproduce, and
    they hit every batch size alike, so they raise the fixed cost and leave the slopes unbiased. Only points
    beyond 50 MADs (a GC pause, a descheduled process) are dropped and the fit redone."""
    keep_rows = np.ones(y.size, dtype=bool)
    coef = np.zeros(x.shape[1])
    for _ in range(3):
        xs, ys = x[keep_rows], y[keep_rows]
        coef, *_ = np.linalg.lstsq(xs, ys, rcond=None)
        for j in range(1, x.shape[1]):
            if coef[j] < 0:  # refit without that column
                cols = [i for i in range(x.shape[1]) if i != j and (i == 0 or coef[i] >= 0)]
                sub, *_ = np.linalg.lstsq(xs[:, cols], ys, rcond=None)
                coef = np.zeros(x.shape[1])
                coef[cols] = sub
        if coef[0] < 0:  # a negative fixed cost per forward: refit through the origin
            cols = [i for i in range(1, x.shape[1]) if coef[i] > 0] or [1]
            sub, *_ = np.linalg.lstsq(xs[:, cols], ys, rcond=None)
            coef = np.zeros(x.shape[1])
            coef[cols] = np.maximum(sub, 0.0)
        resid = y - x @ coef
        mad = float(np.median(np.abs(resid - np.median(resid)))) or 1e-12
        keep_rows = resid < np.median(resid) + 50.0 * 1.4826 * mad
    ys = y[keep_rows]
    resid = ys - x[keep_rows] @ coef
    var = float(((ys - ys.mean()) ** 2).sum())
    return coef, (1.0 - float((resid**2).sum()) / var) if var > 0 else None


def _forward_rows(
    engine: list[dict[str, Any]], prompt_len: dict[str, int]
) -> tuple[list[Any], list[float], list[Any], list[float], list[float]]:
    """The regression rows of a run's forwards, in worker and time order: decode steps (rows, context
    tokens, the admissions that rode in them) and prefills (rows, prompt tokens), with their times, and the
    gaps between one worker's forwards within a step."""
    dec_x, dec_y, pre_x, pre_y, gaps = [], [], [], [], []
    ctx: dict[str, int] = {}  # live sequence -> tokens in its KV cache
    prev: dict[int, dict[str, Any]] = {}
    for e in engine:
        w = int(e.get("worker", 0))
        slots = {str(k): str(v) for k, v in (e.get("slots") or {}).items()}
        if w in prev and prev[w]["step"] == e["step"]:
            gaps.append(float(e["t_start"]) - float(prev[w]["t_end"]))
        prev[w] = e
        dur = float(e["t_end"]) - float(e["t_start"])
        live = set(slots.values())
        for sid in ctx.keys() - live:
            del ctx[sid]
        new = [s for s in live if s not in ctx]
        if e["kind"] == PREFILL:
            toks = sum(prompt_len.get(s, 0) for s in new)
            pre_x.append((1.0, float(len(new)), float(toks)))
            pre_y.append(dur)
            for s in new:
                ctx[s] = prompt_len.get(s, 0) + 1
        else:  # a decode step, with the admissions that rode in it (the new sequences) as extra columns
            toks = e.get("prefill_tokens", sum(prompt_len.get(s, 0) for s in new)) if new else 0
            ctx_old = float(sum(ctx[s] for s in live if s in ctx))
            dec_x.append((1.0, float(len(live)), ctx_old, float(len(new)), float(toks)))
            dec_y.append(dur)
            for s in new:
                ctx[s] = prompt_len.get(s, 0)
            for s in live:
                ctx[s] += 1
    return dec_x, dec_y, pre_x, pre_y, gaps


def _rollout_fixed(events: list[dict[str, Any]], engine: list[dict[str, Any]], gap: float) -> list[float]:
    # The rollout phase's time outside the slowest worker's forwards and the gaps between them: host work
    # per RL step (workers run in parallel, so it is measured against the busiest one, not their sum).
    rollout: dict[int, float] = defaultdict(float)
    for e in events:
        if e.get("kind") == ROLLOUT:
            rollout[int(e["step"])] += float(e["t_end"]) - float(e["t_start"])
    worker_time: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for e in engine:
        worker_time[int(e["step"])][int(e.get("worker", 0))] += float(e["t_end"]) - float(e["t_start"]) + gap
    return [max(0.0, r - max(worker_time[s].values(), default=0.0)) for s, r in rollout.items() if r > 0]


def fit_run(events: list[dict[str, Any]], source: str = "") -> FittedRun:
    """Fit a `FittedRun` model to a run's trace events (engine steps, phases and sequences)."""
    prompt_len = {e["id"]: int(e.get("prompt_tokens", 0)) for e in events if e.get("kind") == SEQUENCE}
    engine = sorted(
        (e for e in events if e.get("kind") in FORWARD_KINDS),
        key=lambda e: (int(e.get("worker", 0)), float(e["t_start"])),
    )
    if not any(e["kind"] == DECODE for e in engine):
        raise UserError(f"{source or 'trace'}: no decode events to fit a cost model to")
    dec_x, dec_y, pre_x, pre_y, gaps = _forward_rows(engine, prompt_len)
    x = np.asarray(dec_x)
    if not x[:, 3].any():  # no admission rode (an older trace): fit decode alone
        x = x[:, :3]
    coef, r2 = _lstsq(x, np.asarray(dec_y))
    dcoef = coef[:3]
    pcoef = _lstsq(np.asarray(pre_x), np.asarray(pre_y))[0] if pre_x else dcoef.copy()
    rcoef = coef[3:] if coef.size > 3 else pcoef[1:]  # riding unseen: as a prefill's per-row and token cost

    gap = float(np.mean(gaps)) if gaps else 0.0
    fixed = _rollout_fixed(events, engine, gap)

    upd_time = sum(float(e["t_end"]) - float(e["t_start"]) for e in events if e.get("kind") == UPDATE)
    upd_tokens = sum(
        int(e.get("prompt_tokens", 0)) + int(e.get("response_tokens", 0))
        for e in events
        if e.get("kind") == SEQUENCE and e.get("status") == "finished"
    )
    return FittedRun(
        decode_coef=tuple(float(v) for v in dcoef),  # type: ignore[arg-type]
        prefill_coef=tuple(float(v) for v in pcoef),  # type: ignore[arg-type]
        riding_coef=tuple(float(v) for v in rcoef),  # type: ignore[arg-type]
        update_per_token=upd_time / upd_tokens if upd_tokens else 0.0,
        gap=gap,
        rollout_fixed=float(np.mean(fixed)) if fixed else 0.0,
        source=source,
        fit_r2=r2,
    )
