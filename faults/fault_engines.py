"""The fault drill's engines group: rollout engines that are Ray actors, lost or changed in number.

- an actor killed mid-step: `rlbench train --mode sorted --workers 2` on a local Ray (and `--mode baseline`,
  the synchronous baseline over W workers); once a step has
  finished, the first actor seen running a slice of engine steps (its process title names the method Ray
  runs) is killed with SIGKILL, as the OOM killer or a lost node would. The run must end normally with every
  step, the trace must name the lost engine (one `engine_lost` event, with the requests it held), no engine
  but the other may decode after it, and each sample must be trained once (one finished `sequence` per id,
  and every step's rows with prompts x group samples).
- a W = 2 run resumed with `--workers 1`: a step on two Ray actors, then `--resume --workers 1`, which must
  run the next step on one in-process engine and keep the first step's row as written.
- async on 2 Ray actors without --ray-address, whose rollout process (the driver of the local Ray it starts)
  is SIGKILLed after a step: the trainer must stop with one line, and within GRACE_S of its end no process
  of that Ray may be left (Ray's agents outlive a killed driver by minutes) nor any session folder in its
  RLBENCH_RAY_TMPDIR.

Each command runs in a process of its own under a deadline (Ray's start-up on a loaded machine is 10-60 s):
a hang is a failure, not a stuck drill.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from faults.fault_inputs import Check, Outcome, write_tiny_model
from faults.fault_supervision import ASYNC_RUN, _env, _finish, _start, _wait_for_a_step, rollout_children
from reference_trainer.trace.schema import ENGINE_LOST

DEADLINE_S = 300.0
GRACE_S = 5.0  # after the trainer's end: Ray's processes that are going have gone
PROMPTS, GROUP = 2, 3
RUN = ("--task", "arith", "--threads", "1", "--prompts-per-step", str(PROMPTS), "--group-size",
       str(GROUP), "--max-tokens", "24", "--eval-every", "0",
       "--checkpoint-every", "1")  # fmt: skip
# In the run's environment, so inherited by its Ray processes: the actors found are ours, not another run's.
MARK = "RLBENCH_DRILL_ENGINES"


def _ray(d: Path) -> dict[str, str]:
    """What the command's environment changes for a private local Ray: a short temp folder (Ray's sockets
    live there), no token file in a home outside the run, and the mark that finds this run's actors."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    (d / "ray_tmp").write_text(temp)
    return {"RLBENCH_RAY_TMPDIR": temp, "HOME": str(d / "home"), MARK: uuid.uuid4().hex}


def _launch(d: Path, ray: dict[str, str], *args: str) -> subprocess.Popen:
    """`rlbench ARGS` as fault_supervision starts one, in the private Ray's environment (a Ray token of
    this process's own is left out: the command makes its own)."""
    env = {
        k: v
        for k, v in _env(d).items()
        if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    }
    (d / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "rlbench.cli", *args], cwd=d, env={**env, **ray},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def _cleanup(d: Path) -> None:
    if (d / "ray_tmp").is_file():
        shutil.rmtree((d / "ray_tmp").read_text(), ignore_errors=True)


