"""The one writer under faults: what it will not write over (devices, FIFOs, directories), a full or read-only
disk (injected by patching os.write / os.replace: as root chmod stops nothing), and one writer per run
directory."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reference_trainer.errors import UserError
from reference_trainer.trace.locks import LOCK_FILE, run_lock
from reference_trainer.trace.records import (
    append_jsonl,
    make_dir,
    read_jsonl,
    replace_dir,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]


def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def test_a_device_or_fifo_is_never_written_over(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    null_link = tmp_path / "null.json"
    null_link.symlink_to(os.devnull)  # what `--out /dev/null` reaches; the device itself is never touched
    for target in (fifo, null_link):
        with pytest.raises(UserError, match="not a regular file"):
            write_json(target, {"a": 1})
        with pytest.raises(UserError, match="not a regular file"):
            append_jsonl(target, {"a": 1})  # would block on a FIFO without a reader
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert null_link.is_symlink() and stat.S_ISCHR(os.stat(null_link).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null.json", "pipe"]  # no temp file left
    with pytest.raises(UserError, match="is a directory"):
        write_text(tmp_path, "x")


def test_a_full_disk_is_one_line_and_the_old_file_stays(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json(path, {"old": True})
    log = tmp_path / "rows.jsonl"
    append_jsonl(log, {"step": 0})
    monkeypatch.setattr(os, "write", _raise(errno.ENOSPC))
    with pytest.raises(UserError, match=f"cannot write {path}: No space left on device"):
        write_json(path, {"new": True})
    with pytest.raises(UserError, match=f"cannot write {log}: No space left on device"):
        append_jsonl(log, {"step": 1})
    monkeypatch.undo()
    assert read_jsonl(log) == [{"step": 0}]
    assert path.read_text().strip().startswith("{") and "old" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "rows.jsonl"]


def test_a_read_only_disk_is_one_line(tmp_path, monkeypatch):
    built = make_dir(tmp_path / "tmp-dir")
    (built / "f").write_text("x")
    monkeypatch.setattr(os, "replace", _raise(errno.EROFS))
    with pytest.raises(UserError, match="cannot write .*a.json: Read-only file system"):
        write_json(tmp_path / "a.json", {})
    with pytest.raises(UserError, match="cannot write .*final: Read-only file system"):
        replace_dir(built, tmp_path / "final")
    monkeypatch.setattr(Path, "mkdir", _raise(errno.EROFS))
    with pytest.raises(UserError, match="cannot create directory .*new: Read-only file system"):
        make_dir(tmp_path / "new")


def test_an_output_directory_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(UserError, match="taken: exists and is not a directory"):
        make_dir(tmp_path / "taken")
    with pytest.raises(UserError, match="cannot create directory"):
        make_dir(tmp_path / "taken" / "below")


HOLD = """
import sys, time
from reference_trainer.trace.locks import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_writer_of_a_run_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(
                UserError, match=rf"{run} is in use by another rlbench process \(pid {holder.pid}\)"
            ),
            run_lock(run),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(run), run_lock(run):  # the dead holder's lock is gone; one process may nest it
        assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_a_file_written_by_a_library_keeps_the_mode_a_plain_write_gets(tmp_path):
    """safetensors recreates the temp file 0600: a checkpoint another user may read must not become one it
    cannot (then told "No such file or directory")."""
    import stat

    import torch

    from reference_trainer.trace.records import write_safetensors, write_text

    old = os.umask(0o022)
    try:
        write_safetensors(tmp_path / "w.safetensors", {"a": torch.zeros(2)})
        write_text(tmp_path / "t.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "t.txt").stat().st_mode) == 0o644


def test_a_file_name_of_250_bytes_is_written(tmp_path):
    from reference_trainer.trace.records import write_json

    name = "é" * 120 + "x.json"  # 246 bytes: legal, and its temp name must fit NAME_MAX as well
    write_json(tmp_path / name, {"ok": 1})
    assert json.loads((tmp_path / name).read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp left


def test_a_newline_in_a_path_keeps_the_error_on_one_line(tmp_path):
    from conftest import assert_one_line_error, cli

    odd = tmp_path / "a\nb"
    res = cli("report", str(odd), tmp=tmp_path)
    assert_one_line_error(res, "a\\nb")
