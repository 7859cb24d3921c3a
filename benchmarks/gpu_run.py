"""One GPU run, one command: the GPU path's correctness, speed, calibration and tests in stages under one
deadline.

    RLBENCH_COMMIT=<sha> python3 -m benchmarks.gpu_run --out DIR [--budget-s 540] [--stages a,b,...]
                                                     [--engine-path OLD_CHECKOUT] [--dry-run]

Made for a GPU machine available for minutes, with no package index and no git history: it needs only torch,
transformers, pytest and nvidia-ml-py, takes the commit from $RLBENCH_COMMIT, and runs each stage in a
process group of its own, capped in time (the stage's cap, and what is left of --budget-s): one stage that
hangs or fails costs only itself, and when it ends (or is cut off) every process it started ends with it.
After every stage DIR/gpu_run.json is rewritten with every stage's exit code, seconds, output tail and the
JSON it wrote, so a call cut off at its limit still returns what finished. Stages, in order
(docs/development.md, "On a GPU machine"):

  checks     correctness first (benchmarks/gpu_checks.py): keyed sampler device = CPU bitwise, graph replay
             = eager tokens at batch 64 and 256, syncs per decode step, bf16 logits against transformers
  decode     the decode step at batch 1 / 64 / 256 (benchmarks/decode_step.py): the engine at every batch
             first, then the engine before the GPU work (--engine-path) and transformers' eager generate,
             each cell written as it finishes; ms, GPU busy share, launches and copies per step
  prefill    t_prefill at 1 / 16 / 128 rows x 64 and 256 tokens, SmolLM2's shape and the embedded model
             (benchmarks/gpu_calibrate.py)
  calibrate  the calibration files (DIR/calibration/<gpu>-<model>.json): decode by rows (whole engine
             steps, with the engine's host CPU seconds per step), verify by width, the admission overhead
             (what an admission adds to a graph decode step), the prefill stage's table, update by tokens,
             the engine's source fingerprint (benchmarks/gpu_calibrate.py); copied into the package's
             rlbench/simulate/calibrations/ (--calibrations-into), so later stages replay through them
  grpo       the single-GPU GRPO step-time table in NeMo-RL's metric definitions (step time; generation,
             log-prob, training and weight sync per stage; tokens/s/GPU) for baseline, sorted and rhyme
             on SmolLM2's shape with random weights (benchmarks/grpo_table.py), and each mode's controller
             host seconds per engine step folded into the calibration of that shape, copied again
  tests      `pytest -m gpu`
  attention  the decode/verify step per attention implementation (benchmarks/gpu.py)
  static     transformers' static-cache (compiled) generate against the engine, with the time left

With --real-model PARTS_DIR the stages are the real model's instead: `gguf` (SmolLM2's GGUF, larger than
what one call to the machine carries, joined from the parts carried by consecutive calls into one folder,
e.g. /tmp, which lasts while the machine is warm, and unpacked if gzipped), `import` (`rlbench models
import-gguf`), `compare-real` (`rlbench compare --modes baseline,sorted` on it: the bubble, the rollout
ratio and the GPU replay beside them; its traces come back packed, DIR/compare-real-runs.tar.gz) and
`learning` (the learning claim: +10 points of held-out greedy accuracy within 5 minutes of training), with
the time left.

--dry-run runs the same stages on the CPU at tiny shapes (CI's rehearsal: tests/test_gpu_run.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode_step import record
from reference_trainer.trace.records import write_json
from rlbench.simulate.calibration import CALIBRATIONS, read_calibration, write_calibration

ROOT = Path(__file__).resolve().parent.parent
RESERVE_S = 10  # kept back from the budget for the last write
PACK_LIMIT = 24 << 20  # a packed run folder's most bytes: a call returns 64 MiB in all, the tree and logs too
GRACE_S = 5  # between asking a stage's processes to end and killing them


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    cap_s: int  # the most this stage may take
    argv: list[str]
    outputs: tuple[str, ...]  # JSON files (relative to --out; globs allowed), folded into gpu_run.json
    min_s: int = 20  # not started with less time than this left
    runs: Path | None = None  # a compare's folder, packed into --out after the stage: its traces come back


def stages(
    out: Path, work: Path, dry_run: bool, engine_path: str | None, decode_sides: str | None = None
) -> list[Stage]:
    py = sys.executable
    device = ["--device", "cpu", "--shape", "tiny"] if dry_run else []
    batches = "2,4" if dry_run else "1,64,256"
    before = ["--engine-path", engine_path] if engine_path else []
    decode_sides = decode_sides or ("engine,before,hf-eager" if engine_path else "engine,hf-eager")
    steps = ["--steps", "4", "--repeats", "1"] if dry_run else ["--steps", "32", "--repeats", "3"]
    calibrate = [
        py,
        "-m",
        "benchmarks.gpu_calibrate",
        "--out",
        str(out / "calibration"),
        *(["--device", "cpu", "--models", "tiny", "--quick", "--repeats", "1"] if dry_run else []),
    ]
    return [
        Stage("checks", 150, [py, "-m", "benchmarks.gpu_checks", "--out", str(out), *device],
              ("correctness.json",)),
        Stage("decode", 200, [py, "-m", "benchmarks.decode_step", "--sides", decode_sides, "--batches",
                              batches, *steps, *before, *device, "--out", str(out)], ("decode_step.json",)),
        Stage("prefill", 90, [*calibrate, "--terms", "prefill"], ("calibration/prefill/*.json",)),
        Stage("calibrate", 150, [*calibrate, "--terms", "decode,verify,update"], ("calibration/*.json",)),
        Stage("grpo", 150, [py, "-m", "benchmarks.grpo_table", "--run", str(work / "grpo"), "--shape",
                            "tiny" if dry_run else "smollm2", "--device", "cpu" if dry_run else "cuda",
                            "--steps", "1" if dry_run else "3", "--calibrations", str(out / "calibration"),
                            "--out", str(out / "grpo_table.json")], ("grpo_table.json",), min_s=60),
        Stage("tests", 200, [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs",
                             str(ROOT / "tests")], ()),
        Stage("attention", 150, ([py, "-c", "print('the attention table needs CUDA')"] if dry_run else
                                 [py, "-m", "benchmarks.gpu", "--tables", "attention", "--attention-batches",
                                  batches, "--out", str(out)]),
              ("attention.json",)),
        Stage("static", 200, [py, "-m", "benchmarks.decode_step", "--sides", "engine,hf-static", "--batches",
                              "2" if dry_run else "1,64", *steps, *device, "--out", str(out / "static")],
              ("static/decode_step.json",), min_s=60),
    ]  # fmt: skip


JOIN_GGUF = """
import gzip, shutil, sys
from pathlib import Path
parts, target = sorted(Path(sys.argv[1]).glob("*.part*")), Path(sys.argv[2])
if not parts:
    sys.exit(f"error: no GGUF parts (*.part*) in {sys.argv[1]}")
