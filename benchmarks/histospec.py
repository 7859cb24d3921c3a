"""Drafter benchmark: GRPO for several epochs over a fixed prompt pool, plain vs HistoSpec and/or
SuffixDecoding in one process.

    python -m benchmarks.histospec [--drafter histospec,suffix] [--model DIR] [--epochs 4] [--pool 8]
                                   [--group 8] [--lr LR] [--task-option KEY=VALUE ...] [--temperature T]
                                   [--histospec KEY=VALUE ...] [--suffix KEY=VALUE ...]

The `histospec-speedup` reproduction's runs (rlbench/reproduce/histospec.py), with this command's sizes:
`baseline` and one trainer per drafter (`rhyme` for histospec, `suffix` for SuffixDecoding) start from the
same weights with the same seeds and take their steps in turn, so all see the same machine load, and, the
verification being exact, they generate the same rollouts. Per epoch and drafter it prints rollout tokens/s
(net: accepted tokens only), the speed-up over `baseline` and its per-step range, the load-drift check on
the update (`!`: flagged), acceptance, tokens per verification, draft coverage, the share of verified draft
tokens drafted from other prompts (`SourceCounter`), the reward of both runs (the curves must agree) and
where drafting could not help. Without --model it uses the embedded model when built, else a random model
of the same shape (said in the output).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import resolve_model
from reference_trainer.errors import UserError
from reference_trainer.modes import parse_option_pairs
from reference_trainer.speculation.drafters import DRAFTERS
from reference_trainer.trace.compare import DRIFT_TOLERANCE
from reference_trainer.trace.records import write_json
from reference_trainer.trace.schema import DECODE, SEQUENCE
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
            plain += took * (e["kind"] == DECODE)
            if e["t_start"] >= cut:
                tail_all += took
                tail_plain += took * (e["kind"] == DECODE)
    total = sum(e["t_end"] - e["t_start"] for e in engine)
    seqs = [e for e in events if e["kind"] == SEQUENCE and e["step"] in steps]
    longest = max(seqs, key=lambda e: e["response_tokens"], default=None)
    return {
        "plain_decode_time_share": plain / total if total else None,
        "tail_plain_decode_time_share": tail_plain / tail_all if tail_all else None,
        "longest_response": longest["response_tokens"] if longest else None,
    }


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _text(tokens: list[int]) -> str:
    return "".join(chr(t + 1) for t in tokens)  # one character per token; chr(0) separates texts


class SourceCounter:
    """Wraps a drafter: of the draft tokens the engine verified, how many were drafted from other prompts'
    responses, i.e. the matched context plus the draft up to that token occurs nowhere in this prompt's own
    text (the prompt with each of its responses: finished, aborted or running, this one included).
    HistoSpec drafts only from this prompt's responses, so this measures what SuffixDecoding's global tree
    adds. Its own time is counted (`seconds`): it runs inside the timed engine steps."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.own: dict[tuple[int, ...], list[str]] = {}  # prompt -> its finished texts (prompt + response)
        self.running: dict[Any, tuple[tuple[int, ...], str]] = {}  # sequence -> (prompt, its text so far)
        self.flags: dict[Any, list[bool]] = {}  # sequence -> its last draft's tokens: from another prompt?
        self.verified = self.foreign = self.foreign_accepted = 0
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:  # stats, add_response, ...: the wrapped drafter's
        return getattr(self.inner, name)

    def take(self) -> dict[str, Any]:
        """The counts since the last call, reset."""
        out = {
            "verified_draft_tokens": self.verified,
            "from_other_prompts": self.foreign / self.verified if self.verified else None,
            "acceptance_from_other_prompts": self.foreign_accepted / self.foreign if self.foreign else None,
            "attribution_s": self.seconds,
        }
        self.verified = self.foreign = self.foreign_accepted = 0
        self.seconds = 0.0
        return out

    def draft(self, seq: Any, limit: int) -> list[int]:
        out = self.inner.draft(seq, limit)
        t0 = time.perf_counter()
        key = tuple(seq.prompt_ids)
        _, text = self.running.get(seq, (key, ""))
        have = len(text) - len(seq.prompt_ids)
        text = (text or _text(seq.prompt_ids)) + _text(seq.response_ids[max(have, 0) :])
        self.running[seq] = (key, text)
        flags: list[bool] = []
        if out:
            siblings = [t for k, t in self.running.values() if k == key]
            own = "\0".join([*self.own.get(key, []), *siblings])
            match = getattr(self.inner, "last_match", {}).get(seq, 0)
            context = text[len(text) - match :] if match else ""
            # The longest draft prefix found in the own text (a prefix of a found string is found too).
            lo, hi = 0, len(out)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if own.find(context + _text(out[:mid])) >= 0:
                    lo = mid
                else:
                    hi = mid - 1
            flags = [i >= lo for i in range(len(out))]
        self.flags[seq] = flags
        self.seconds += time.perf_counter() - t0
        return out

    def observe(self, seq: Any, drafted: int, accepted: int) -> None:
        self.inner.observe(seq, drafted, accepted)
        flags = self.flags.get(seq, [])
        self.verified += drafted
        self.foreign += sum(flags[:drafted])
        self.foreign_accepted += sum(flags[: min(accepted, drafted)])

    def on_done(self, seq: Any, epoch: int) -> None:
        self.inner.on_done(seq, epoch)
        key = tuple(seq.prompt_ids)
        self.running.pop(seq, None)
        self.flags.pop(seq, None)
        self.own.setdefault(key, []).append(_text(seq.prompt_ids + seq.response_ids))


