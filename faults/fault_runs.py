"""The fault drill's groups that need processes of their own or a disk: `train` and `eval` killed at chosen
points and resumed, Ctrl-C in start-up, `train` and `profile`, two writers of one run directory, and full or
read-only disks (a tmpfs mounted for the drill when this process may, else os.write/os.replace patched)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from faults.fault_inputs import (
    TINY_RUN,
    Check,
    Outcome,
    Ran,
    cli,
    one_line,
    write_suite,
    write_tiny_model,
)
from reference_trainer.trace.schema import ROLLOUT

ROOT = Path(__file__).resolve().parents[1]


def process(*args: str, cwd: Path, timeout: float = 120) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlbench.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 180) -> Ran:
    out, err = proc.communicate(timeout=timeout)
    return Ran(proc.returncode, out, err)


def run(*args: str, cwd: Path) -> Ran:
    return finish(process(*args, cwd=cwd))


def rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, limit: float = 60) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.01)
    return False


# ---- kill / resume -----------------------------------------------------------------------------------------

STEPS = 5


def train_args(model: Path, out: str, *extra: str) -> tuple[str, ...]:
    return ("train", "--model", str(model), "--steps", str(STEPS), "--checkpoint-every", "3", *TINY_RUN,
            "--out", out, *extra)  # fmt: skip


def profile_args(model: Path, out: str) -> tuple[str, ...]:
    return ("profile", "--model", str(model), "--steps", str(STEPS), *TINY_RUN, "--out", out)


def resumed_run_is_whole(d: Path, before: bytes, ran: Ran) -> Outcome:
    metrics = d / "run" / "metrics.jsonl"
    steps = [r["step"] for r in rows(metrics)]
    rollouts = [e["step"] for e in rows(d / "run" / "trace.jsonl") if e.get("kind") == ROLLOUT]
    kept = metrics.is_file() and metrics.read_bytes().startswith(before)
    temps = list((d / "run").glob("checkpoints/.step-*")) + list((d / "run").glob(".*.tmp"))
    lost = (0 if kept else 1) + (len(range(STEPS)) - len(set(steps) & set(range(STEPS))))
    ok = (
        ran.code == 0
        and steps == list(range(STEPS))
        and rollouts == list(range(STEPS))
        and not temps
        and kept
    )
    return Outcome(ok, f"steps {steps}, rollouts {rollouts}, temps {len(temps)}", lost, ran.traceback)


def kill_after(k: int | None, delay: float = 0.0) -> Check:
    """SIGKILL `train` once k steps are logged (None: `delay` s after start), then `--resume`."""

    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        proc = process(*train_args(model, "run"), cwd=d)
        if k is None:
            time.sleep(delay)
        else:
            wait_for(lambda: len(rows(d / "run" / "metrics.jsonl")) >= k, proc)
        proc.kill()
        first = finish(proc)
        metrics = d / "run" / "metrics.jsonl"
        before = metrics.read_bytes() if metrics.is_file() else b""
        if not (d / "run" / "train_config.json").is_file():  # killed before the run existed
            resumed = run("train", "--resume", "run", cwd=d)
            said = one_line(resumed, "rlbench train --out run")
            if not said.ok:
                return said
            return resumed_run_is_whole(d, b"", run(*train_args(model, "run"), cwd=d))
        result = resumed_run_is_whole(d, before, run("train", "--resume", "run", cwd=d))
        result.traceback = result.traceback or first.traceback
        return result

    return check


def kill_in_final_heldout(d: Path) -> Outcome:
    model = write_tiny_model(d / "model")
    args = (
        "train",
        "--model",
        str(model),
        "--steps",
        "2",
        *TINY_RUN[:-2],
        "--eval-every",
        "2",
        "--out",
        "run",
    )
    proc = process(*args, cwd=d)
    wait_for(lambda: len(rows(d / "run" / "metrics.jsonl")) >= 2, proc)
    proc.kill()
    first = finish(proc)
    hit = not (d / "run" / "heldout.json").exists()
    ran = run("train", "--resume", "run", cwd=d)
    heldout = d / "run" / "heldout.json"
    curve = json.loads(heldout.read_text())["curve"] if heldout.is_file() else []
    ok = ran.code == 0 and [p["step"] for p in curve] == [0, 2]
    detail = f"killed {'before' if hit else 'after'} heldout.json; curve steps {[p['step'] for p in curve]}"
    return Outcome(ok, detail, 0 if curve else 1, ran.traceback or first.traceback)


def eval_args(model: Path, data: Path, out: str) -> tuple[str, ...]:
    return ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(model), "--out", out,
            "--max-tokens", "6", "--temperature", "1.0", "-k", "2", "--device", "cpu")  # fmt: skip


def kill_eval(after_rows: int) -> Check:
    def check(d: Path) -> Outcome:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data", rows=150)
        straight = run(*eval_args(model, data, "straight"), cwd=d)
        proc = process(*eval_args(model, data, "ev"), cwd=d)
        wait_for(lambda: len(rows(d / "ev" / "problems.jsonl")) >= after_rows, proc)
        proc.kill()
        finish(proc)
        ran = run(*eval_args(model, data, "ev"), cwd=d)
        want, got = (json.loads((d / x / "results.json").read_text()) for x in ("straight", "ev"))
        same = [p["correct"] for p in want["problems"]] == [p["correct"] for p in got["problems"]]
        lost = abs(want["problems_evaluated"] - got["problems_evaluated"])
        ok = ran.code == straight.code == 0 and same and not lost
        return Outcome(ok, f"{got['problems_evaluated']} problems", lost, ran.traceback or straight.traceback)

    return check


def kill_resume(work: Path) -> Iterator[tuple[str, Check]]:
    yield "train killed in start-up (0.3 s), then --resume", kill_after(None, 0.3)
    for k in (1, 3, STEPS):  # before the first checkpoint, at it (every 3 steps), in the last one
        yield f"train killed after {k} logged step(s), then --resume", kill_after(k)
    yield "train killed in its final held-out evaluation, then --resume", kill_in_final_heldout
    yield "eval killed after its first problem, then rerun", kill_eval(1)


# ---- signals -----------------------------------------------------------------------------------------------


def interrupt_start_up(delay: float) -> Check:
    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        proc = process("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2", cwd=d)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        ran = finish(proc)
        ours = any(str(ROOT / unit) in ran.err for unit in ("rlbench", "reference_trainer"))
        if ran.traceback and not ours:
            # not one frame of the project's: a loaded machine's interpreter was still starting (site,
            # runpy) at `delay`, where only Python's own traceback can come (docs/limits.md)
            return Outcome(True, f"exit {ran.code}: the interpreter's own start-up, before any rlbench code")
        ok = ran.code in (0, 130, -signal.SIGINT) and not ran.traceback
        return Outcome(ok, f"exit {ran.code}: {ran.err.strip()[-120:]}", traceback=ran.traceback)

    return check


def interrupt(command: str) -> Check:
    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        args = train_args(model, "run") if command == "train" else profile_args(model, "run")
        proc = process(*args, cwd=d)
        wait_for(lambda: len(rows(d / "run" / "metrics.jsonl")) >= 2, proc)
        proc.send_signal(signal.SIGINT)
        ran = finish(proc)
        said = ran.code == 130 and ran.err.strip().count("\n") == 0 and ran.err.startswith("interrupted: ")
        if command == "train":
            result = resumed_run_is_whole(d, b"", run("train", "--resume", "run", cwd=d))
        else:
            rerun = run(*args, cwd=d)
            refused = one_line(rerun, "already holds a training run: pass --overwrite")
            again = run(*args, "--overwrite", cwd=d)
            result = Outcome(refused.ok and again.code == 0, refused.detail, traceback=again.traceback)
        return Outcome(said and result.ok, f"{ran.err.strip()[-160:]} | {result.detail}", result.lost,
                       ran.traceback or result.traceback)  # fmt: skip

    return check


def signals(work: Path) -> Iterator[tuple[str, Check]]:
    # From 0.15 s: in the first ~50 ms the interpreter itself is starting (site, runpy), before any rlbench
    # code runs, and a Ctrl-C there gets Python's own traceback (docs/limits.md).
    for delay in (0.15, 0.3, 0.6, 1.0, 1.5, 2.5):
        yield f"Ctrl-C {delay} s into start-up (generate)", interrupt_start_up(delay)
    yield "Ctrl-C during train, then --resume", interrupt("train")
    yield "Ctrl-C during profile, a rerun refused, then --overwrite", interrupt("profile")


# ---- concurrency -------------------------------------------------------------------------------------------


def two_writers(first: str, second: str) -> Check:
    def check(d: Path) -> Outcome:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data", rows=40)
        commands = {
            "train": train_args(model, "run"),
            "profile": profile_args(model, "run"),
            "eval": eval_args(model, data, "run"),
        }
        a, b = process(*commands[first], cwd=d), process(*commands[second], cwd=d)
        ran = [finish(a), finish(b)]
        refused = [r for r in ran if r.code == 2 and r.err.count("\n") == 1 and
                   ("in use by another rlbench process" in r.err or "already holds" in r.err)]  # fmt: skip
        done = [r for r in ran if r.code == 0]
        lost = 0
        if first == second == "eval":
            ids = [r["id"] for r in rows(d / "run" / "problems.jsonl")]
            lost = abs(len(ids) - 40) + len(ids) - len(set(ids))
        elif "train" in (first, second):
            steps = [r["step"] for r in rows(d / "run" / "metrics.jsonl")]
            lost = int(steps != list(range(STEPS)))
        ok = len(refused) == 1 and len(done) == 1 and not lost
        detail = " | ".join(f"exit {r.code}: {r.err.strip()[-100:]}" for r in ran)
        return Outcome(ok, detail, lost, any(r.traceback for r in ran))

    return check


def concurrency(work: Path) -> Iterator[tuple[str, Check]]:
    for first, second in (("train", "train"), ("eval", "eval"), ("train", "profile"), ("eval", "train")):
        yield f"{first} and {second} on one --out at once", two_writers(first, second)


# ---- full and read-only disks ------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(where: Path, size_kb: int) -> Iterator[Callable[[str], None] | None]:
    """A tmpfs of `size_kb` at `where`, and a function to remount it ("ro" / "rw"); None when this process
    cannot mount (the cases then patch os.write / os.replace instead)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)],
                             capture_output=True).returncode == 0  # fmt: skip
    if not mounted:
        yield None
        return
    try:
        yield lambda mode: subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path, leave_kb: int) -> None:
    """Fill the file system at `where` but `leave_kb`."""
    free = shutil.disk_usage(where).free - leave_kb * 1024
    with open(where / "filler", "wb") as fh, contextlib.suppress(OSError):
        fh.write(b"\0" * max(0, free))


