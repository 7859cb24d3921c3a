"""HistoSpec benchmark: GRPO for several epochs over a fixed prompt pool, plain vs HistoSpec in one process.

    python benchmarks/histospec.py [--model DIR] [--epochs 4] [--pool 8] [--group 8]

Two trainers (`baseline` and `rhyme`) start from the same weights with the same seeds; each epoch runs the
baseline's steps, then rhyme's, so both see the same machine load. Per epoch it prints rollout tokens/s of
both (net: accepted tokens only), the speed-up, acceptance, tokens per verification, draft coverage and the
reward of both runs (speculation is exact, so the curves must agree). Without --model it uses the embedded
model when built, else a random model of the same shape (said in the output).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import resolve_model  # noqa: E402

from rlbench.records import write_json  # noqa: E402
from rlbench.reproduce.histospec import epoch_metrics as history_epoch_metrics  # noqa: E402


def epoch_metrics(events: list[dict[str, Any]], steps: range) -> dict[str, Any]:
    return {**history_epoch_metrics(events, steps), **undrafted(events, steps)}


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
    histospec = {k: json.loads(v) for k, _, v in (o.partition("=") for o in args.histospec)}
    torch.set_num_threads(args.threads)

    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mdir, source = resolve_model(args.model)
        steps_per_epoch = args.pool // args.prompts_per_step
        trainers = {}
        for mode in ("baseline", "rhyme"):
            config = TrainConfig(
                eval_every=0,
                task=args.task,
                mode=mode,
                model=str(mdir),
                seed=args.seed,
                steps=steps_per_epoch * args.epochs,
                prompts_per_step=args.prompts_per_step,
                group_size=args.group,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                max_num_seqs=args.prompts_per_step * args.group,
                max_model_len=1024,
                checkpoint_every=10**9,
                device=args.device,
                prompt_pool=args.pool,
                mode_options={"histospec": histospec} if mode == "rhyme" else {},
            )
            trainers[mode] = Trainer(config, tmp / mode)
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
            f"{'epoch':>5} {'plain tok/s':>11} {'rhyme tok/s':>11} {'speed-up':>8} {'accept':>7} "
            f"{'tok/verify':>10} {'coverage':>8} {'reward plain':>12} {'reward rhyme':>12} "
            f"{'same lens':>11} {'undrafted time':>14} {'in tail':>8} {'longest':>7}"
        )
        print(header)
        rows = []
        for epoch in range(args.epochs):
            steps = range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
            same = True
            for _ in steps:
                trainers["baseline"].train_step()
                trainers["rhyme"].train_step()
            ev = {m: t.trace.events for m, t in trainers.items()}
            seqs = {
                m: {
                    e["id"]: e["response_tokens"]
                    for e in ev[m]
                    if e["kind"] == "sequence" and e["step"] in steps
                }
                for m in ev
            }
            same = seqs["baseline"] == seqs["rhyme"]
            plain, rhyme = epoch_metrics(ev["baseline"], steps), epoch_metrics(ev["rhyme"], steps)
            speedup = rhyme["tokens_per_s"] / plain["tokens_per_s"]
            row = {"epoch": epoch, "plain": plain, "rhyme": rhyme, "speedup": speedup, "same_lengths": same}
            rows.append(row)
            print(
                f"{epoch:>5} {plain['tokens_per_s']:>11.0f} {rhyme['tokens_per_s']:>11.0f} {speedup:>7.2f}x "
                f"{fmt(rhyme['acceptance_rate'], '.1%'):>7} {fmt(rhyme['mean_accepted_len'], '.2f'):>10} "
                f"{fmt(rhyme['draft_coverage'], '.1%'):>8} {plain['reward_mean']:>12.3f} "
                f"{rhyme['reward_mean']:>12.3f} {str(same):>11} "
                f"{fmt(rhyme['plain_decode_time_share'], '.1%'):>14} "
                f"{fmt(rhyme['tail_plain_decode_time_share'], '.1%'):>8} {rhyme['longest_response']:>7}",
                flush=True,
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
