"""RhymeRL's observations about rollout history, from one GRPO run over a fixed prompt pool.

rhymerl-length-stability: per-prompt mean response length keeps its rank from one epoch to the next.
rhymerl-reuse: most tokens of epoch e+1's responses could be drafted from the same prompt's epoch-e
responses, token by token, by the project's HistoSpec drafter (`HistoryDrafter`).
Both read one baseline run (`run_history`): lengths from its trace; the trace has no token ids, so the run
wraps the rollout strategy to keep each trained sample's response ids in `responses.jsonl`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.sequence import Sequence as EngineSequence
from reference_trainer.speculation.histospec import HistoryDrafter, HistoSpecOptions
from reference_trainer.trace.records import extend_jsonl, read_json, read_jsonl, write_json
from reference_trainer.trace.schema import SEQUENCE, read_trace
from rlbench.models import resolve_model
from rlbench.report.figures import PALETTE, _fig, note
from rlbench.report.page import table
from rlbench.reproduce.base import Context, Outcome, quiet_config
from rlbench.reproduce.runner import source_commit

MOVE_SHARE = 0.10  # a rank "moves much" when it changes by more than this share of the pool
Tokens = list[int]
SHARED_BY = ("rhymerl-length-stability", "rhymerl-reuse")  # reproductions that read the same run


@dataclass(frozen=True)
class Workload:
    task: str = "arith"
    epochs: int = 6
    pool: int = 48  # prompts in the fixed pool: one epoch
    prompts_per_step: int = 8
    group_size: int = 8
    max_tokens: int | None = None  # None: the task's response budget
    seed: int = 0

    @classmethod
    def for_context(cls, ctx: Context) -> Workload:
        return cls(epochs=ctx.pick(6, 3), pool=ctx.pick(48, 24), group_size=ctx.pick(8, 2),
                   max_tokens=ctx.pick(None, 96), seed=ctx.seed)  # fmt: skip

    @property
    def steps_per_epoch(self) -> int:
        return self.pool // self.prompts_per_step


class _Recording:
    """The rollout strategy, keeping the groups it returned (for train_step: no checkpoint, no resume)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.last = inner, inner.name, []

    def collect(self, ctx: Any) -> list[Any]:
        self.last = self.inner.collect(ctx)
        return self.last


def run_history(ctx: Context, w: Workload) -> Path:
    """The run's folder (trace.jsonl, responses.jsonl), reusing a finished run of the same workload in
    ctx.work_dir/run or in the sibling reproduction's work folder; otherwise running it afresh."""
    from reference_trainer.train.trainer import Trainer

    if w.pool % w.prompts_per_step or w.epochs < 2:
        raise ValueError("need pool divisible by prompts_per_step and at least 2 epochs")
    model = str(resolve_model(ctx.model))
    # The sibling's folder is only reused from the same commit (runner.clear_stale_work guards our own).
    marker = {"workload": asdict(w), "model": model, "device": ctx.device, "commit": source_commit()}
    out, name_dir = ctx.work_dir / "run", ctx.work_dir.parent.parent  # runner: <out>/<name>/<dev>/work
    shared = ctx.work_dir.name == "work" and name_dir.name in SHARED_BY
    others = [
        name_dir.parent / n / ctx.work_dir.parent.name / "work" / "run"
        for n in SHARED_BY
        if shared and n != name_dir.name
    ]
    for folder in [out, *others]:
        done = folder / "done.json"
        if done.is_file() and read_json(done) == marker:
            ctx.progress(f"reusing the finished run in {folder}")
            return folder
    for name in ("done.json", "responses.jsonl"):
        (out / name).unlink(missing_ok=True)
    config = quiet_config(task=w.task, mode="baseline", model=model, seed=w.seed, device=ctx.device,
                          steps=w.steps_per_epoch * w.epochs, prompts_per_step=w.prompts_per_step,
                          group_size=w.group_size, max_tokens=w.max_tokens, prompt_pool=w.pool,
                          max_num_seqs=w.prompts_per_step * w.group_size, max_model_len=1024)  # fmt: skip
    trainer = Trainer(config, out)
    recorder = trainer.rollout.strategy = _Recording(trainer.strategy)  # what the loop collects through
    try:
        for step in range(config.steps):
            row = trainer.train_step()
            extend_jsonl(out / "responses.jsonl", [
                {"step": step, "prompt_id": g.problem.prompt_id, "sample": k, "tokens": list(s.response_ids)}
                for g in recorder.last for k, s in enumerate(g.samples)
            ])  # fmt: skip
            if (step + 1) % w.steps_per_epoch == 0:
                ctx.progress(
                    f"epoch {(step + 1) // w.steps_per_epoch}/{w.epochs}: mean response "
                    f"{row.get('response_len_mean') or 0:.1f} tokens"
                )
    finally:
        trainer.close()
    write_json(out / "done.json", marker)
    return out


