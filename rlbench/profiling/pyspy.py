"""py-spy: sample a process (a pid, the current process, or a child command) into speedscope JSON + SVG.

py-spy writes one format per run. We record once, as speedscope (the richest format: per-thread sample
stacks in time order), and render the SVG flame graph ourselves from that same file. Two concurrent
`py-spy record` attaches would pause the target twice as often (double the overhead) and give two
different sample sets, so the flame graph and the speedscope profile would disagree; deriving both from one
recording keeps them consistent. The current process is recorded from a helper `py-spy` subprocess
attached by pid (py-spy cannot run inside the process it samples); a child command is started by us and
attached by pid with `--subprocesses`, so we keep its exit code and signals.

When py-spy is missing or cannot attach (ptrace denied, not a Python process), the result carries
`available: false` and a one-line `reason`; nothing raises.
"""

from __future__ import annotations

import html
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import open_own, read_json, write_text


def find_py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a venv not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else None


def _reason(log: str, returncode: int | None) -> str:
    """One line out of py-spy's output (it prints a Rust backtrace after the error line)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    err = next((ln for ln in lines if ln.startswith("Error:")), None)
    msg = (
        err[len("Error:") :].strip() if err else (lines[-1] if lines else f"py-spy exited with {returncode}")
    )
    low = log.lower()
    if "permission denied" in low or "operation not permitted" in low:
        msg += " (ptrace denied: run as root, or with CAP_SYS_PTRACE / kernel.yama.ptrace_scope=0)"
    return f"py-spy could not record: {msg}"


class PySpyRecorder:
    """Record one process with py-spy into `out_dir/{name}.speedscope.json` and `out_dir/{name}.svg`.

    start() attaches; stop() ends the recording (SIGINT makes py-spy write its file; it also stops by itself
    when the target exits) and returns the result dict.
    """

    def __init__(
        self,
        out_dir: str | Path,
        pid: int | None = None,
        rate: int = 100,
        subprocesses: bool = False,
        name: str = "pyspy",
        nonblocking: bool = False,
        exe: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.pid = os.getpid() if pid is None else pid
        self.rate = rate
        self.subprocesses = subprocesses
        self.name = name
        self.nonblocking = nonblocking
        self.exe = exe if exe is not None else find_py_spy()
        self.speedscope = self.out_dir / f"{name}.speedscope.json"
        self.svg = self.out_dir / f"{name}.svg"
        self.log = self.out_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: Any = None
        self.reason: str | None = None

    def start(self) -> bool:
        """Attach; False (with `reason` set) if py-spy is missing or exited at once."""
        if not self.exe or not Path(self.exe).exists():
            self.reason = "py-spy is not installed (pip install py-spy)"
            return False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [self.exe, "record", "--pid", str(self.pid), "--format", "speedscope"]
        cmd += ["-o", str(self.speedscope), "--rate", str(self.rate)]
        cmd += ["--subprocesses"] * self.subprocesses + ["--nonblocking"] * self.nonblocking
        # a file, not a pipe: a full pipe would stall py-spy; closed in _finish_log. Neither file may be a
        # link out of the run: the log is opened without following one, and py-spy (which writes the
        # speedscope file itself, following links) gets a fresh path.
        self._log_fh = os.fdopen(open_own(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")
        if self.speedscope.is_symlink():
            self.speedscope.unlink()
        self._proc = subprocess.Popen(
            cmd, stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        # attach errors (no such pid, ptrace denied, not Python) surface within a few hundred ms
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if "Sampling process" in self.log.read_text(errors="replace"):
                return True
            time.sleep(0.02)
        if self._proc.poll() is not None and self._proc.returncode != 0:
            self._finish_log()
            self.reason = _reason(self.log.read_text(errors="replace"), self._proc.returncode)
            self._proc = None
            return False
        return True

    def _finish_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._finish_log()
            if not self.speedscope.exists():
                self.reason = _reason(self.log.read_text(errors="replace"), self._proc.returncode)
            self._proc = None
        return self.result()

    def result(self) -> dict[str, Any]:
        if self.reason or not self.speedscope.exists():
            return {"available": False, "reason": self.reason or "py-spy wrote no profile"}
        n = speedscope_to_svg(self.speedscope, self.svg, title=f"py-spy: pid {self.pid}")
        return {
            "available": True,
            "reason": None,
            "speedscope": self.speedscope.name,  # relative to the run directory, so reports link portably
            "svg": self.svg.name,
            "samples": n,
            "rate_hz": self.rate,
        }

    def __enter__(self) -> PySpyRecorder:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def record_command(
    cmd: Sequence[str], out_dir: str | Path, rate: int = 100, name: str = "pyspy"
) -> tuple[int, dict]:
    """Run `cmd` as a child, record it (and its subprocesses) with py-spy; return (exit code, result)."""
    child = subprocess.Popen(list(cmd))
    rec = PySpyRecorder(out_dir, pid=child.pid, rate=rate, subprocesses=True, name=name)
    rec.start()
    code = child.wait()
    return code, rec.stop()


# ---------------------------------------------------------------------------------------------------------
# SVG flame graph from a speedscope file


def collapse_speedscope(path: str | Path) -> dict[tuple[str, ...], float]:
    """Stack (root first) -> total weight (samples), merged over all threads/processes of the profile."""
    data = read_json(path)
    frames = data["shared"]["frames"]
    names = [
        f"{f.get('name', '?')} ({Path(str(f.get('file', '?'))).name}:{f.get('line', '?')})" for f in frames
    ]
    stacks: dict[tuple[str, ...], float] = {}
    for prof in data.get("profiles", []):
        if prof.get("type") != "sampled":
            continue
        samples, weights = prof.get("samples", []), prof.get("weights", [])
        unit_w = min((w for w in weights if w > 0), default=1.0)  # weights are seconds; count samples
        for stack, w in zip(samples, weights, strict=False):
            key = tuple(names[i] for i in stack)
            stacks[key] = stacks.get(key, 0.0) + (w / unit_w if unit_w else 1.0)
    return stacks


def _colour(name: str) -> str:
    h = sum(ord(c) * 31**i for i, c in enumerate(name[:24])) % 1000 / 1000
    return f"rgb({205 + int(50 * h)},{int(80 + 130 * (1 - h))},{int(40 + 40 * h)})"


def speedscope_to_svg(src: str | Path, dst: str | Path, title: str = "flame graph", width: int = 1200) -> int:
    """Write a classic flame graph (root at the bottom, width = share of samples); returns samples drawn."""
    stacks = collapse_speedscope(src)
    tree: dict[str, Any] = {"w": 0.0, "c": {}}
    for stack, w in stacks.items():
        node = tree
        node["w"] += w
        for name in stack:
            node = node["c"].setdefault(name, {"w": 0.0, "c": {}})
            node["w"] += w
    total = tree["w"]
    depth = _depth(tree)
    row, pad_top = 16, 40
    height = pad_top + (depth + 1) * row + 10
    rects: list[str] = []

    def draw(node: dict[str, Any], name: str, x: float, level: int) -> None:
        w_px = node["w"] / total * (width - 20) if total else 0
        if w_px < 0.3:  # invisible slivers only bloat the file
            return
        y = height - 10 - (level + 1) * row
        label = html.escape(name)
        share = 100 * node["w"] / total
        text = html.escape(name[: int(w_px / 7)]) if w_px > 30 else ""
        rects.append(
            f"<g><title>{label} — {node['w']:.0f} samples ({share:.1f}%)</title>"
            f'<rect x="{10 + x:.1f}" y="{y}" width="{w_px:.1f}" height="{row - 1}" '
            f'fill="{_colour(name)}" rx="2"/>'
            f'<text x="{13 + x:.1f}" y="{y + row - 4}">{text}</text></g>'
        )
        cx = x
        for child_name, child in sorted(node["c"].items()):
            draw(child, child_name, cx, level + 1)
            cx += child["w"] / total * (width - 20)

    draw(tree, "all", 0.0, 0)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'style="font-family:monospace;font-size:11px">'
        f'<rect width="100%" height="100%" fill="#fdfdf6"/>'
        f'<text x="{width / 2}" y="22" text-anchor="middle" style="font-size:15px">'
        f"{html.escape(title)} — {total:.0f} samples</text>{''.join(rects)}</svg>"
    )
    write_text(dst, svg)
    return int(round(total))


def _depth(node: dict[str, Any]) -> int:
    return 1 + max((_depth(c) for c in node["c"].values()), default=0) if node["c"] else 0
