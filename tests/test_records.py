"""reference_trainer.trace.records: atomic writes, durable appends, the one JSONL reader; the embedded model
build lock."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest

from reference_trainer.errors import UserError
from reference_trainer.trace.records import (
    append_jsonl,
    atomic_path,
    read_json,
    read_jsonl,
    replace_dir,
    trim_torn_tail,
    write_json,
    write_text,
)

ROWS = [{"step": 0, "loss": 1.5}, {"step": 1, "text": "naïve ✓"}, {"step": 2, "nested": {"a": [1, 2]}}]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def test_atomic_write_respects_umask_and_keeps_an_existing_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640  # 0o666 & ~umask, not mkstemp's 0600
    (tmp_path / "b.txt").write_text("old")
    (tmp_path / "b.txt").chmod(0o604)
    write_text(tmp_path / "b.txt", "new")
    assert (tmp_path / "b.txt").read_text() == "new"
    assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o604
    assert read_json(tmp_path / "a.json") == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.txt"]  # no temp file left behind


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old weights")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old weights"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_every_kill_point_reads_back_a_prefix_and_appends_cleanly(tmp_path, capsys):
    """Cut the file at every byte (a kill mid-write): the reader returns the rows written whole, and an
    append after the cut yields a fully valid file holding that prefix plus the new row."""
    data = jsonl(ROWS)
    path = tmp_path / "metrics.jsonl"
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        whole = data[:cut].count(b"\n")
        rows = read_jsonl(path)
        assert rows == ROWS[: len(rows)] and len(rows) in (whole, whole + 1), cut
        append_jsonl(path, {"step": 9})
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"" and [json.loads(x) for x in lines[:-1]] == ROWS[: len(rows)] + [{"step": 9}]
    err = capsys.readouterr().err
    assert f"note: {path}: dropped a torn last line (kill mid-write?)" in err
    assert f"note: {path}: cut a torn last line before appending" in err


def test_torn_last_line_is_dropped_with_one_note(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(jsonl(ROWS)[:-7])
    assert read_jsonl(path) == ROWS[:2]
    assert read_jsonl(path) == ROWS[:2]  # read twice (resume and report): said once
    err = capsys.readouterr().err
    assert err == f"note: {path}: dropped a torn last line (kill mid-write?)\n"
    path.write_bytes(jsonl(ROWS[:1]) + '{"text": "✓'.encode()[:-1])  # cut inside a UTF-8 character
    assert read_jsonl(path) == ROWS[:1]
    path.write_bytes(jsonl(ROWS[:1]) + b'{"step": 1}')  # whole row, only its newline missing: kept
    assert read_jsonl(path) == [ROWS[0], {"step": 1}]
    assert trim_torn_tail(path) and path.read_bytes().endswith(b'{"step": 1}\n')


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"step": 0}\n{"step": 1, \n{"step": 2}\n', r"bad\.jsonl:2: malformed JSON row"),
        (b'{"step": 0}\n\n[1, 2]\n', r"bad\.jsonl:3: row is not a JSON object"),
        (b'{"step": 0}\n{"step": 1}\n{"step": 2,\n', r"bad\.jsonl:3: malformed JSON row"),  # terminated
        (b'{"step": 0}\n{"a": "\xc3\x28"}\n{"step": 2}\n', r"bad\.jsonl:2: not UTF-8 text"),
    ],
)
def test_a_bad_line_is_one_line_with_file_and_line(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(UserError, match=message) as err:
        read_jsonl(tmp_path / "bad.jsonl")
    assert "\n" not in str(err.value)


def test_required_fields_and_strict_user_data(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"id": 1, "problem": "p"}\n')
    with pytest.raises(UserError, match=r"data\.jsonl:1: row lacks field\(s\) answer"):
        read_jsonl(path, required=("id", "problem", "answer"))
    path.write_text('{"id": 1, "problem": "p", "answer": "2"}\n{"id": 2, "prob')
    assert len(read_jsonl(path, required=("id",))) == 1
    with pytest.raises(UserError, match=r"data\.jsonl:2: malformed JSON row"):
        read_jsonl(path, torn_tail=False)  # user data: a bad last line is an error, not a shorter suite
    (tmp_path / "c.json").write_text('{"a": 1,\n}')
    with pytest.raises(UserError, match=r"c\.json:2: malformed JSON"):
        read_json(tmp_path / "c.json")
    with pytest.raises(UserError, match="no such file"):
        read_json(tmp_path / "missing.json")


def test_trace_flush_after_a_torn_tail(tmp_path):
    from reference_trainer.trace.writer import Trace

    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'{"kind": "rollout", "step": 0}\n{"kind": "dec')
    trace = Trace()
    trace.add({"kind": "update", "t_start": 0.0, "t_end": 1.0})
    trace.flush_to(path)
    assert [e["kind"] for e in read_jsonl(path)] == ["rollout", "update"]
    trace.write_jsonl(tmp_path / "all.jsonl")
    assert read_jsonl(tmp_path / "all.jsonl") == trace.events


def test_replace_dir_replaces_an_older_copy(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "stale.txt").write_text("old")
    (tmp_path / "tmp" / "sub").mkdir(parents=True)
    (tmp_path / "tmp" / "sub" / "w.bin").write_bytes(b"new")
    replace_dir(tmp_path / "tmp", tmp_path / "final")
    assert [p.name for p in tmp_path.iterdir()] == ["final"]
    assert (tmp_path / "final" / "sub" / "w.bin").read_bytes() == b"new"
    assert not (tmp_path / "final" / "stale.txt").exists()


# --- build_once: one builder, the others wait ---------------------------------------------------------


def _build_in_child(log: Path, building, target: Path) -> None:
    """One process asking for a directory that `build_once` builds (a slow fake build)."""
    from reference_trainer.trace.locks import build_once

    def build(out_dir: Path) -> Path:
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"weights")
        with open(log, "a") as fh:
            fh.write(f"built {os.getpid()}\n")
        building.set()
        time.sleep(1.0)  # long enough that the second process surely meets the lock
        return out_dir

    def on_wait() -> None:
        with open(log, "a") as fh:
            fh.write(f"waited {os.getpid()}\n")

    path = build_once(target, build, lambda p: (p / "model.safetensors").is_file(), on_wait)
    with open(log, "a") as fh:
        fh.write(f"loaded {os.getpid()} {(path / 'model.safetensors').read_bytes().decode()}\n")


def test_two_processes_on_a_fresh_cache_build_the_model_once(tmp_path):
    ctx = multiprocessing.get_context("fork")  # nothing to pickle
    log, building, target = tmp_path / "log", ctx.Event(), tmp_path / "cache" / "model"
    first = ctx.Process(target=_build_in_child, args=(log, building, target))
    first.start()
    assert building.wait(30), "the first process never started building"
    second = ctx.Process(target=_build_in_child, args=(log, building, target))
    second.start()
    for proc in (first, second):
        proc.join(60)
        assert proc.exitcode == 0
    lines = log.read_text().splitlines()
    assert lines[0] == f"built {first.pid}"
    assert f"waited {second.pid}" in lines and f"built {second.pid}" not in lines
    assert sorted(x for x in lines if x.startswith("loaded")) == sorted(
        f"loaded {p.pid} weights" for p in (first, second)
    )
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert names == ["model", "model.lock"]  # no temp dir left


def test_unreadable_paths_are_one_line_errors(tmp_path):
    from reference_trainer.trace.records import read_json, read_jsonl

    for reader in (read_json, read_jsonl):
        with pytest.raises(UserError, match="no such file"):
            reader(tmp_path / "missing.json")
        with pytest.raises(UserError, match="is a directory"):
            reader(tmp_path)
