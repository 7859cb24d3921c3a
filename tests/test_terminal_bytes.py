"""Values from outside reach the terminal as text: escape and CSI bytes in an output folder's name, a
length log's or a trace's file name, a model folder's name and a note about a torn file are escaped
(`errors.printable`), never acted on by the terminal (a clear screen, a window title, a colour)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import cli

from reference_trainer.trace.records import iter_jsonl
from rlbench.options import echo

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31m"  # clear the screen, set the window title, C1 CSI colour


def _clean(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, res.stderr
    shown = res.stdout + res.stderr
    assert "pwned" in shown or "[2J" in shown, shown  # the name is shown ...
    assert not any(c in shown for c in "\x1b\x07\x9b"), repr(shown)  # ... as text


def _log(path: Path) -> Path:
    rows = [{"step": s, "group": g, "response_tokens": [3, 5 + g]} for s in range(2) for g in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_import_into_a_folder_named_with_escapes(tmp_path):
    log = _log(tmp_path / f"log{HOSTILE}.jsonl")
    _clean(cli("import", "lengths", str(log), "--out", str(tmp_path / f"run{HOSTILE}"), "--workers", "1"))


def test_a_trace_converted_and_validated_under_a_name_with_escapes(tmp_path):
    log = _log(tmp_path / "log.jsonl")
    trace = tmp_path / f"trace{HOSTILE}.jsonl"
    _clean(cli("trace", "convert", str(log), "--out", str(trace)))
    _clean(cli("trace", "validate", str(trace)))


def test_models_list_of_a_folder_named_with_escapes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short name: the table's column would cut a long one
    Path(f"m{HOSTILE}").mkdir()
    _clean(cli("models", "list", f"m{HOSTILE}"))


def test_a_note_about_a_torn_file_named_with_escapes(tmp_path, capsys):
    torn = tmp_path / f"metrics{HOSTILE}.jsonl"
    torn.write_text('{"step": 0}\n{"step": 1')
    assert [r["step"] for r in iter_jsonl(torn)] == [0]
    err = capsys.readouterr().err
    assert "dropped a torn last line" in err and not any(c in err for c in "\x1b\x07\x9b"), repr(err)


def test_a_commands_line_is_escaped(capsys):
    echo(f"report: {HOSTILE}/report.html")
    echo(f"wrote {HOSTILE}", err=True)
    out, err = capsys.readouterr()
    assert out == "report: \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m/report.html\n"
    assert err == "wrote \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\n"