@contextlib.contextmanager
def patched(name: str, code: int) -> Iterator[None]:
    real = getattr(os, name)

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    setattr(os, name, fail)
    try:
        yield
    finally:
        setattr(os, name, real)


def disk_case(kind: str, command: str) -> Check:
    """`command` on a full (`kind` = "full") or read-only disk: one line, exit 2, nothing lost."""

    def check(d: Path) -> Outcome:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        with small_disk(d / "disk", 16384) as remount:
            disk = d / "disk" if remount else d
            seed = disk / "run"  # a finished run to report on, export, resume
            ready = cli(*train_args(model, str(seed)), cwd=d)
            ready_eval = cli(*eval_args(model, data, str(disk / "ev")), cwd=d)
            if ready.code != 0 or ready_eval.code != 0:
                return Outcome(False, f"setup failed: {ready.err[-200:]} {ready_eval.err[-200:]}")
            before = {p: p.read_bytes() for p in disk.rglob("*") if p.is_file() and p.name != ".rlbench.lock"}
            args = disk_command(command, model, data, seed, disk, d)
            if remount is not None:
                if kind == "full":
                    fill(disk, leave_kb=64 if command == "train --resume" else 0)
                else:
                    remount("ro")
                ran = run(*args, cwd=d)
            else:
                call, code = ("write", errno.ENOSPC) if kind == "full" else ("replace", errno.EROFS)
                with patched(call, code):
                    ran = cli(*args, cwd=d)
            if remount is not None and kind != "full":
                remount("rw")
            (disk / "filler").unlink(missing_ok=True)
            lost = sum(1 for p, data_ in before.items() if not p.is_file() or p.read_bytes() != data_)
            if command == "train --resume":  # what a full disk stopped: nothing kept changed, and it goes on
                lost = len(
                    [s for s in range(STEPS) if s not in [r["step"] for r in rows(seed / "metrics.jsonl")]]
                )
            result = one_line(ran, after_progress=command == "models import-gguf")
            how = "tmpfs" if remount else "patched"
            return Outcome(result.ok, f"{how}: {result.detail}", lost, result.traceback)

    return check