def _by_prompt_and_epoch(rows: list[dict[str, Any]], w: Workload, field: str) -> dict[str, list[list[Any]]]:
    table: dict[str, list[list[Any]]] = {}
    for r in rows:
        epochs = table.setdefault(r["prompt_id"], [[] for _ in range(w.epochs)])
        epochs[r["step"] // w.steps_per_epoch].append(r[field])
    return table


def length_table(run: Path, w: Workload) -> dict[str, list[float]]:
    """prompt_id -> mean response length (tokens) per epoch, from the trace's finished sequences."""
    seqs = [e for e in read_trace(run / "trace.jsonl") if e["kind"] == SEQUENCE and e["status"] == "finished"]
    lens = _by_prompt_and_epoch(seqs, w, "response_tokens")
    return {p: [sum(x) / len(x) for x in per_epoch] for p, per_epoch in lens.items() if all(per_epoch)}


def response_table(run: Path, w: Workload) -> dict[str, list[list[Tokens]]]:
    """prompt_id -> per epoch, the token ids of its trained responses."""
    return _by_prompt_and_epoch(read_jsonl(run / "responses.jsonl"), w, "tokens")


def rank_stability(lengths: Sequence[Sequence[float]], move_share: float = MOVE_SHARE) -> dict[str, Any]:
    """lengths[p][e]: prompt p's mean length in epoch e. Per consecutive pair of epochs, the Spearman
    correlation and the share of prompts whose rank (ties averaged) moves by > move_share x prompts."""
    from scipy.stats import rankdata, spearmanr

    n, epochs = len(lengths), len(lengths[0])
    cols = [[row[e] for row in lengths] for e in range(epochs)]
    ranks = [rankdata(c) for c in cols]
    pairs = []
    for e in range(epochs - 1):
        moved = int(sum(abs(a - b) > move_share * n for a, b in zip(ranks[e], ranks[e + 1], strict=True)))
        pairs.append({"epochs": f"{e + 1}→{e + 2}", "spearman": float(spearmanr(cols[e], cols[e + 1])[0]),
                      "moved": moved, "moved_share": moved / n})  # fmt: skip
    return {
        "pairs": pairs,
        "ranks": [r.tolist() for r in ranks],
        "moved_share": sum(p["moved"] for p in pairs) / (n * len(pairs)),
    }


def draftable(history: Sequence[Tokens], responses: Sequence[Tokens], **options: Any) -> list[list[bool]]:
    """Per token of each response: would HistoSpec's drafter (`HistoSpecOptions(**options)`), holding only
    `history` for this prompt, have proposed exactly that token as its next draft, given the tokens before
    it? The drafter's own matching and confidence rule decide; nothing here matches suffixes."""
    drafter, key = HistoryDrafter(HistoSpecOptions(**options)), [0]  # one prompt: any key
    for tokens in history:
        drafter.add_response(key, tokens)
    out = []
    for response in responses:
        seq = EngineSequence("probe", list(key), SamplingParams())
        hits = []
        for token in response:
            hits.append(drafter.draft(seq, 1) == [token])
            seq.response_ids.append(token)
        drafter.on_done(seq, 0)  # not finished: only drops the match state, adds nothing to history
        out.append(hits)
    return out


def reuse_counts(table: dict[str, list[list[Tokens]]], **options: Any) -> list[dict[str, Any]]:
    """Per consecutive pair of epochs and prompt: tokens of epoch e+1 draftable from the prompt's epoch-e
    history, and (control) from the next prompt's (prompts in sorted order) epoch-e history."""
    prompts = sorted(table)
    rows = []
    for e in range(len(table[prompts[0]]) - 1):
        for i, p in enumerate(prompts):
            nxt = table[p][e + 1]
            own = draftable(table[p][e], nxt, **options)
            other = draftable(table[prompts[(i + 1) % len(prompts)]][e], nxt, **options)
            rows.append({"pair": e, "prompt_id": p, "tokens": sum(map(len, nxt)),
                         "hits": sum(map(sum, own)), "hits_other_prompt": sum(map(sum, other))})  # fmt: skip
    return rows


def _share(rows: list[dict[str, Any]], key: str = "hits") -> float | None:
    tokens = sum(r["tokens"] for r in rows)
    return sum(r[key] for r in rows) / tokens if tokens else None


def _config(ctx: Context, w: Workload) -> dict[str, Any]:
    return {"model": ctx.model_label(), "mode": "baseline", **asdict(w),
            "steps": w.steps_per_epoch * w.epochs, "eval_every": 0}  # fmt: skip


LENGTH_NOTES = [
    "A small char-level model (tokens are characters); each prompt's length is a mean over its group, so "
    "part of the rank movement is sampling noise of that mean.",
    "On arith a correct response's length is set by the prompt's chain of operations; a policy that still "
    "errs often (low reward here) stops early or runs on, so lengths settle only as it learns.",
]
REUSE_NOTES = [
    "Tokens are characters of a small char-level model; a character is easier to predict than a subword "
    "token, so shares here are not directly comparable with the paper's.",
    "Arith responses restate the prompt's operations line by line, so much of a response is predictable "
    "from any earlier response to the same prompt; the other-prompt control shows what the format gives.",
    "Counts the drafter's next-token proposal under its defaults (confidence cut 0.5); reuse_share_top1 "
    "drops the cut. History is the previous epoch only, not siblings of the same step.",
]
REUSE_RULE = (
    "A token counts when HistoSpec's drafter, holding only the same prompt's previous-epoch responses, "
    "proposes exactly it as the next token after the response's prefix. The control asks another prompt's "
    "history: what the task's shared format alone would draft."
)


def _rank_figure(prompts: list[str], stats: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    fig = _fig("Length rank, epoch e vs e+1 (1 = shortest)", "rank in epoch e", "rank in epoch e+1", 420)
    n, band = len(prompts), MOVE_SHARE * len(prompts)
    for i, pair in enumerate(stats["pairs"]):
        marker = {"color": PALETTE[i % len(PALETTE)], "size": 7, "opacity": 0.7}
        x, y = stats["ranks"][i], stats["ranks"][i + 1]
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=pair["epochs"], text=prompts, marker=marker))
    for d, dash in ((0, "solid"), (band, "dot"), (-band, "dot")):
        line = {"color": "grey", "dash": dash}
        fig.add_trace(go.Scatter(x=[1, n], y=[1 + d, n + d], mode="lines", line=line, showlegend=False))
    return fig


