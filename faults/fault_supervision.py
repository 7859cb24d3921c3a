"""The fault drill's supervision and output-path groups.

- async: a rollout run ahead whose rollout process is killed (SIGKILL, SIGTERM), whose trainer is terminated,
  whose resume lacks its run-ahead weights, whose max_staleness cannot fit (refused before its run folder,
  the corrected command then runs), whose ring's stamps file is cut mid-run (then resumed), and a resume
  given --mode-option: each must end within its deadline with one line, and no weight ring may be left in
  /dev/shm or the temporary folder.
- outputs: `--out` over the command's own input, inside another run, over a file already there; two suites
  writing one data file; the TRL callback's `overwrite` given as a string.

Every command runs in a process of its own under a deadline (DEADLINE_S): a hang is a failure, not a stuck
drill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from faults.fault_inputs import Check, Outcome, write_tiny_model
from faults.fault_inputs import damage as damage_file
from faults.fault_runs import ROOT

DEADLINE_S = 180.0
ASYNC_RUN = ("--task", "arith", "--mode", "async", "--threads", "2", "--prompts-per-step", "2",
             "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--mode-option",
             "max_staleness=1")  # fmt: skip


def _env(d: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "RLBENCH_CACHE_DIR": str(d / ".cache"), "TMPDIR": str(d / "tmp")}  # fmt: skip


def _start(d: Path, *args: str) -> subprocess.Popen:
    (d / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "rlbench.cli", *args], cwd=d, env=_env(d),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen, deadline: float = DEADLINE_S) -> tuple[int | None, str]:
    try:
        _, err = proc.communicate(timeout=deadline)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return None, err


def rings(pid: int, tmp: str | Path) -> list[Path]:
    """The weight rings of trainer `pid`, in /dev/shm and in the temporary folder `tmp` (shared with
    tests/test_async_faults.py)."""
    return [p for base in ("/dev/shm", str(tmp)) for p in Path(base).glob(f"rlbench-ring-{pid}-*")]


def rollout_children(pid: int) -> list[int]:
    """The child processes of trainer `pid` but multiprocessing's resource tracker: its rollout process."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"resource_tracker" not in cmdline:
            kids.append(int(stat.parent.name))
    return kids


def _judge(code: int | None, err: str, rings: list[Path], said: str, want: int = 2) -> Outcome:
    lines = err.strip().splitlines()
    if code is None:
        return Outcome(False, "no end within the deadline", failure="hang")
    if "Traceback" in err:
        return Outcome(False, err.strip()[-300:], traceback=True, failure="traceback")
    if rings:
        return Outcome(False, f"ring left: {rings[0]}", lost=1, failure="outside")
    ok = code == want and len(lines) == 1 and said in lines[0]
    return Outcome(ok, (lines[-1] if lines else f"exit {code}")[:300], failure="" if ok else "wrong")


def _wait_for_a_step(proc: subprocess.Popen, run: Path) -> bool:
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE_S and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().strip():
            return True
        time.sleep(0.2)
    return False


def rollout_killed(sig: signal.Signals) -> Check:
    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        proc = _start(d, "train", "--model", str(model), *ASYNC_RUN, "--steps", "60", "--out", "run")
        if not _wait_for_a_step(proc, d / "run"):
            return Outcome(False, f"no step finished: {_finish(proc, 5)[1][-200:]}", failure="wrong")
        children = rollout_children(proc.pid)
        if not children:
            return Outcome(False, "no rollout process found", failure="wrong")
        os.kill(children[0], sig)
        code, err = _finish(proc)
        return _judge(code, err, rings(proc.pid, d / "tmp"), f"killed by {sig.name}")

    return check


def trainer_terminated(d: Path) -> Outcome:
    model = write_tiny_model(d / "model")
    proc = _start(d, "train", "--model", str(model), *ASYNC_RUN, "--steps", "60", "--out", "run")
    if not _wait_for_a_step(proc, d / "run"):
        return Outcome(False, "no step finished", failure="wrong")
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    return _judge(code, err, rings(proc.pid, d / "tmp"), "interrupted", want=130)


