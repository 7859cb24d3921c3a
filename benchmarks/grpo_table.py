"""A single-GPU GRPO step-time table in NeMo-RL's metric definitions, from a `rlbench compare` folder.

    python -m benchmarks.grpo_table COMPARE_DIR [--gpus 1] [--keep-first] [--out FILE]
    python -m benchmarks.grpo_table --run WORK [--shape smollm2|tiny] [--device cuda] [--out FILE]

`--run` first runs `rlbench compare --modes baseline,sorted,rhyme` in WORK on a model of the shape with
random weights (and a character tokenizer padded to its vocabulary): every response then runs to the token
budget, so the table times the stages on the shape; it is not what SortedRL buys on real lengths.

NeMo-RL's performance summary (docs/about/performance-summary.md there) tracks, per GRPO step:
- step time: the whole step, "training, generation, policy logprobs, and refit";
- per stage, its seconds and tokens/s/GPU = tokens the stage processed / (the stage's seconds x GPUs).
Here, per mode, the mean over the compare's steps (step 0 left out unless `--keep-first`: it pays the
first update's and the engines' warm-ups) of each step's rows (reference_trainer/train/rows.py):
- step time: `step_time_s`;
- generation: `timing_s/gen`, with the tokens it generated (`rollout_tokens`);
- log-prob: the reference trainer computes the old and reference log-probs inside its update (one pass per
  micro-batch, train/grpo.py), so that stage has no time of its own: shown as part of training;
- training: `timing_s/update`, with the tokens it processed (`update_tokens`: prompts and responses);
- weight sync (NeMo-RL's refit): `timing_s/sync`;
- tokens/s/GPU of the step: generated tokens / (step time x GPUs).
Reward and the gaps between phases are in the step time and in no stage, as in NeMo-RL's.
No public table covers 0.1-1.5B models on one GPU; benchmarks/gpu_run.py writes this one for SmolLM2's
shape (stage `grpo`) and, with --real-model, for SmolLM2 itself (stage `compare-real`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import read_json, write_json

COLUMNS = (
    ("step_s", "step time (s)"),
    ("generation_s", "generation (s)"),
    ("logprob_s", "log-prob (s)"),
    ("training_s", "training (s)"),
    ("weight_sync_s", "weight sync (s)"),
    ("generation_tok_s_gpu", "generation tokens/s/GPU"),
    ("training_tok_s_gpu", "training tokens/s/GPU"),
    ("step_tok_s_gpu", "tokens/s/GPU (step)"),
)


def _mean(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in steps if isinstance(s.get(key), int | float)]
    return statistics.mean(values) if values and len(values) == len(steps) else None


def _rate(tokens: float | None, seconds: float | None, gpus: int) -> float | None:
    return tokens / (seconds * gpus) if tokens is not None and seconds else None


def mode_row(run: dict[str, Any], gpus: int, skip_first: bool) -> dict[str, Any]:
    """One mode's row: NeMo-RL's step time and per-stage seconds and tokens/s/GPU, means over its steps."""
    steps = [s for s in run["steps"] if not (skip_first and s.get("step") == 0)] or run["steps"]
    step, gen = _mean(steps, "step_time_s"), _mean(steps, "timing_s/gen")
    train, generated = _mean(steps, "timing_s/update"), _mean(steps, "rollout_tokens")
    trained = _mean(steps, "update_tokens")
    return {
        "mode": run["mode"],
        "steps": len(steps),
        "step_s": step,
        "generation_s": gen,
        "logprob_s": None,  # inside training (train/grpo.py): no stage of its own
        "training_s": train,
        "weight_sync_s": _mean(steps, "timing_s/sync"),
        "generation_tok_s_gpu": _rate(generated, gen, gpus),
        "training_tok_s_gpu": _rate(trained, train, gpus),
        "step_tok_s_gpu": _rate(generated, step, gpus),
    }


def table(compare_dir: Path, gpus: int = 1, skip_first: bool = True) -> list[dict[str, Any]]:
    doc = read_json(compare_dir / "compare.json")
    return [mode_row(run, gpus, skip_first) for run in doc["runs"]]


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(key: str, value: Any) -> str:
        if value is None:
            return "in training" if key == "logprob_s" else "n/a"
        return f"{value:.0f}" if key.endswith("tok_s_gpu") else f"{value:.3f}"

    lines = ["| mode | " + " | ".join(name for _, name in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        lines.append(f"| {r['mode']} | " + " | ".join(cell(k, r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def shape_model(shape: str, folder: Path) -> Path:
    """A model of `shape` with random weights and a character tokenizer padded to its vocabulary."""
    import torch

    from benchmarks.decode_step import TINY_SHAPE
    from benchmarks.gpu import SMOLLM2_SHAPE
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer

    torch.manual_seed(0)
    config = SMOLLM2_SHAPE if shape == "smollm2" else TINY_SHAPE
    save_model(DecoderLM(config), folder)
    chars = CharTokenizer().vocab
    CharTokenizer(chars + [f"<{i}>" for i in range(len(chars), config.vocab_size)]).save(folder)
    return folder


def run_compare(work: Path, shape: str, device: str, steps: int) -> Path:
    """`rlbench compare` of baseline, sorted and rhyme on a model of `shape` (random weights), in `work`."""
    import subprocess

    model, out = shape_model(shape, work / f"{shape}-model"), work / "grpo-compare"
    big = shape == "smollm2"
    size = ["--prompts-per-step", "8" if big else "2", "--group-size", "8" if big else "2",
            "--max-tokens", "128" if big else "8"]  # fmt: skip
    cmd = [sys.executable, "-m", "rlbench.cli", "compare", "--model", str(model), "--device", device,
           "--task", "arith", "--modes", "baseline,sorted,rhyme", "--steps", str(steps), "--eval-every", "0",
           *size, "--overwrite", "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0:
        sys.exit(f"error: the compare failed (exit {done.returncode})")
    return out


def controller_host(compare_dir: Path) -> dict[str, float]:
    """Per mode, its controller's CPU seconds per engine step in the compare (the rollout phases'
    `host_cpu_s`, engine/hostclock.py), on this machine's CPU: on the GPU machine, the calibration's term."""
    from reference_trainer.trace.schema import FORWARD_KINDS, ROLLOUT, read_trace

    out = {}
    for run in read_json(compare_dir / "compare.json")["runs"]:
        events = read_trace(compare_dir / run["mode"] / "trace.jsonl")
        steps = sum(e.get("kind") in FORWARD_KINDS for e in events)
        seconds = sum(
            (e.get("host_cpu_s") or {}).get("controller", 0.0) for e in events if e["kind"] == ROLLOUT
        )
        if steps:
            out[run["mode"]] = seconds / steps
    return out


def fold_into(calibrations: Path, compare_dir: Path) -> list[str]:
    """Write each mode's controller seconds per engine step into the calibrations in `calibrations` of the
    compare's model shape that measured the engine's host work (`host["controller_s_per_step"]`, what the
    GPU replay adds per engine step for the mode); their names."""
    from dataclasses import replace

    from rlbench.simulate.calibration import model_shape, read_calibration, write_calibration

    shape, per_mode, written = None, controller_host(compare_dir), []
    for run in read_json(compare_dir / "compare.json")["runs"]:
        shape = shape or model_shape(read_json(compare_dir / run["mode"] / "train_config.json")["model"])
    for path in sorted(calibrations.glob("*.json")):
        cal = read_calibration(path)
        if cal.shape == shape and cal.host is not None and per_mode:
            write_calibration(
                calibrations, replace(cal, host={**cal.host, "controller_s_per_step": per_mode})
            )
            written.append(path.name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare_dir", type=Path, nargs="?")
    parser.add_argument("--run", type=Path, help="run the compare first, in this folder")
    parser.add_argument("--shape", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--calibrations", type=Path, help="fold each mode's controller host seconds per "
                        "engine step into this folder's calibrations of the model's shape")  # fmt: skip
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--keep-first", action="store_true", help="count step 0 too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.run is not None:
        args.compare_dir = run_compare(args.run, args.shape, args.device, args.steps)
    if args.compare_dir is None or not (args.compare_dir / "compare.json").is_file():
        sys.exit(f"error: {args.compare_dir}: no compare.json (a `rlbench compare` output folder)")
    if args.gpus < 1:
        sys.exit("error: --gpus must be at least 1")
    rows = table(args.compare_dir, args.gpus, skip_first=not args.keep_first)
    print(markdown(rows))
    if args.calibrations is not None:
        written = fold_into(args.calibrations, args.compare_dir) or "no calibration of this shape"
        print(f"controller host per engine step: {controller_host(args.compare_dir)}; written into {written}")
    if args.out:
        write_json(args.out, {"command": " ".join(["python -m benchmarks.grpo_table", *sys.argv[1:]]),
                              "definitions": "NeMo-RL performance summary: step time; per stage seconds and "
                              "tokens/s/GPU = tokens / (stage seconds x GPUs)", "gpus": args.gpus,
                              "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
