"""Length traces, what the simulator replays: JSONL, converted from a run's trace.jsonl, or synthetic.

Length-trace format (JSONL, one sequence per line; what another framework's logs must be converted to):

    {"step": 0, "prompt_id": "q17", "sample": 3, "prompt_tokens": 212, "response_tokens": 1874,
     "drafted": 900, "accepted": 702, "predicted_tokens": 1650.0}

- `step` (int), `prompt_id` (str or int), `sample` (int), `prompt_tokens` (int >= 0) and
  `response_tokens` (int >= 1) are required. One step's lines are one RL step's rollout batch, in the
  order the samples were submitted; a prompt's `sample`s form its group.
- `drafted`/`accepted` (optional): speculative draft tokens proposed/accepted for that sequence; their
  ratio is the sequence's per-token acceptance for HistoSpec (else `--acceptance`).
- `predicted_tokens` (optional): a length prediction for HistoPipe. When absent it is the mean length of
  the prompt's group the last time the same `prompt_id` appeared in an earlier step; prompts never seen
  before get a prediction with Spearman rank correlation `--rank-corr` to their group's real mean length.
- Any other field is ignored. Only finished sequences belong in a length trace (a run's `aborted` and
  `cached` sequence events carry partial lengths and are skipped by `from_run_trace`).

vLLM/veRL logs: one line per generated sample with the prompt's id, the sample's index within its group,
`len(prompt_token_ids)` and `len(output.token_ids)` (vLLM `RequestOutput`), the RL step as `step`; and,
with speculative decoding on, the per-request draft/accepted counts where the framework logs them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np

from reference_trainer.errors import MAX_COUNT, UserError
from reference_trainer.trace.records import read_jsonl, write_text
from reference_trainer.trace.schema import SEQUENCE

REQUIRED = ("step", "prompt_id", "sample", "prompt_tokens", "response_tokens")
MAX_TOKENS = 1 << 24  # a prompt or response longer than any context window: a corrupt log, not a workload


@dataclass
class LengthTrace:
    """Columns of one row per sequence, ordered by (step, submission order). Groups are (step, prompt)."""

    step: np.ndarray  # int
    prompt: np.ndarray  # int code of prompt_id
    sample: np.ndarray  # int
    prompt_tokens: np.ndarray  # int
    response_tokens: np.ndarray  # int >= 1
    acceptance: np.ndarray  # float per-token draft acceptance, nan = unknown
    predicted: np.ndarray  # float predicted response length, nan = unknown
    prompt_names: list[str] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return int(self.step.size)

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.step.tolist()))

    def summary(self) -> dict[str, object]:
        r = self.response_tokens
        per_step = np.bincount(np.searchsorted(self.steps, self.step))
        groups = len(set(zip(self.step.tolist(), self.prompt.tolist(), strict=True)))
        return {
            "source": self.source,
            "sequences": len(self),
            "steps": len(self.steps),
            "groups": groups,
            "sequences_per_step": float(per_step.mean()) if len(self) else 0.0,
            "response_tokens_mean": float(r.mean()) if len(self) else 0.0,
            "response_tokens_p50": float(np.median(r)) if len(self) else 0.0,
            "response_tokens_max": int(r.max()) if len(self) else 0,
            "prompt_tokens_mean": float(self.prompt_tokens.mean()) if len(self) else 0.0,
        }


# LengthTrace's array columns and their dtypes.
COLUMNS = {k: np.int64 for k in ("step", "prompt", "sample", "prompt_tokens", "response_tokens")}
COLUMNS |= {"acceptance": np.float64, "predicted": np.float64}


def _from_rows(rows: list[dict], source: str) -> LengthTrace:
    names: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in COLUMNS}
    for row in rows:
        cols["step"].append(int(row["step"]))
        cols["prompt"].append(names.setdefault(str(row["prompt_id"]), len(names)))
        cols["sample"].append(int(row["sample"]))
        cols["prompt_tokens"].append(max(0, int(row["prompt_tokens"])))
        cols["response_tokens"].append(max(1, int(row["response_tokens"])))
        drafted = int(row.get("drafted") or 0)
        acceptance = min(1.0, int(row.get("accepted") or 0) / drafted) if drafted > 0 else math.nan
        cols["acceptance"].append(acceptance)
        pred = row.get("predicted_tokens")
        cols["predicted"].append(float(pred) if pred is not None else math.nan)
    order = np.argsort(np.asarray(cols["step"], dtype=np.int64), kind="stable")  # keep submission order
    arrays = {k: np.asarray(v, dtype=COLUMNS[k])[order] for k, v in cols.items()}
    trace = LengthTrace(**arrays, prompt_names=list(names), source=source)
    if len(trace) == 0:
        raise UserError(f"{source}: no sequences in the trace")
    return trace


def read_rows(path: Path) -> list[dict]:
    """A length trace's or run trace's rows; a run killed mid-flush leaves a torn last line, dropped."""
    if not path.exists():  # one that exists is read as a regular file (records.read_jsonl says why not)
        raise UserError(f"{path}: no such trace file")
    return read_jsonl(path)


def load(path: str | Path) -> LengthTrace:
    """A length-trace JSONL file, a run's trace.jsonl, or a run directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "trace.jsonl"
    rows = read_rows(path)
    if any(r.get("kind") is not None for r in rows):  # an rlbench run trace, not a length trace
        return from_run_trace(rows, str(path))
    for n, row in enumerate(rows, 1):
        missing = [k for k in REQUIRED if row.get(k) is None]
        if missing:
            raise UserError(f"{path}: line {n} lacks {', '.join(missing)} (see `rlbench simulate --help`)")
        for key, high in (
            ("step", MAX_COUNT),
            ("sample", MAX_COUNT),
            ("prompt_tokens", MAX_TOKENS),
            ("response_tokens", MAX_TOKENS),
        ):
            if type(row[key]) is not int or not 0 <= row[key] <= high:  # 2^63 overflowed the int64 arrays
                raise UserError(
                    f"{path}: line {n}: {key} is {repr(row[key])[:40]}, not an integer in 0..{high:,}"
                )
    return _from_rows(rows, str(path))


