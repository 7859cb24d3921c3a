"""HistoSpec benchmark: GRPO for several epochs over a fixed prompt pool, plain vs HistoSpec in one process.

    python -m benchmarks.histospec [--model DIR] [--epochs 4] [--pool 8] [--group 8] [--lr LR]
                                   [--task-option KEY=VALUE ...] [--temperature T]

The `histospec-speedup` reproduction's runs (rlbench/reproduce/histospec.py), with this command's sizes:
two trainers (`baseline` and `rhyme`) start from the same weights with the same seeds and take their steps
in turn, so both see the same machine load. Per epoch it prints rollout tokens/s of both (net: accepted
tokens only), the speed-up and its per-step range, the load-drift check on the update (`!`: flagged),
acceptance, tokens per verification, draft coverage and the reward of both runs (speculation is exact, so
the curves must agree). Without --model it uses the embedded
model when built, else a random model of the same shape (said in the output).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import resolve_model
from reference_trainer.errors import UserError
from reference_trainer.mode_options import parse_option_pairs
from reference_trainer.trace.compare import DRIFT_TOLERANCE
from reference_trainer.trace.records import write_json
from rlbench.reproduce.histospec import Workload, epoch_row, mode_configs
from rlbench.training import interleave, open_trainers


def undrafted(events: list[dict[str, Any]], steps: range) -> dict[str, Any]:
    """Where HistoSpec cannot help: engine-step time spent in plain `decode` steps (no sequence in flight
    had a draft), overall and in the step's tail (its last 25% of rollout time, where few sequences are
    left), and the longest response of the epoch with the share of its tokens that came from drafts."""
    engine = [e for e in events if e["kind"] in ("prefill", "decode", "verify") and e["step"] in steps]
    plain, tail_plain, tail_all = 0.0, 0.0, 0.0
    for step in steps:
        mine = [e for e in engine if e["step"] == step]
        if not mine:
            continue
        t0, t1 = min(e["t_start"] for e in mine), max(e["t_end"] for e in mine)
        cut = t1 - 0.25 * (t1 - t0)
        for e in mine:
            took = e["t_end"] - e["t_start"]
            plain += took * (e["kind"] == "decode")
            if e["t_start"] >= cut:
                tail_all += took
                tail_plain += took * (e["kind"] == "decode")
    total = sum(e["t_end"] - e["t_start"] for e in engine)
    seqs = [e for e in events if e["kind"] == "sequence" and e["step"] in steps]
    longest = max(seqs, key=lambda e: e["response_tokens"], default=None)
    return {
        "plain_decode_time_share": plain / total if total else None,
        "tail_plain_decode_time_share": tail_plain / tail_all if tail_all else None,
        "longest_response": longest["response_tokens"] if longest else None,
    }


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--task", default="arith")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--pool", type=int, default=8, help="prompts in the fixed pool (one epoch)")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=None, help="AdamW's rate (default: the trainer's, 1e-4)")
    ap.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                    help="task option (repeatable), e.g. max_ops=1")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--json", default=None, help="write the per-epoch rows here")
    ap.add_argument(
        "--histospec",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="HistoSpec option (repeatable), e.g. min_confidence=0.5 max_draft=8",
    )
    args = ap.parse_args()
    try:
        histospec = parse_option_pairs(args.histospec, "--histospec")
        task_options = parse_option_pairs(args.task_option, "--task-option")
    except UserError as err:
        ap.error(str(err))
    torch.set_num_threads(args.threads)
    w = Workload(task=args.task, epochs=args.epochs, pool=args.pool, prompts_per_step=args.prompts_per_step,
                 group_size=args.group, max_tokens=args.max_tokens, temperature=args.temperature,
                 histospec=tuple(sorted(histospec.items())), seed=args.seed, seeds=1, lr=args.lr,
                 task_options=tuple(sorted(task_options.items())))  # fmt: skip
    mdir, source = resolve_model(args.model)
    configs = mode_configs(w, str(mdir), args.device)
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        open_trainers(configs, {m: Path(tmp_name) / m for m in configs}) as trainers,
    ):
        steps_per_epoch = args.pool // args.prompts_per_step
        spec = trainers["rhyme"].engine.speculator
        print(
            f"model: {source}; {args.epochs} epochs x {steps_per_epoch} steps; {args.pool} prompts x "
            f"{args.group} samples; max_tokens {args.max_tokens}; T={args.temperature}; histospec {histospec}"
        )
        print(
            "cost table (ms per forward, batch x q):",
            {f"{b}x{q}": round(t * 1e3, 2) for (b, q), t in spec.cost_model.table.items()},
        )
        header = (
            f"{'epoch':>5} {'plain tok/s':>11} {'rhyme tok/s':>11} {'speed-up':>8} {'per step':>11} "
            f"{'drift':>6} {'accept':>7} {'tok/verify':>10} {'coverage':>8} {'reward plain':>12} "
            f"{'reward rhyme':>12} {'same lens':>9} {'undrafted time':>14} {'in tail':>8} {'longest':>7}"
        )
        print(header)
        rows = []
        for epoch in range(args.epochs):
            steps = range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
            interleave(trainers, steps_per_epoch, say=lambda line: None)
            row = epoch_row(trainers, epoch, steps)
            ev = {m: t.trace.events for m, t in trainers.items()}
            seqs = {m: {e["id"]: e["response_tokens"] for e in ev[m]
                        if e["kind"] == "sequence" and e["step"] in steps} for m in ev}  # fmt: skip
            row["same_lengths"] = seqs["baseline"] == seqs["rhyme"]
            row["rhyme"].update(undrafted(ev["rhyme"], steps))
            rows.append(row)
            plain, rhyme, span, drift = row["baseline"], row["rhyme"], row["speedup_per_step"], row["drift"]
            print(
                f"{row['epoch']:>5} {plain['tokens_per_s']:>11.0f} {rhyme['tokens_per_s']:>11.0f} "
                f"{row['speedup']:>7.2f}x {span['min']:>5.2f}-{span['max']:.2f}x "
                f"{fmt(drift['ratio'], '.2f') + ('!' if drift['flagged'] else ''):>6} "
                f"{fmt(rhyme['acceptance_rate'], '.1%'):>7} {fmt(rhyme['mean_accepted_len'], '.2f'):>10} "
                f"{fmt(rhyme['draft_coverage'], '.1%'):>8} {plain['reward_mean']:>12.3f} "
                f"{rhyme['reward_mean']:>12.3f} {str(row['same_lengths']):>9} "
                f"{fmt(rhyme['plain_decode_time_share'], '.1%'):>14} "
                f"{fmt(rhyme['tail_plain_decode_time_share'], '.1%'):>8} {rhyme['longest_response']:>7}",
                flush=True,
            )
        if any(r["drift"]["flagged"] for r in rows):
            print(
                f"drift: '!' marks an epoch whose two updates cost more than {DRIFT_TOLERANCE}x apart per "
                "token: the machine's load changed, and that epoch's speed-up is not HistoSpec's"
            )
        print(
            "history:",
            spec.drafter.stats(),
            "alpha:",
            round(spec.alpha, 3),
            "correction:",
            {k: v and round(v, 2) for k, v in spec.correction.items()},
        )
        if args.json:
            write_json(args.json, rows)


if __name__ == "__main__":
    main()