def disk_command(command: str, model: Path, data: Path, seed: Path, disk: Path, d: Path) -> tuple[str, ...]:
    """The command line of a disk case: each writes onto `disk`, where `seed` is a finished run."""
    if command == "train":
        return ("train", "--model", str(model), "--steps", "2", *TINY_RUN, "--out", str(disk / "new"))
    if command == "train --resume":
        return ("train", "--resume", str(seed), "--steps", str(STEPS + 2))
    if command == "eval":
        return eval_args(model, data, str(disk / "ev2"))
    if command == "report":
        return ("report", str(seed), str(disk / "ev"))
    if command == "trace export":
        return ("trace", "export", str(seed))
    return ("models", "import-gguf", str(gguf_file(d)), "--out", str(disk / "gguf"))


def gguf_file(where: Path) -> Path:
    """A tiny GGUF file, written by the GGUF import tests' writer (tests/gguf_tiny.py, loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gguf_tiny", ROOT / "tests" / "gguf_tiny.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = where / "Tiny-Llama.Q8_0.gguf"
    module.write_tiny_gguf(path)
    return path


def disks(work: Path) -> Iterator[tuple[str, Check]]:
    commands = ["train", "train --resume", "eval", "report", "trace export", "models import-gguf"]
    for kind in ("full", "read-only"):
        for command in commands:
            yield f"{command} on a {kind} disk", disk_case(kind, command)
