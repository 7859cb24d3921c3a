"""Host work per engine step in CPU seconds, the mode's controller and the engine apart: the README compare's
rollouts (the embedded model, its default 128 slots) run without updates, per mode, read from each rollout
phase's `host_cpu_s` (reference_trainer/engine/hostclock.py).

    python -m benchmarks.controller_host [--modes baseline,sorted] [--steps 6] [--profile] [--out FILE]

The weights stay as loaded (no update runs: the policy version is bumped between rollouts as an update
would), so every step's lengths come from one policy; what is measured is the host's work for them. CPU
seconds of the rollout thread do not count time spent waiting for a core, so the figures hold on a loaded
machine, within its cache effects. `--profile` adds cProfile's top functions of the whole rollout.
Target: sorted's controller + engine + sampling <= 0.5 ms per engine step; the baseline's not growing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reference_trainer.engine.hostclock import HOST_PARTS, read_cost_s
from reference_trainer.trace.records import write_json
from reference_trainer.trace.schema import FORWARD_KINDS, ROLLOUT
from rlbench.training import build_configs, make_trainer

DEFAULT_OUT = Path(__file__).with_name("results") / "controller_host.json"
TARGET_MS = 0.5


def measure(mode: str, config: Any, steps: int, profile: bool) -> dict[str, Any]:
    """`steps` rollouts of one mode after one untimed; CPU ms per engine step by host part."""
    with tempfile.TemporaryDirectory(prefix="controller-host-") as tmp:
        trainer = make_trainer(config, Path(tmp))
        try:
            trainer.rollout.launch(0)
            profiler = cProfile.Profile()
            reads = 0
            for step in range(steps + 1):
                trainer.trace.step = step
                if profile and step > 0:
                    profiler.enable()
                before = trainer.engine.host_clock.reads
                trainer.rollout.collect()
                profiler.disable()
                reads += (trainer.engine.host_clock.reads - before) if step > 0 else 0
                trainer.rollout.take_recorded()
                trainer.engine.policy_version += 1  # as an update would: the next rollout's samples are newer
            events = [e for e in trainer.trace.events if e.get("step", 0) > 0]
        finally:
            trainer.close()
    rollouts = [e for e in events if e["kind"] == ROLLOUT]
    forwards = sum(e["kind"] in FORWARD_KINDS for e in events)
    per = {p: 1e3 * sum(e["host_cpu_s"][p] for e in rollouts) / forwards for p in HOST_PARTS}
    forward_ms = 1e3 * sum(e["forward_cpu_s"] for e in rollouts) / forwards
    row = {"mode": mode, "engine_steps_per_rollout": forwards / len(rollouts), "ms_per_engine_step": per,
           "host_ms_per_engine_step": sum(per.values()), "forward_ms_per_step": forward_ms,
           "clock_reads_per_engine_step": reads / forwards}  # fmt: skip
    if profile:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        row["profile"] = text.getvalue()
    return row


def table(rows: list[dict[str, Any]], read_ms: float) -> str:
    lines = [
        "| mode | engine steps / rollout | controller | engine | sampling + uploads "
        "| host (ms / engine step) | of it, the clock's own reads | forwards |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per = r["ms_per_engine_step"]
        r["clock_ms_per_engine_step"] = r["clock_reads_per_engine_step"] * read_ms
        lines.append(
            f"| {r['mode']} | {r['engine_steps_per_rollout']:.1f} | {per['controller']:.3f} | "
            f"{per['engine']:.3f} | {per['sampling']:.3f} | {r['host_ms_per_engine_step']:.3f} | "
            f"{r['clock_ms_per_engine_step']:.3f} ({r['clock_reads_per_engine_step']:.1f} reads) | "
            f"{r['forward_ms_per_step']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="baseline,sorted")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    modes = args.modes.split(",")
    configs = build_configs(modes, seed=args.seed, eval_every=0)
    load = os.getloadavg()[0]
    rows = [measure(m, configs[m], args.steps, args.profile) for m in modes]
    for r in rows:
        print(r.pop("profile", ""))
    read_ms = 1e3 * read_cost_s()
    print(table(rows, read_ms))
    print(f"one read of the thread's CPU clock: {1e3 * read_ms:.2f} µs of CPU here")
    command = " ".join(["python -m benchmarks.controller_host", *sys.argv[1:]])
    loads = {"load_before": load, "load_after": os.getloadavg()[0], "clock_read_ms": read_ms}
    write_json(args.out, {"command": command, "date": time.strftime("%Y-%m-%d"), **loads,
                          "target_ms": TARGET_MS, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