def _marked(mark: str, folder: Path | None = None) -> dict[int, str]:
    """pid -> command line (Ray retitles its processes there) of every process of this run: the command,
    its rollout process and its Ray's processes, which all inherit the mark; and, with `folder`, any
    process holding a file open in it (Ray's agents retitle themselves over their environment)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()] if folder else []
            if f"{MARK}={mark}".encode() in env or any(f.startswith(f"{folder}/") for f in fds):
                line = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                found[int(proc.name)] = " ".join(line.decode(errors="replace").split())  # Ray pads titles
        except (OSError, ValueError):
            continue
    return found


def _actors(mark: str) -> dict[int, str]:
    """pid -> process title of this run's Ray actors (Ray titles an actor `ray::RolloutWorker`, and
    `ray::RolloutWorker.METHOD` while it runs a method)."""
    return {pid: title for pid, title in _marked(mark).items() if title.startswith("ray::RolloutWorker")}


def _kill_in_a_slice(proc: subprocess.Popen, run: Path, mark: str) -> str | None:
    """After the first finished step, SIGKILL the first of the run's actors seen in `advance` (a slice of
    engine steps); its title, or None when the run ended first."""
    end = time.monotonic() + DEADLINE_S
    rows = run / "metrics.jsonl"
    while time.monotonic() < end and proc.poll() is None:
        if rows.is_file() and rows.read_text().strip():
            for pid, title in _actors(mark).items():
                if ".advance" in title:
                    os.kill(pid, signal.SIGKILL)
                    return title
            time.sleep(0.005)
        else:
            time.sleep(0.1)
    return None


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _judged(code: int | None, err: str) -> Outcome | None:
    """A failure for a command that did not end cleanly, else None."""
    if code is None:
        return Outcome(False, "no end within the deadline", failure="hang")
    if "Traceback" in err:
        return Outcome(False, err.strip()[-300:], traceback=True, failure="traceback")
    if code != 0:
        return Outcome(False, f"exit {code}: {err.strip()[-200:]}", failure="wrong")
    return None


def actor_killed_mid_step(mode: str) -> Check:
    return lambda d: _actor_killed(d, mode)


def _actor_killed(d: Path, mode: str) -> Outcome:
    model, steps, ray = write_tiny_model(d / "model"), 6, _ray(d)
    try:
        proc = _launch(d, ray, "train", "--model", str(model), *RUN, "--mode", mode, "--workers", "2",
                       "--steps", str(steps), "--out", "run")  # fmt: skip
        killed = _kill_in_a_slice(proc, d / "run", ray[MARK])
        code, err = _finish(proc, DEADLINE_S)
    finally:
        _cleanup(d)
    if (bad := _judged(code, err)) is not None:
        return bad
    if killed is None:
        return Outcome(False, "the run ended before an actor was seen in a slice", failure="wrong")
    events = _events(d / "run" / "trace.jsonl")
    rows = _events(d / "run" / "metrics.jsonl")
    lost = [e for e in events if e["kind"] == ENGINE_LOST]
    if len(lost) != 1 or lost[0]["requests"] < 1:
        return Outcome(False, f"engine_lost events: {lost}", failure="wrong")
    w, t = lost[0]["worker"], lost[0]["t_start"]
    after = {e["worker"] for e in events if e["kind"] == "decode" and e["t_start"] > t}
    ids = [e["id"] for e in events if e["kind"] == "sequence" and e["status"] == "finished"]
    samples = [r["samples"] for r in rows]
    twice = len(ids) - len(set(ids))
    missing = sum(max(0, PROMPTS * GROUP - n) for n in samples) + PROMPTS * GROUP * (steps - len(rows))
    ok = after == {1 - w} and not twice and not missing and [r["step"] for r in rows] == list(range(steps))
    detail = (f"{killed} killed: engine {w} lost in step {lost[0]['step']} holding "
              f"{lost[0]['requests']} requests; decodes after it on {sorted(after)}; {len(ids)} samples, "
              f"{twice} twice")  # fmt: skip
    return Outcome(ok, detail, lost=missing, failure="" if ok else "wrong")


def resumed_on_one(d: Path) -> Outcome:
    model, ray = write_tiny_model(d / "model"), _ray(d)
    small = ("--model", str(model), *RUN, "--mode", "sorted")
    try:
        first = _launch(d, ray, "train", *small, "--workers", "2", "--steps", "1", "--out", "run")
        code, err = _finish(first, DEADLINE_S)
    finally:
        _cleanup(d)
    if (bad := _judged(code, err)) is not None:
        return Outcome(False, f"the W = 2 run: {bad.detail}", traceback=bad.traceback, failure=bad.failure)
    row = (d / "run" / "metrics.jsonl").read_text()
    resume = _start(d, "train", "--resume", "run", "--steps", "2", "--workers", "1")
    if (bad := _judged(*_finish(resume, DEADLINE_S))) is not None:
        return bad
    events = _events(d / "run" / "trace.jsonl")
    engines = {
        s: {e.get("worker", 0) for e in events if e["kind"] == "decode" and e["step"] == s} for s in (0, 1)
    }
    rows = (d / "run" / "metrics.jsonl").read_text()
    kept = rows.startswith(row)
    ok = (
        engines == {0: {0, 1}, 1: {0}}
        and kept
        and [r["step"] for r in _events(d / "run" / "metrics.jsonl")] == [0, 1]
    )
    detail = f"engines per step {engines}; first row kept: {kept}"
    return Outcome(ok, detail, lost=0 if kept else 1, failure="" if ok else "wrong")


def _ray_of(mark: str, folder: Path) -> list[str]:
    """This run's processes that are Ray's (gcs_server, raylet, its Python services, agents and workers),
    each by its program's or script's name: all but the command and its multiprocessing children."""
    names = []
    for line in _marked(mark, folder).values():
        if "rlbench.cli" in line or "multiprocessing" in line:
            continue
        words = line.split() or ["?"]
        name = Path(words[0]).name
        if name.startswith("python"):  # Ray's services in Python: by their script
            name = next((Path(w).name for w in words[1:] if w.endswith(".py")), name)
        names.append(name)
    return sorted(names)


def async_local_ray_killed(d: Path) -> Outcome:
    model, ray = write_tiny_model(d / "model"), _ray(d)
    temp, mark = Path(ray["RLBENCH_RAY_TMPDIR"]), ray[MARK]
    try:
        proc = _launch(d, ray, "train", "--model", str(model), *ASYNC_RUN, "--workers", "2", "--steps", "60",
                       "--out", "run")  # fmt: skip
        if not _wait_for_a_step(proc, d / "run"):
            return Outcome(False, f"no step finished: {_finish(proc, 5)[1][-200:]}", failure="wrong")
        running, rollout = _ray_of(mark, temp), rollout_children(proc.pid)
        if rollout:
            os.kill(rollout[0], signal.SIGKILL)
        code, err = _finish(proc, DEADLINE_S)
        time.sleep(GRACE_S)
        left, kept = _ray_of(mark, temp), sorted(p.name for p in temp.iterdir())
    finally:
        for pid in _marked(mark, temp):  # whatever is left, not to outlive the drill
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _cleanup(d)
    lines = err.strip().splitlines()
    if code is None or "Traceback" in err:
        return Outcome(False, err.strip()[-300:] or "no end", traceback="Traceback" in err, failure="hang")
    said = code == 2 and len(lines) == 1 and "killed by SIGKILL" in lines[0]
    ok = bool(running) and bool(rollout) and said and not left and not kept
    last = lines[-1][:120] if lines else f"exit {code}"
    detail = (f"Ray while running: {running}; after the trainer's end (+{GRACE_S:g} s): processes {left}, "
              f"files in its temp folder {kept}; the trainer said: {last}")  # fmt: skip
    return Outcome(ok, detail, lost=len(left) + len(kept), failure="" if ok else "outside")


def engine_cases(work: Path) -> Iterator[tuple[str, Check]]:
    for mode in ("sorted", "baseline"):  # the controller (multi.py), and the placed baseline (placed.py)
        yield (
            f"{mode} on 2 Ray actors, one SIGKILLed in a slice: the step ends on the other",
            (actor_killed_mid_step(mode)),
        )
    yield "a run made on 2 Ray actors resumed with --workers 1", resumed_on_one
    yield (
        "async on 2 Ray actors, its rollout process (the local Ray's driver) SIGKILLed: that Ray goes too",
        (async_local_ray_killed),
    )
