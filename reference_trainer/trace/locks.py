"""One writer at a time: `run_lock` makes a process the only writer of a run directory (a second `train`,
`profile`, `compare` or `eval` on it is refused with one line naming the holder), and `build_once` builds a
directory once however many processes ask for it (the embedded model, an imported model). Both use
fcntl.flock on a lock file, which the OS releases when its holder dies.

A lock file is opened without following a symlink (O_NOFOLLOW) and must be a regular file: the holder
truncates it and writes its pid, so a lock that linked elsewhere would overwrite a file outside the run."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from reference_trainer.errors import UserError
from reference_trainer.trace.records import cannot_write, make_dir, open_own, replace_dir, temp_beside

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]


def build_once(
    path: Path,
    build: Callable[[Path], object],
    ready: Callable[[Path], bool],
    on_wait: Callable[[], None] | None = None,
) -> Path:
    """Build directory `path` unless `ready(path)`, under an exclusive lock on `path`.lock, so concurrent
    callers build it once. The build goes into a temp directory published by rename, so a builder killed
    midway leaves no half directory behind (the lock dies with its process)."""
    if ready(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(path.with_name(path.name + ".lock"), on_wait):
        if not ready(path):  # checked again: the holder we waited for has usually built it
            tmp = temp_beside(path, f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                build(tmp)
                replace_dir(tmp, path)  # also replaces an incomplete directory left by older versions
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return path


@contextmanager
def _exclusive_lock(lock_path: Path, on_wait: Callable[[], None] | None) -> Iterator[None]:
    """fcntl.flock on a lock file (stdlib, released by the OS if the holder dies); no lock without fcntl."""
    if fcntl is None:  # not POSIX: builders may race, and the rename still keeps the result whole
        yield
        return
    fd = open_lock_file(lock_path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def open_lock_file(lock: Path) -> int:
    """A read-write descriptor on lock file `lock`, created if missing. A symlink there is refused, not
    followed (O_NOFOLLOW), and so is anything but a regular file (a FIFO would block the open: O_NONBLOCK),
    each as one line naming the path: the file is truncated and written, and must be the run's own."""
    try:
        fd = open_own(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
    except OSError as err:
        raise cannot_write(lock, err) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{lock}: exists and is not a regular file; a lock file must be one (remove it)")
    return fd


LOCK_FILE = ".rlbench.lock"
_run_locks: dict[str, int] = {}  # run directories this process holds -> nesting depth


@contextmanager
def run_lock(directory: str | Path) -> Iterator[Path]:
    """Hold `directory` (created if needed) as its only writer: a second process is refused at once with
    one line naming the directory and the holder's pid. Re-entrant within a process (profile runs the
    trainer inside its own session on the same directory). fcntl.flock on DIR/.rlbench.lock: the OS drops
    it when the holder dies, so a killed run never leaves the directory locked. Not POSIX: no lock."""
    directory = make_dir(directory)
    key = str(directory.resolve())
    if key in _run_locks or fcntl is None:
        _run_locks[key] = _run_locks.get(key, 0) + 1
        try:
            yield directory
        finally:
            _run_locks[key] -= 1
            if not _run_locks[key]:
                del _run_locks[key]
        return
    fd = open_lock_file(directory / LOCK_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(
            f"{directory} is in use by another rlbench process (pid {holder}); wait for it to end, or use "
            "another --out"
        ) from None
    with suppress(OSError):  # a full disk: the lock holds all the same, only the pid is not shown
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _run_locks[key] = 1
    try:
        yield directory
    finally:
        del _run_locks[key]
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