def from_run_trace(events: list[dict], source: str = "trace.jsonl") -> LengthTrace:
    """The finished `sequence` events of an rlbench run (aborted/cached ones hold partial lengths)."""
    rows = [e for e in events if e.get("kind") == SEQUENCE and e.get("status", "finished") == "finished"]
    return _from_rows(rows, source)


def write(trace: LengthTrace, path: str | Path) -> Path:
    """Write a trace in the JSONL length-trace format (so a converted or synthetic trace can be reused)."""
    lines = []
    for i in range(len(trace)):
        row: dict[str, object] = {
            "step": int(trace.step[i]),
            "prompt_id": trace.prompt_names[trace.prompt[i]] if trace.prompt_names else int(trace.prompt[i]),
            "sample": int(trace.sample[i]),
            "prompt_tokens": int(trace.prompt_tokens[i]),
            "response_tokens": int(trace.response_tokens[i]),
        }
        if not math.isnan(trace.acceptance[i]):
            row.update(drafted=1000, accepted=round(1000 * float(trace.acceptance[i])))
        if not math.isnan(trace.predicted[i]):
            row["predicted_tokens"] = round(float(trace.predicted[i]), 2)
        lines.append(json.dumps(row))
    path = Path(path)
    write_text(path, "\n".join(lines) + "\n")
    return path


def latent_corr(spearman: float) -> float:
    """The Gaussian correlation whose Spearman rank correlation is `spearman` (Pearson 1907)."""
    return float(2.0 * math.sin(math.pi * float(np.clip(spearman, -1.0, 1.0)) / 6.0))


def fill_predictions(trace: LengthTrace, rank_corr: float, seed: int = 0) -> np.ndarray:
    """Per-sequence predicted lengths: the trace's own, else the prompt's previous group mean, else a draw
    with rank correlation `rank_corr` to the group's real mean (documented as an assumption in reports)."""
    pred = trace.predicted.copy()
    if not np.isnan(pred).any():
        return pred
    n_p = int(trace.prompt.max()) + 1
    uniq, inv = np.unique(trace.step * n_p + trace.prompt, return_inverse=True)
    gmean = np.bincount(inv, weights=trace.response_tokens) / np.bincount(inv)
    g_step, g_prompt = uniq // n_p, uniq % n_p
    order = np.lexsort((g_step, g_prompt))  # each prompt's groups in step order
    prev = np.full(uniq.size, np.nan)
    same = g_prompt[order[1:]] == g_prompt[order[:-1]]
    prev[order[1:][same]] = gmean[order[:-1][same]]  # the prompt's group mean one appearance earlier
    pred = np.where(np.isnan(pred), prev[inv], pred)
    missing = np.isnan(pred)
    if missing.any():
        rng = np.random.default_rng(seed)
        r = latent_corr(rank_corr)
        z_real = _normal_scores(np.log(gmean))
        z_pred = r * z_real + math.sqrt(max(0.0, 1.0 - r * r)) * rng.standard_normal(uniq.size)
        # map the predicted score back onto the real group-mean distribution (ranks carry the information)
        pred_g = np.quantile(gmean, _norm_cdf(z_pred))
        pred[missing] = pred_g[inv[missing]]
    return pred


