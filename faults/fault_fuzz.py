"""The fault drill's hostile metrics servers on 127.0.0.1 (`rlbench observe` against them) and its option
fuzz: every numeric option of every command, walked from the Typer app, fed 0, -3, nan, inf, 1e999 and
2**70; a value that passes the checks up front is then run for real."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faults.fault_inputs import (
    FUZZ_STUBS,
    FUZZ_VALUES,
    Accepted,
    Check,
    Outcome,
    cli,
    fuzz_base_args,
    one_line,
    write_suite,
    write_tiny_model,
)
from rlbench.cli import app_
from rlbench.options import numeric_options

# ---- hostile metrics servers -------------------------------------------------------------------------------

PAGE = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 10\n"
    "# TYPE vllm:request_generation_tokens histogram\n"
    'vllm:request_generation_tokens_bucket{le="many"} 1\nvllm:request_generation_tokens_bucket{} 1\n'
    'vllm:request_generation_tokens_bucket{le="+Inf"} 1\nvllm:request_generation_tokens_count 1\n'
)


class Hostile:
    """A raw TCP server on 127.0.0.1 answering every connection the way `kind` says."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.stop = threading.Event()
        self.scrapes = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        body = PAGE.encode()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        with contextlib.suppress(OSError), conn:
            conn.recv(65536)
            if self.kind == "slow body":
                conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
                for byte in body:
                    if self.stop.wait(0.2):
                        return
                    conn.sendall(bytes([byte]))
            elif self.kind == "slow headers":
                for byte in head:
                    if self.stop.wait(0.2):
                        return
                    conn.sendall(bytes([byte]))
            elif self.kind == "endless body":
                conn.sendall(head + b"\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"# " + b"x" * 65_000 + b"\n")
            elif self.kind == "one huge line":
                conn.sendall(head + b"\r\n" + b"vllm:num_requests_running " + b"9" * 20_000_000)
            elif self.kind == "binary garbage":
                conn.sendall(head + b"\r\n" + os.urandom(200_000))
            elif self.kind == "HTTP 500":
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
            elif self.kind == "hang up":
                return
            elif self.kind == "silent":
                self.stop.wait(30)
            elif self.kind == "jumping counter":  # a success counter 1e9 higher on every scrape
                self.scrapes += 1
                page = (PAGE + "# TYPE vllm:request_success_total counter\n"
                        f"vllm:request_success_total {self.scrapes * 10**9}\n").encode()  # fmt: skip
                conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(page) + page)
            else:  # "bad le": histogram buckets without a numeric le, and a NaN gauge
                page = (
                    PAGE + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n"
                ).encode()
                conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(page) + page)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


SERVER_KINDS = ("slow body", "slow headers", "endless body", "one huge line", "binary garbage", "HTTP 500",
                "hang up", "silent", "bad le", "jumping counter")  # fmt: skip


def hostile_servers(work: Path) -> Iterator[tuple[str, Check]]:
    for kind in SERVER_KINDS:
        yield f"observe: {kind} beside a healthy server", _observe([kind, "bad le"])
    yield "observe: all hostile at once", _observe(list(SERVER_KINDS))


def _observe(kinds: list[str]) -> Check:
    def check(d: Path) -> Outcome:
        servers = [Hostile(kind) for kind in kinds]
        duration = 2.0
        try:
            t0 = time.perf_counter()
            ran = cli("observe", *(s.url for s in servers), "--duration", str(duration), "--interval", "0.1",
                      "--out", "obs", cwd=d)  # fmt: skip
            elapsed = time.perf_counter() - t0
        finally:
            for server in servers:
                server.close()
        samples = d / "obs" / "samples.jsonl"
        rows = [json.loads(line) for line in samples.read_text().splitlines()] if samples.is_file() else []
        every_server = {r["server"] for r in rows} == set(range(len(servers)))
        ok = (
            ran.code in (0, 2)
            and elapsed < duration + 2.5
            and every_server
            and (d / "obs" / "report.html").is_file()
        )
        return Outcome(ok, f"{elapsed:.1f} s, {len(rows)} samples, exit {ran.code}", traceback=ran.traceback)

    return check


# ---- option fuzz -------------------------------------------------------------------------------------------


def option_fuzz(work: Path) -> Iterator[tuple[str, Check]]:
    model = write_tiny_model(work / "model")
    data = write_suite(work / "data")
    base = fuzz_base_args(str(model), data)
    for path, flag, kind in numeric_options(app_):
        for value in FUZZ_VALUES:
            yield f"{' '.join(path)} {flag}={value}", _fuzz(path, flag, kind, value, base[" ".join(path)])


def _fuzz(path: tuple[str, ...], flag: str, kind: type, value: str, base: tuple[str, ...]) -> Check:
    def check(d: Path) -> Outcome:
        import importlib

        module, _, name = FUZZ_STUBS[" ".join(path)].rpartition(".")
        owner = importlib.import_module(module)
        real = getattr(owner, name)

        def accept(*args: Any, **kwargs: Any) -> None:
            raise Accepted

        setattr(owner, name, accept)
        out = () if path == ("generate",) else ("--out", "out")
        try:
            ran = cli(*path, *base, *out, f"{flag}={value}", cwd=d)
        except Accepted:
            ran = None
        finally:
            setattr(owner, name, real)
        if ran is not None:
            return one_line(ran)
        if value in ("nan", "inf", "1e999") or (kind is int and value == str(2**70)):
            return Outcome(False, "accepted a value nothing can use")
        # Accepted: the same command for real must run cleanly (or stop with one line, as a huge --lr does)
        ran = (
            cli(*path, *base, "--out", "real", f"{flag}={value}", cwd=d)
            if out
            else cli(*path, *base, f"{flag}={value}", cwd=d)
        )
        refused = one_line(ran).ok or (path == ("observe",) and ran.code == 2)  # observe: nothing to observe
        return Outcome(ran.code == 0 or refused, f"accepted, ran: exit {ran.code} {ran.err.strip()[-120:]}",
                       traceback=ran.traceback)  # fmt: skip

    return check
