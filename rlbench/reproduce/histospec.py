"""HistoSpec's speed-up: baseline and rhyme over the same prompt pool for several epochs, from one process.

Both trainers start from the same weights with the same seeds and take their steps in turn, so both see the
same machine load. Per epoch: rollout tokens/s of both (net: accepted tokens only), the per-step speed-up's
range, acceptance, tokens per verification and draft coverage, from each run's trace
(reference_trainer.trace.metrics), and a drift check on the update, which HistoSpec does not change: an
epoch whose two updates cost more than DRIFT_TOLERANCE apart per token was measured under changing load.
Epoch 1 has no history to draft from; the claim is about epochs 2 on. `python -m benchmarks.histospec` is
the command-line face of the same code, with more columns.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from reference_trainer.trace.compare import DRIFT_TOLERANCE, drift_check
from reference_trainer.trace.metrics import step_metrics, summary
from reference_trainer.train.config import TrainConfig
from rlbench.models import resolve_model
from rlbench.report.page import table
from rlbench.reproduce.base import Context, Outcome, quiet_config
from rlbench.training import interleave, open_trainers


@dataclass(frozen=True)
class Workload:
    task: str = "arith"
    epochs: int = 4
    pool: int = 8  # prompts in the fixed pool: one epoch
    prompts_per_step: int = 4
    group_size: int = 8
    max_tokens: int = 200
    temperature: float = 1.0
    task_options: tuple[tuple[str, Any], ...] = ()  # over the task's defaults
    spec: tuple[tuple[str, Any], ...] = ()  # speculation options, `spec.*` without the prefix (drafters.py)
    lr: float | None = None  # None: the trainer's default (the embedded model's); pretrained ones want less
    seed: int = 0
    seeds: int = 3  # seed, seed + 1, ...: the speed-up is a mean over them, with its sd

    @classmethod
    def for_context(cls, ctx: Context) -> Workload:
        return cls(epochs=ctx.pick(4, 2), pool=ctx.pick(8, 4), seed=ctx.seed, seeds=ctx.pick(3, 1))


def epoch_metrics(events: list[dict[str, Any]], steps: range) -> dict[str, Any]:
    """Rollout tokens/s (net), acceptance, tokens per verification, draft coverage and reward over `steps`."""
    rows = [m for m in step_metrics(events) if m["step"] in steps]
    tokens = sum(m["rollout_tokens"] for m in rows)
    wall = sum(m["timing_s/gen"] for m in rows)
    drafted = sum(m["drafted_tokens"] for m in rows)
    vseqs = sum(m["verify_seqs"] for m in rows)
    dsteps = sum(m["decode_seq_steps"] for m in rows)
    return {
        "tokens_per_s": tokens / wall if wall else None,
        "tokens": tokens,
        "rollout_s": wall,
        "drafted_tokens": drafted,
        "accepted_tokens": sum(m["accepted_tokens"] for m in rows),
        "acceptance_rate": sum(m["accepted_tokens"] for m in rows) / drafted if drafted else None,
        "mean_accepted_len": sum(m["verify_tokens"] for m in rows) / vseqs if vseqs else None,
        "draft_coverage": sum(m["drafted_seqs"] for m in rows) / dsteps if dsteps else None,
        "reward_mean": sum(m["reward_mean"] for m in rows) / len(rows) if rows else None,
        "update_s_per_ktoken": summary(events, rows)["update_s_per_ktoken"],
        "tokens_per_s_per_step": [m["rollout_tokens_per_s"] for m in rows],
    }


def mode_configs(
    w: Workload, model: str, device: str, modes: tuple[str, ...] = ("baseline", "rhyme")
) -> dict[str, TrainConfig]:
    """The runs, alike in everything but the mode: by default plain decoding (`baseline`) and HistoSpec
    (`rhyme`). `w.spec` holds the speculation options of every speculative mode among `modes`."""

    def run_config(mode: str) -> TrainConfig:
        return quiet_config(
            task=w.task,
            task_options=dict(w.task_options),
            mode=mode,
            model=model,
            seed=w.seed,
            steps=w.pool // w.prompts_per_step * w.epochs,
            prompts_per_step=w.prompts_per_step,
            group_size=w.group_size,
            max_tokens=w.max_tokens,
            temperature=w.temperature,
            max_num_seqs=w.prompts_per_step * w.group_size,
            max_model_len=1024,
            prompt_pool=w.pool,
            device=device,
            mode_options={"spec": dict(w.spec)} if mode != "baseline" and w.spec else {},
            lr=w.lr,
        )

    return {mode: run_config(mode) for mode in modes}


def epoch_row(trainers: dict[str, Any], epoch: int, steps: range) -> dict[str, Any]:
    """One epoch of two runs, plain first (keys: the trainers' names): their metrics, the pooled speed-up
    of the second over the first, its per-step range and the drift check."""
    (plain_name, plain), (spec_name, spec) = (
        (n, epoch_metrics(t.trace.events, steps)) for n, t in trainers.items()
    )
    per_step = sorted(
        r / p
        for p, r in zip(plain["tokens_per_s_per_step"], spec["tokens_per_s_per_step"], strict=True)
        if p and r
    )
    return {
        "epoch": epoch + 1,
        plain_name: plain,
        spec_name: spec,
        "speedup": spec["tokens_per_s"] / plain["tokens_per_s"],
        "speedup_per_step": {"min": per_step[0], "max": per_step[-1]} if per_step else None,
        "drift": drift_check({plain_name: plain, spec_name: spec}),
    }


def run_epochs(ctx: Context, w: Workload) -> list[dict[str, Any]]:
    """Per-epoch rows of both runs (kept in work_dir: a rerun with the same workload reuses them)."""
    if (done := ctx.finished(f"seed{w.seed}/epochs.json", asdict(w), f"runs of seed {w.seed}")) is not None:
        return done
    torch.manual_seed(w.seed)
    configs = mode_configs(w, str(resolve_model(ctx.model)), ctx.device)
    per_epoch = w.pool // w.prompts_per_step
    epochs = []
    with open_trainers(configs, {m: ctx.work_dir / f"seed{w.seed}" / m for m in configs}) as trainers:
        for epoch in range(w.epochs):
            interleave(trainers, per_epoch, say=lambda line: None)
            row = epoch_row(trainers, epoch, range(epoch * per_epoch, (epoch + 1) * per_epoch))
            drift = " (load drifted)" if row["drift"]["flagged"] else ""
            accepted = row["rhyme"]["acceptance_rate"] or 0
            speedup = f"speed-up {row['speedup']:.2f}x{drift}, acceptance {accepted:.1%}"
            ctx.progress(f"seed {w.seed} epoch {epoch + 1}/{w.epochs}: {speedup}")
            epochs.append(row)
    return ctx.finish(f"seed{w.seed}/epochs.json", asdict(w), epochs)


def _figure(epochs: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [e["epoch"] for e in epochs]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(name="rollout speed-up (rhyme / baseline)", x=x, y=[e["speedup"] for e in epochs]))
    accepted = [e["rhyme"]["acceptance_rate"] for e in epochs]
    fig.add_trace(go.Scatter(name="acceptance", x=x, y=accepted, mode="lines+markers"), secondary_y=True)
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="HistoSpec per epoch (epoch 1 has no history)", height=360, xaxis_title="epoch",
                      xaxis={"dtick": 1}, legend={"orientation": "h", "y": -0.25})  # fmt: skip
    fig.update_yaxes(title_text="speed-up", secondary_y=False)
    fig.update_yaxes(title_text="acceptance", tickformat=".0%", range=[0, 1], secondary_y=True)
    return fig


def from_epoch2(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's net rollout speed-up over epochs 2 on (tokens / rollout time, pooled) and its drafts."""
    later = epochs[1:]
    plain_s = sum(e["baseline"]["rollout_s"] for e in later)
    rhyme_s = sum(e["rhyme"]["rollout_s"] for e in later)
    plain_tok = sum(e["baseline"]["tokens"] for e in later)
    rhyme_tok = sum(e["rhyme"]["tokens"] for e in later)
    return {
        "speedup": (rhyme_tok / rhyme_s) / (plain_tok / plain_s) if later and plain_s and rhyme_s else None,
        "drafted": sum(e["rhyme"]["drafted_tokens"] for e in later),
        "accepted": sum(e["rhyme"]["accepted_tokens"] for e in later),
    }


def _range(span: dict[str, float] | None) -> str:
    return "-" if not span else f"{span['min']:.2f}-{span['max']:.2f}x"


def _drift(drift: dict[str, Any] | None) -> str:
    if not drift or drift.get("ratio") is None:
        return "-"
    return f"{drift['ratio']:.2f}x apart" + (" (flagged)" if drift["flagged"] else "")


CPU_NOTE = (
    "Rollout speed-up only: the paper's 2.61x is end to end on GPUs with 7B-32B models, where a "
    "verification forward costs about what a decode step does. On this CPU a forward's cost grows "
    "with the tokens it scores, so accepted drafts buy less."
)


def speedup(ctx: Context, w: Workload | None = None, setting_note: str = CPU_NOTE) -> Outcome:
    w = w or Workload.for_context(ctx)
    per_seed = {w.seed + k: run_epochs(ctx, replace(w, seed=w.seed + k)) for k in range(w.seeds)}
    summary = {s: from_epoch2(epochs) for s, epochs in per_seed.items()}
    gains = [r["speedup"] for r in summary.values() if r["speedup"] is not None]
    gain = statistics.fmean(gains) if gains else None
    drafted = sum(r["drafted"] for r in summary.values())
    acceptance = sum(r["accepted"] for r in summary.values()) / drafted if drafted else None
    epochs = per_seed[w.seed]
    n = len(per_seed)
    spread = f", sd {statistics.stdev(gains):.2f} over {n} seeds" if len(gains) > 1 else ""
    measured = {
        "headline": f"{gain:.2f}x rollout, {acceptance:.0%} accepted (epochs 2-{w.epochs}{spread})"
        if gain and acceptance is not None
        else "no history epochs",
        "rollout_speedup_from_epoch2": gain,
        "rollout_speedup_from_epoch2_sd": statistics.stdev(gains) if len(gains) > 1 else None,
        "acceptance_from_epoch2": acceptance,
        "drafted_tokens": drafted,
        "rollout_speedup_epoch1": statistics.fmean(e[0]["speedup"] for e in per_seed.values()),
        "rollout_speedup_last_epoch": statistics.fmean(e[-1]["speedup"] for e in per_seed.values()),
        "epochs_with_load_drift": sum(
            bool((e.get("drift") or {}).get("flagged")) for es in per_seed.values() for e in es
        ),
    }
    rows = [
        {"epoch": e["epoch"], "baseline tok/s": e["baseline"]["tokens_per_s"],
         "rhyme tok/s": e["rhyme"]["tokens_per_s"], "speed-up": e["speedup"],
         "per step (min-max)": _range(e.get("speedup_per_step")),
         "load drift": _drift(e.get("drift")), "acceptance": e["rhyme"]["acceptance_rate"],
         "tokens per verify": e["rhyme"]["mean_accepted_len"], "draft coverage": e["rhyme"]["draft_coverage"],
         "reward baseline": e["baseline"]["reward_mean"], "reward rhyme": e["rhyme"]["reward_mean"]}
        for e in epochs
    ]  # fmt: skip
    seed_rows = [{"seed": s, "speed-up from epoch 2": r["speedup"],
                  "acceptance from epoch 2": r["accepted"] / r["drafted"] if r["drafted"] else None}
                 for s, r in summary.items()]  # fmt: skip
    return Outcome(
        measured=measured,
        config={"model": ctx.model_label(), **asdict(w)},
        seeds=list(per_seed),
        sections=[
            ("Speed-up and acceptance per seed", [table(seed_rows)]),
            (f"Per epoch (seed {w.seed})", [table(rows), _figure(epochs)]),
        ],
        data={"epochs": epochs, "per_seed": {str(s): r for s, r in summary.items()}},
        notes=[
            setting_note,
            "Speculation is exact (histospec-lossless), so both runs' rewards may differ only through "
            "sampling noise of the same distribution.",
            f"The speed-up is the mean over {n} seed(s) of each seed's pooled epochs 2 on; acceptance pools "
            "every seed's drafts.",
            f"Load drift: the two runs' updates (the same work whatever the decoding) cost more than "
            f"{DRIFT_TOLERANCE:.1f}x apart per token in {measured['epochs_with_load_drift']} epoch(s); "
            "such an epoch's speed-up reflects the machine, not HistoSpec.",
        ],
    )