target.parent.mkdir(parents=True, exist_ok=True)
joined = target.with_name(target.name + ".joined")
with joined.open("wb") as out:
    for part in parts:
        out.write(part.read_bytes())
# gzip -1 makes SmolLM2's GGUF 6% smaller: what lets it and the wheels fit two calls' 64 MiB with the tree
with joined.open("rb") as head:
    packed_gzip = head.read(2) == b"\\x1f\\x8b"
if packed_gzip:
    with gzip.open(joined) as packed, target.open("wb") as out:
        shutil.copyfileobj(packed, out)
    joined.unlink()
else:
    joined.replace(target)
print(f"joined {len(parts)} parts: {target.stat().st_size} bytes")
"""


def real_model_stages(parts: Path, work: Path, dry_run: bool) -> list[Stage]:
    """The real model's mode: SmolLM2's GGUF, carried in parts (a machine's call carries less than the
    file), joined and imported; then `rlbench compare` of baseline and sorted on it (its runs packed into
    --out), and the learning claim (+10 points held-out within 5 minutes of training) with the time left.
    --dry-run: the same on a tiny GGUF, CPU-sized."""
    py = sys.executable
    gguf, model = work / "model.gguf", work / "model"
    learning = [py, "-m", "rlbench.cli", "reproduce", "grpo-learning-smollm2", "--model", str(model),
                "--out", str(work / "reports"), "--device", "cpu" if dry_run else "cuda",
                *(["--quick"] if dry_run else [])]  # fmt: skip
    size = (
        ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "16"]
        if dry_run
        else ["--steps", "4", "--prompts-per-step", "8", "--group-size", "8", "--max-tokens", "256"]
    )
    compare_out = work / "compare-real"
    result = work / "reports" / "grpo-learning-smollm2" / ("cpu" if dry_run else "gpu") / "result.json"
    return [
        Stage("gguf", 120, [py, "-c", JOIN_GGUF, str(parts), str(gguf)], ()),
        Stage("import", 180, [py, "-m", "rlbench.cli", "models", "import-gguf", str(gguf), "--out",
                              str(model)], ()),
        Stage("compare-real", 200, [py, "-m", "rlbench.cli", "compare", "--model", str(model), "--device",
                                    "cpu" if dry_run else "cuda", "--task", "arith", "--task-option",
                                    "max_ops=4", *size, "--modes", "baseline,sorted", "--overwrite",
                                    "--out", str(compare_out)], (str(compare_out / "compare.json"),),
              runs=compare_out),
        Stage("learning", 480, learning, (str(result),), min_s=200 if not dry_run else 20),
    ]  # fmt: skip


def tail(text: str, chars: int = 4000) -> str:
    return text[-chars:]


def end_group(group: int) -> None:
    """End every process of a stage's process group: asked first, killed after GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def pack_runs(runs: Path, target: Path) -> dict[str, Any]:
    """A compare's folder (compare.json, and each mode's trace.jsonl and metrics.json; no checkpoints) as a
    gzipped tar in --out, unless it passes PACK_LIMIT, which is said instead."""
    files = [runs / "compare.json", *sorted(runs.glob("*/trace.jsonl")), *sorted(runs.glob("*/metrics.json"))]
    with tarfile.open(target, "w:gz", compresslevel=9) as tar:
        for path in (p for p in files if p.is_file()):
            tar.add(path, arcname=str(path.relative_to(runs.parent)))
    size = target.stat().st_size
    if size > PACK_LIMIT:
        target.unlink()
        return {"left_out": f"{size} bytes packed, over the {PACK_LIMIT} a call returns"}
    return {"packed": target.name, "bytes": size}