MODE_OF = {"histospec": "rhyme", "suffix": "suffix"}  # the mode that runs each drafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = ", ".join(DRAFTERS)
    ap.add_argument("--drafter", default="histospec", help=f"drafters beside plain decoding: {choices}")
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
    for name, example in (("histospec", "min_confidence=0.5 max_draft=8"), ("suffix", "suffix_min_prob=0.1")):
        ap.add_argument(f"--{name}", action="append", default=[], metavar="KEY=VALUE",
                        help=f"option of the {name} run (repeatable), e.g. {example}")  # fmt: skip
    args = ap.parse_args()
    drafters = [d for d in args.drafter.split(",") if d]
    if not drafters or any(d not in DRAFTERS for d in drafters):
        ap.error(f"--drafter takes {', '.join(DRAFTERS)} (comma-separated), got {args.drafter!r}")
    try:
        options = {d: parse_option_pairs(getattr(args, d), f"--{d}") for d in drafters}
        task_options = parse_option_pairs(args.task_option, "--task-option")
    except UserError as err:
        ap.error(str(err))
    torch.set_num_threads(args.threads)
    w = Workload(task=args.task, epochs=args.epochs, pool=args.pool, prompts_per_step=args.prompts_per_step,
                 group_size=args.group, max_tokens=args.max_tokens, temperature=args.temperature,
                 seed=args.seed, seeds=1, lr=args.lr,
                 task_options=tuple(sorted(task_options.items())))  # fmt: skip
    mdir, source = resolve_model(args.model)
    configs = mode_configs(w, str(mdir), args.device, ("baseline",))
    for d in drafters:
        mine = replace(w, spec=tuple(sorted(options[d].items())))
        configs |= mode_configs(mine, str(mdir), args.device, (MODE_OF[d],))
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        open_trainers(configs, {m: Path(tmp_name) / m for m in configs}) as trainers,
    ):
        specs = {d: trainers[MODE_OF[d]].engine.speculation for d in drafters}
        for spec in specs.values():
            # One cost table for every drafter (the first one's): the gate decides alike, only drafts differ.
            spec.cost_model = specs[drafters[0]].cost_model
            spec.drafter = SourceCounter(spec.drafter)
        steps_per_epoch = args.pool // args.prompts_per_step
        print(
            f"model: {source}; {args.epochs} epochs x {steps_per_epoch} steps; {args.pool} prompts x "
            f"{args.group} samples; max_tokens {args.max_tokens}; T={args.temperature}; runs interleaved: "
            f"{', '.join(trainers)}; options {options}"
        )
        print(
            "cost table (ms per forward, batch x q):",
            {f"{b}x{q}": round(t * 1e3, 2) for (b, q), t in specs[drafters[0]].cost_model.table.items()},
        )
        header = (
            f"{'epoch':>5} {'drafter':>9} {'plain tok/s':>11} {'tok/s':>7} {'speed-up':>8} {'per step':>11} "
            f"{'drift':>6} {'accept':>7} {'tok/verify':>10} {'coverage':>8} {'other prompts':>13} "
            f"{'reward plain':>12} {'reward':>7} {'same lens':>9} {'undrafted time':>14} {'in tail':>8}"
        )
        print(header)
        rows = []
        for epoch in range(args.epochs):
            steps = range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
            interleave(trainers, steps_per_epoch, say=lambda line: None)
            ev = {m: t.trace.events for m, t in trainers.items()}
            seqs = {m: {e["id"]: e["response_tokens"] for e in ev[m]
                        if e["kind"] == SEQUENCE and e["step"] in steps} for m in ev}  # fmt: skip
            row: dict[str, Any] = {"epoch": epoch + 1}
            for d in drafters:
                mode = MODE_OF[d]
                pair = epoch_row({"baseline": trainers["baseline"], mode: trainers[mode]}, epoch, steps)
                row["baseline"] = pair["baseline"]
                mine = pair[mode]
                mine.update(undrafted(ev[mode], steps))
                mine.update(specs[d].drafter.take())
                mine |= {key: pair[key] for key in ("speedup", "speedup_per_step", "drift")}
                mine |= {"mode": mode, "same_lengths": seqs["baseline"] == seqs[mode]}
                row[d] = mine
                plain, drift = pair["baseline"], pair["drift"]
                span = fmt((pair["speedup_per_step"] or {}).get("min"), ".2f") + "-"
                span += fmt((pair["speedup_per_step"] or {}).get("max"), ".2f") + "x"
                print(
                    f"{row['epoch']:>5} {d:>9} {plain['tokens_per_s']:>11.0f} {mine['tokens_per_s']:>7.0f} "
                    f"{pair['speedup']:>7.2f}x {span:>11} "
                    f"{fmt(drift['ratio'], '.2f') + ('!' if drift['flagged'] else ''):>6} "
                    f"{fmt(mine['acceptance_rate'], '.1%'):>7} {fmt(mine['mean_accepted_len'], '.2f'):>10} "
                    f"{fmt(mine['draft_coverage'], '.1%'):>8} {fmt(mine['from_other_prompts'], '.1%'):>13} "
                    f"{plain['reward_mean']:>12.3f} {mine['reward_mean']:>7.3f} "
                    f"{str(mine['same_lengths']):>9} "
                    f"{fmt(mine['plain_decode_time_share'], '.1%'):>14} "
                    f"{fmt(mine['tail_plain_decode_time_share'], '.1%'):>8}",
                    flush=True,
                )
            rows.append(row)
        if any(r[d]["drift"]["flagged"] for r in rows for d in drafters):
            print(
                f"drift: '!' marks an epoch whose two updates cost more than {DRIFT_TOLERANCE}x apart per "
                "token: the machine's load changed, and that epoch's speed-up is not the drafter's"
            )
        for d, spec in specs.items():
            spent = sum(r[d]["attribution_s"] for r in rows) / sum(r[d]["rollout_s"] for r in rows)
            print(
                f"{d}:",
                spec.drafter.stats(),
                "alpha:",
                round(spec.alpha, 3),
                "correction:",
                {k: v and round(v, 2) for k, v in spec.correction.items()},
                f"other-prompt accounting: {spent:.1%} of its rollout time (counted in it)",
            )
        for trainer in trainers.values():
            trainer.close()
        if args.json:
            cpu = f"{os.cpu_count()}-core {platform.machine()} CPU" if args.device == "cpu" else args.device
            write_json(args.json, {
                "command": "python -m benchmarks.histospec " + " ".join(sys.argv[1:]),
                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "device": f"{cpu}, torch {torch.__version__}, {args.threads} threads",
                "model": source,
                "rows": rows,
            })  # fmt: skip


if __name__ == "__main__":
    main()