def length_stability(ctx: Context) -> Outcome:
    import plotly.graph_objects as go

    w = Workload.for_context(ctx)
    lengths = length_table(run_history(ctx, w), w)
    prompts = sorted(lengths)
    stats = rank_stability([lengths[p] for p in prompts])
    rhos = [p["spearman"] for p in stats["pairs"]]
    mean = sum(rhos) / len(rhos)
    measured = {
        "headline": f"Spearman {mean:.2f} (min {min(rhos):.2f}) between consecutive epochs; "
        f"{stats['moved_share']:.1%} of prompts move > 10% in rank",
        "spearman_mean": mean,
        "spearman_min": min(rhos),
        "rank_moved_over_10pct_share": stats["moved_share"],
        "spearman_last_pair": rhos[-1],
        "rank_moved_last_pair_share": stats["pairs"][-1]["moved_share"],
        "prompts": len(prompts),
        "epoch_pairs": len(rhos),
    }
    lines = _fig("Mean response length per prompt and epoch", "epoch", "mean response tokens (log)", 380)
    for p in prompts:
        x = list(range(1, w.epochs + 1))
        lines.add_trace(go.Scatter(x=x, y=lengths[p], mode="lines+markers", name=p, showlegend=False))
    lines.update_yaxes(type="log")
    band = f"Dotted: ±10% of the pool ({MOVE_SHARE * len(prompts):.1f} ranks); outside them = moved much."
    return Outcome(
        measured=measured,
        config=_config(ctx, w),
        seeds=[w.seed],
        sections=[
            ("Rank stability", [table(stats["pairs"]), _rank_figure(prompts, stats), note(band)]),
            ("Per-prompt lengths", [lines]),
        ],
        data={"lengths": lengths, "pairs": stats["pairs"]},
        notes=[
            f"{len(prompts)} prompts x {w.group_size} samples x {w.epochs} epochs; Spearman {rhos[0]:.2f} "
            f"for epochs 1→2, {rhos[-1]:.2f} for the last pair: early epochs weigh as much as late ones.",
            *LENGTH_NOTES,
        ],
    )