def run_stage(stage: Stage, timeout_s: float, out: Path, log: Path) -> dict[str, Any]:
    start = time.perf_counter()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # carried wheels too
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("a") as sink:
        sink.write(f"\n===== {stage.name}: {' '.join(stage.argv)} (up to {timeout_s:.0f} s)\n")
        sink.flush()
        # a session of its own: the stage's children (a benchmark's sides, a compare's workers) are in its
        # process group, which ends with the stage, cut off or not
        proc = subprocess.Popen(stage.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=timeout_s)
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            end_group(proc.pid)
            output, rc = proc.communicate()[0], "timeout"
        finally:
            end_group(proc.pid)
        sink.write(output)
    result: dict[str, Any] = {
        "rc": rc,
        "seconds": round(time.perf_counter() - start, 1),
        "tail": tail(output),
    }
    for name in stage.outputs:
        for found in sorted(out.glob(name)) if not Path(name).is_absolute() else [Path(name)]:
            if found.is_file():
                key = str(found.relative_to(out)) if found.is_relative_to(out) else name
                result.setdefault("results", {})[key] = json.loads(found.read_text())
    if stage.runs is not None and (stage.runs / "compare.json").is_file():
        result["runs"] = pack_runs(stage.runs, out / f"{stage.name}-runs.tar.gz")
    return result