def resume_without_history(damage: str) -> Check:
    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        proc = _start(d, "train", "--model", str(model), *ASYNC_RUN, "--steps", "2", "--out", "run")
        if _finish(proc)[0] != 0:
            return Outcome(False, "the first run failed", failure="wrong")
        latest = sorted((d / "run" / "checkpoints").glob("step-*"))[-1]
        damage_file(latest / "trainer" / "rollout_history.safetensors", damage)
        proc = _start(d, "train", "--resume", "run", "--steps", "4")
        code, err = _finish(proc)
        return _judge(
            code, err, rings(proc.pid, d / "tmp"), "rollout_history" if damage != "deleted" else "keeps none"
        )

    return check


def staleness_past_memory(d: Path) -> Outcome:
    """Refused with the settings: no ring, no file in the temporary folder, no run folder claimed, so the
    corrected command then runs."""
    model = write_tiny_model(d / "model")
    proc = _start(d, "train", "--model", str(model), *ASYNC_RUN, "--mode-option", "max_staleness=2147483647",
                  "--steps", "2", "--out", "run")  # fmt: skip
    code, err = _finish(proc)
    out = _judge(code, err, rings(proc.pid, d / "tmp"), "copies of the weights")
    left = sum(1 for _ in (d / "tmp").rglob("*"))
    if left:
        return Outcome(False, f"{left} file(s) left in the temporary folder", failure="outside")
    if not out.ok or (d / "run").exists():
        return out if not out.ok else Outcome(False, "the refused run left its folder", failure="outside")
    code, err = _finish(_start(d, "train", "--model", str(model), *ASYNC_RUN, "--steps", "1", "--out", "run"))
    return (
        out if code == 0 else Outcome(False, f"the corrected command: {err.strip()[-200:]}", failure="wrong")
    )


def stamps_cut(d: Path) -> Outcome:
    """The ring's stamps file truncated mid-run: one line (not a SIGBUS), the ring removed, and the run
    resumes."""
    model = write_tiny_model(d / "model")
    proc = _start(d, "train", "--model", str(model), *ASYNC_RUN, "--steps", "60", "--checkpoint-every", "1",
                  "--out", "run")  # fmt: skip
    if not _wait_for_a_step(proc, d / "run") or not (found := rings(proc.pid, d / "tmp")):
        return Outcome(False, f"no step or no ring: {_finish(proc, 5)[1][-200:]}", failure="wrong")
    os.truncate(found[0] / "stamps", 0)
    code, err = _finish(proc)
    out = _judge(code, err, rings(proc.pid, d / "tmp"), "was cut to 0 bytes")
    if not out.ok:
        return out
    done = len((d / "run" / "metrics.jsonl").read_text().splitlines())
    code, err = _finish(_start(d, "train", "--resume", "run", "--steps", str(done + 1)))
    resumed = len((d / "run" / "metrics.jsonl").read_text().splitlines())
    if code != 0 or resumed != done + 1:
        return Outcome(
            False, f"the resume: exit {code}, {resumed} rows: {err.strip()[-200:]}", failure="lost"
        )
    return out


def resume_with_options(d: Path) -> Outcome:
    """A resume runs with the run's own settings: --mode-option given with it is refused, not dropped."""
    proc = _start(d, "train", "--resume", "run", "--mode-option", "max_staleness=3")
    code, err = _finish(proc)
    return _judge(code, err, [], "--mode-option with --resume")


def async_supervision(work: Path) -> Iterator[tuple[str, Check]]:
    for sig in (signal.SIGKILL, signal.SIGTERM):
        yield f"rollout process killed by {sig.name}", rollout_killed(sig)
    yield "trainer terminated (SIGTERM): ring removed", trainer_terminated
    for damage in ("deleted", "folder", "fifo", "dev-zero"):
        yield f"resume with rollout_history {damage}", resume_without_history(damage)
    yield (
        "max_staleness=2147483647: refused before the run folder; the corrected command runs",
        staleness_past_memory,
    )
    yield "the ring's stamps file cut mid-run: one line, resumable", stamps_cut
    yield "train --resume with --mode-option: refused, not dropped", resume_with_options