def _normal_scores(x: np.ndarray) -> np.ndarray:
    ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
    inv_cdf = np.vectorize(NormalDist().inv_cdf)
    return inv_cdf((ranks + 0.5) / x.size)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return np.vectorize(NormalDist().cdf)(z)


ACCEPTANCE_CONCENTRATION = 20.0  # a + b of a synthetic sequence's Beta acceptance: its spread about the mean


def synthetic(
    steps: int = 10,
    prompts: int = 64,
    group_size: int = 8,
    mean_tokens: float = 2000.0,
    sigma: float = 1.0,
    prompt_share: float = 0.6,
    max_tokens: int = 16384,
    prompt_tokens: int = 256,
    rank_corr: float = 0.8,
    overlap: float = 0.8,
    seed: int = 0,
) -> LengthTrace:
    """Heavy-tailed (log-normal, truncated at `max_tokens`) lengths with per-prompt difficulty.

    log L = mu + sigma * (sqrt(prompt_share) * z_prompt + sqrt(1 - prompt_share) * eps): `prompt_share` of
    the log-variance is the prompt's, so samples of a prompt resemble each other. Every step is a new epoch
    over the same `prompts`, with z_prompt drifting so consecutive epochs' per-prompt lengths have Spearman
    rank correlation `rank_corr`; `predicted_tokens` is the prompt's mean length in the previous epoch
    (step 0 draws a virtual previous epoch). Per-sequence acceptance ~ Beta with mean `overlap`, the share
    of tokens the history can draft (RhymeRL reports 75-95% reusable).
    """
    rng = np.random.default_rng(seed)
    mu = math.log(mean_tokens) - sigma**2 / 2.0  # so the untruncated mean is mean_tokens
    r = latent_corr(rank_corr)
    a, b = math.sqrt(prompt_share), math.sqrt(1.0 - prompt_share)
    z = rng.standard_normal(prompts)

    def epoch(zp: np.ndarray) -> np.ndarray:
        eps = rng.standard_normal((prompts, group_size))
        return np.clip(np.exp(mu + sigma * (a * zp[:, None] + b * eps)), 1, max_tokens).astype(np.int64)

    prev = epoch(z)
    cols: dict[str, list] = {k: [] for k in ("step", "prompt", "sample", "response_tokens", "predicted")}
    for s in range(steps):
        z = r * z + math.sqrt(1.0 - r * r) * rng.standard_normal(prompts)  # AR(1): stationary N(0, 1)
        cur = epoch(z)
        cols["step"].append(np.full(prompts * group_size, s))
        cols["prompt"].append(np.repeat(np.arange(prompts), group_size))
        cols["sample"].append(np.tile(np.arange(group_size), prompts))
        cols["response_tokens"].append(cur.ravel())
        cols["predicted"].append(np.repeat(prev.mean(axis=1), group_size).astype(np.float64))
        prev = cur
    n, conc = steps * prompts * group_size, ACCEPTANCE_CONCENTRATION
    acc = rng.beta(overlap * conc, (1.0 - overlap) * conc, n) if 0.0 < overlap < 1.0 else np.full(n, overlap)
    pt = np.repeat(
        np.maximum(1, rng.normal(prompt_tokens, prompt_tokens * 0.25, steps * prompts)), group_size
    )
    return LengthTrace(
        **{k: np.concatenate(v) for k, v in cols.items()},
        prompt_tokens=pt.astype(np.int64),
        acceptance=acc,
        prompt_names=[f"p{i}" for i in range(prompts)],
        source=f"synthetic(steps={steps}, prompts={prompts}, group={group_size}, mean={mean_tokens:g}, "
        f"sigma={sigma:g}, rank_corr={rank_corr:g}, overlap={overlap:g}, seed={seed})",
    )