def install_calibrations(found: Path, into: Path) -> list[str]:
    """Copy the calibrate stage's files (each checked as the replay reads it) into `into`; their names."""
    installed = []
    for path in sorted(found.glob("*.json")):
        write_calibration(into, read_calibration(path))
        installed.append(path.name)
    return installed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole run's deadline")
    parser.add_argument("--stages", default="", help="comma-separated subset, in the order above")
    parser.add_argument("--engine-path", help="a checkout whose engine is the decode table's before column")
    parser.add_argument("--decode-sides", help="the decode stage's sides (benchmarks/decode_step.py --sides)")
    parser.add_argument(
        "--work",
        type=Path,
        help="runs' own files (default: a new temporary folder, so that "
        "nothing existing is written over; kept out of --out, whose files a call returns)",
    )
    parser.add_argument("--dry-run", action="store_true", help="the same stages on the CPU at tiny shapes")
    parser.add_argument("--calibrations-into", type=Path, help="where the calibrate stage's files are copied "
                        "(default: the package's calibrations; none in a dry run)")  # fmt: skip
    parser.add_argument("--real-model", type=Path, metavar="PARTS_DIR",
                        help="the real model's mode: a folder of the GGUF's parts (*.part*)")  # fmt: skip
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget_s

    def plan_in(work: Path) -> list[Stage]:
        if args.real_model is not None:
            return real_model_stages(args.real_model.resolve(), work, args.dry_run)
        return stages(args.out.resolve(), work, args.dry_run, args.engine_path, args.decode_sides)

    names = [s.name for s in plan_in(Path("."))]
    wanted = args.stages.split(",") if args.stages else names
    if unknown := sorted(set(wanted) - set(names)):
        sys.exit(f"error: --stages takes {', '.join(names)}; not {', '.join(unknown)}")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: benchmarks.gpu_run needs a CUDA GPU (--dry-run rehearses it on the CPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    # the runs' own files: a new folder unless one is given, so nothing that exists is written over
    work = (args.work or Path(tempfile.mkdtemp(prefix="rlbench-gpu-run-"))).resolve()
    plan = [s for s in plan_in(work) if s.name in wanted]
    log = args.out / "gpu_run.log"
    summary: dict[str, Any] = {**record("cpu" if args.dry_run else "cuda"), "dry_run": args.dry_run,
                               "budget_s": args.budget_s, "stages": {}}  # fmt: skip
    for stage in plan:
        left = deadline - time.perf_counter() - RESERVE_S
        if left < stage.min_s:
            summary["stages"][stage.name] = {"rc": "skipped", "why": f"{left:.0f} s left of the budget"}
        else:
            print(f"[gpu_run] {stage.name} (up to {min(stage.cap_s, left):.0f} s)", flush=True)
            summary["stages"][stage.name] = run_stage(stage, min(stage.cap_s, left), args.out, log)
            into = args.calibrations_into or (None if args.dry_run else CALIBRATIONS)
            if stage.name in ("calibrate", "grpo") and into is not None:  # grpo adds the controllers' host
                installed = install_calibrations(args.out / "calibration", into)
                summary["stages"][stage.name]["installed"] = installed
            print(f"[gpu_run] {stage.name}: rc {summary['stages'][stage.name]['rc']} in "
                  f"{summary['stages'][stage.name]['seconds']} s", flush=True)  # fmt: skip
        write_json(args.out / "gpu_run.json", summary)
    failed = [name for name, s in summary["stages"].items() if s["rc"] not in (0, "skipped")]
    print(f"[gpu_run] done: {len(plan) - len(failed)} of {len(plan)} stages ok" +
          (f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip


if __name__ == "__main__":
    main()