def reuse(ctx: Context) -> Outcome:
    import plotly.graph_objects as go

    w = Workload.for_context(ctx)
    responses = response_table(run_history(ctx, w), w)
    rows, top1 = reuse_counts(responses), reuse_counts(responses, min_confidence=0.0)
    per_pair = []
    for e in range(w.epochs - 1):
        mine, mine1 = [r for r in rows if r["pair"] == e], [r for r in top1 if r["pair"] == e]
        per_pair.append({"epochs": f"{e + 1}→{e + 2}", "tokens": sum(r["tokens"] for r in mine),
                         "reuse share": _share(mine), "top-1, no confidence cut": _share(mine1),
                         "other prompt's history": _share(mine, "hits_other_prompt")})  # fmt: skip
    share, other = _share(rows), _share(rows, "hits_other_prompt")
    measured = {
        "headline": f"{share:.1%} of epoch e+1's tokens draftable from epoch e's history ({other:.1%} from "
        "another prompt's)",
        "reuse_share": share,
        "reuse_share_min_pair": min(p["reuse share"] for p in per_pair),
        "reuse_share_top1": _share(top1),
        "reuse_share_other_prompt": other,
        "tokens_scored": sum(r["tokens"] for r in rows),
        "epoch_pairs": len(per_pair),
    }
    bars = _fig("Share of epoch e+1's tokens the epoch-e history drafts", "epochs", "share of tokens", 360)
    for key in ("reuse share", "top-1, no confidence cut", "other prompt's history"):
        bars.add_trace(go.Bar(name=key, x=[p["epochs"] for p in per_pair], y=[p[key] for p in per_pair]))
    bars.update_yaxes(tickformat=".0%", range=[0, 1])
    hist = _fig("Reuse share per prompt and pair of epochs", "reuse share", "prompts x pairs", 320)
    shares = [r["hits"] / r["tokens"] for r in rows if r["tokens"]]
    hist.add_trace(go.Histogram(x=shares, xbins={"start": 0, "end": 1, "size": 0.05}))
    hist.update_xaxes(tickformat=".0%", range=[0, 1])
    return Outcome(
        measured=measured,
        config={**_config(ctx, w), "drafter": "HistoryDrafter defaults (min_match 1, min_confidence 0.5)"},
        seeds=[w.seed],
        sections=[
            ("Reuse per pair of epochs", [table(per_pair), bars, note(REUSE_RULE)]),
            ("Per-prompt distribution", [hist]),
        ],
        data={"per_pair": per_pair, "per_prompt": rows},
        notes=REUSE_NOTES,
    )