# ---- outputs ------------------------------------------------------------------------------------------


def _lengths(d: Path) -> Path:
    rows = [
        {"step": s, "group": g, "prompt_tokens": 10, "response_tokens": [4, 2 + s]}
        for s in (0, 1)
        for g in "ab"
    ]
    (d / "lengths.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d / "lengths.jsonl"


def _refused(d: Path, said: str, *args: str, protect: tuple[Path, ...] = ()) -> Outcome:
    before = {p: p.read_bytes() for p in protect}
    code, err = _finish(_start(d, *args))
    out = _judge(code, err, [], said)
    lost = sum(p.read_bytes() != data for p, data in before.items())
    return Outcome(False, f"{lost} protected file(s) changed", lost=lost, failure="lost") if lost else out


def _imported(d: Path, name: str) -> Path:
    _finish(_start(d, "import", "lengths", str(_lengths(d)), "--workers", "1", "--out", name))
    return d / name


def output_cases(work: Path) -> Iterator[tuple[str, Check]]:
    def convert_over_input(d: Path) -> Outcome:
        run = _imported(d, "run")
        return _refused(
            d, "input", "trace", "convert", "run", "--out", "run/trace.jsonl", protect=(run / "trace.jsonl",)
        )

    def audit_over_input(d: Path) -> Outcome:
        log = _lengths(d)
        return _refused(d, "input", "audit", str(log), "--slots", "8", "--out", str(log), protect=(log,))

    def convert_into_another_run(d: Path) -> Outcome:
        other = _imported(d, "other")
        log = _lengths(d)
        return _refused(d, "--overwrite", "trace", "convert", str(log), "--out", "other/metrics.json",
                        protect=(other / "metrics.json",))  # fmt: skip

    def import_over_a_finished_import(d: Path) -> Outcome:
        run = _imported(d, "run")
        return _refused(d, "--overwrite", "import", "lengths", "lengths.jsonl", "--out", "run",
                        protect=(run / "trace.jsonl",))  # fmt: skip

    def suites_on_one_file(d: Path) -> Outcome:
        for name in ("sa", "sb"):
            text = f"name: {name}\ntitle: {name}\nprompt: math\ngrader: math\ndata:\n  file: one.jsonl\n"
            (d / f"{name}.yaml").write_text(text)
        (d / "one.jsonl").write_text(json.dumps({"id": "p0", "problem": "1+1?", "answer": "2"}) + "\n")
        return _refused(d, "both write data.file", "suites", "download", "sa", "sb", "--include-path", str(d),
                        "--to", "data")  # fmt: skip

    def trl_overwrite_string(d: Path) -> Outcome:
        run = _imported(d, "run")
        code = ("import sys; from rlbench.integrations.trl import RLBenchRecorder\n"
                "from reference_trainer.errors import UserError\n"
                "try:\n    RLBenchRecorder(sys.argv[1], overwrite='false')\n"
                "except UserError as e:\n    print('error:', e, file=sys.stderr); sys.exit(2)")  # fmt: skip
        before = (run / "trace.jsonl").read_bytes()
        proc = subprocess.Popen([sys.executable, "-c", code, "run"], cwd=d, env=_env(d), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        code_, err = _finish(proc)
        if (run / "trace.jsonl").read_bytes() != before:
            return Outcome(False, "the recorded run was wiped", lost=1, failure="lost")
        return _judge(code_, err, [], "overwrite must be True or False")

    yield "trace convert --out its own input", convert_over_input
    yield "audit --out its own input", audit_over_input
    yield "trace convert --out inside another run", convert_into_another_run
    yield "import over a finished import without --overwrite", import_over_a_finished_import
    yield "suites download: two suites on one data file", suites_on_one_file
    yield "TRL callback overwrite='false'", trl_overwrite_string


if __name__ == "__main__":  # one case by name, for a look at what it prints
    with tempfile.TemporaryDirectory() as tmp:
        for family in (async_supervision, output_cases):
            for name, check in family(Path(tmp)):
                if sys.argv[1] in name:
                    (Path(tmp) / "case").mkdir(exist_ok=True)
                    print(name, vars(check(Path(tmp) / "case")))
