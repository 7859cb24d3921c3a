"""Commands under faults, in process: one writer per run directory, outputs that are not directories or
regular files, a disk that fills up or turns read-only mid-run, Ctrl-C (at start-up, in profile and train),
and a rerun that would overwrite a profile."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, cli

from reference_trainer.errors import missing_module
from reference_trainer.trace.records import read_jsonl


def tiny_run(model: Path) -> tuple[str, ...]:
    return ("--model", str(model), "--prompts-per-step", "1", "--group-size", "2", "--max-tokens", "4",
            "--eval-every", "0")  # fmt: skip


def tiny_suite(data: Path) -> Path:
    data.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2)]
    (data / "amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_a_second_writer_of_a_run_directory_is_refused(held, tiny_model_dir, tmp_path):
    run, pid = held
    data = tiny_suite(tmp_path / "data")
    eval_args = ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir))
    for command in (
        ("train", "--out", str(run), *tiny_run(tiny_model_dir)),
        ("profile", "--out", str(run), *tiny_run(tiny_model_dir)),
        ("compare", "--modes", "baseline", "--out", str(run), *tiny_run(tiny_model_dir)),
        (*eval_args, "--out", str(run)),
    ):
        assert_one_line_error(
            cli(*command, tmp=tmp_path), f"{run} is in use by another rlbench process (pid {pid})"
        )
    (run / "train_config.json").write_text(json.dumps({"model": str(tiny_model_dir), "eval_every": 0}))
    res = cli("train", "--resume", str(run), tmp=tmp_path)
    assert_one_line_error(res, f"{run} is in use by another rlbench process (pid {pid})")
    assert sorted(p.name for p in run.iterdir()) == [".rlbench.lock", "train_config.json"]


def test_an_output_that_is_a_file_or_a_device_is_one_line(tiny_model_dir, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("notes")
    data = tiny_suite(tmp_path / "data")
    assert_one_line_error(
        cli("profile", "--out", str(taken), *tiny_run(tiny_model_dir), tmp=tmp_path),
        "exists and is not a directory",
    )
    eval_args = ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir))
    assert_one_line_error(cli(*eval_args, "--out", str(taken), tmp=tmp_path), "exists and is not a directory")
    assert taken.read_text() == "notes"
    run = tmp_path / "exported"
    run.mkdir()
    (run / "trace.jsonl").write_text(
        json.dumps({"kind": "rollout", "step": 0, "t_start": 0, "t_end": 1}) + "\n"
    )
    device = tmp_path / "null.json"
    device.symlink_to(os.devnull)  # `--out /dev/null`, reached without touching the real device in a test
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for target in (device, fifo):
        res = cli("trace", "export", str(run), "--out", str(target), tmp=tmp_path)
        assert_one_line_error(res, "exists and is not a regular file")
    assert os.path.realpath(device) == os.devnull and fifo.is_fifo()


def _failing(real, code: int, where: str):
    def call(*args, **kwargs):
        if any(where in str(a) for a in args):
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    return call


def test_a_disk_full_at_the_first_checkpoint_is_one_line_and_keeps_the_logs(
    tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(os, "replace", _failing(os.replace, errno.ENOSPC, "checkpoints"))
    args = ("train", "--out", "run", "--steps", "2", "--checkpoint-every", "1", *tiny_run(tiny_model_dir))
    res = cli(*args, tmp=tmp_path)
    assert_one_line_error(res, "cannot write run/checkpoints/")
    assert res.stderr.endswith("No space left on device\n")
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0]
    assert not list((tmp_path / "run" / "checkpoints").glob(".step-*"))  # no temp left behind


def test_a_read_only_disk_under_eval_and_report_is_one_line(tiny_model_dir, tmp_path, monkeypatch):
    data = tiny_suite(tmp_path / "data")
    eval_args = ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir))
    eval_args += ("--max-tokens", "4", "--out", "ev")
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", _failing(os.write, errno.ENOSPC, ""))  # every write: a full disk
        assert_one_line_error(cli(*eval_args, tmp=tmp_path), "No space left on device")
    assert cli(*eval_args, tmp=tmp_path).returncode == 0
    before = (tmp_path / "ev" / "report.html").read_bytes()
    monkeypatch.setattr(os, "replace", _failing(os.replace, errno.EROFS, "report.html"))
    assert_one_line_error(cli("report", "ev", tmp=tmp_path), "report.html: Read-only file system")
    assert (tmp_path / "ev" / "report.html").read_bytes() == before


def test_ctrl_c_says_what_was_kept_and_a_profile_rerun_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    import rlbench.profiling.session
    import rlbench.training

    def interrupted(config, out_dir, **kwargs):
        rlbench.profiling.session.make_dir(out_dir)
        (Path(out_dir) / "train_config.json").write_text(json.dumps(config.to_json()))
        raise KeyboardInterrupt

    monkeypatch.setattr(rlbench.profiling.session, "run_training", interrupted)
    monkeypatch.setattr(rlbench.training, "run_training", interrupted)
    res = cli("profile", "--out", "p", *tiny_run(tiny_model_dir), tmp=tmp_path)
    assert res.returncode == 130 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("interrupted: p/report.html profiles the finished steps")
    assert (tmp_path / "p" / "report.html").is_file()
    rerun = cli("profile", "--out", "p", *tiny_run(tiny_model_dir), tmp=tmp_path)
    assert_one_line_error(rerun, "p already holds a training run: pass --overwrite to replace it")
    res = cli("train", "--out", "t", *tiny_run(tiny_model_dir), tmp=tmp_path)
    assert res.returncode == 130 and res.stderr == (
        "interrupted: t keeps every finished step; `rlbench train --resume t` continues\n"
    )
    monkeypatch.setattr(
        "rlbench.eval.suites.suite_sizes", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    res = cli("suites", tmp=tmp_path)
    assert (res.returncode, res.stderr) == (130, "interrupted\n")


INTERRUPT_AT_IMPORT = """
import runpy, sys

class Interrupt:  # Ctrl-C while the command modules import
    def find_spec(self, name, path=None, target=None):
        if name == "rlbench.commands.train":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["rlbench", "modes"]
runpy.run_module("rlbench.cli", run_name="__main__")
"""


def test_ctrl_c_during_start_up_is_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", INTERRUPT_AT_IMPORT]
    res = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert (res.returncode, res.stderr) == (130, "interrupted\n")


@pytest.mark.parametrize(
    ("file", "doc", "message"),
    [
        ("metrics.json", [1], "metrics.json: not a profile's metrics"),
        ("metrics.json", {"summary": [], "steps": []}, "metrics.json: summary is list, not an object"),
        ("metrics.json", {"summary": {}, "steps": [1]}, "metrics.json: steps is not a list of step rows"),
        (
            "metrics.json",
            {"summary": {"bubble_ratio": "low"}, "steps": [{"step": 0}]},
            "not as rlbench writes",
        ),
        ("compare.json", {"runs": 3}, "compare.json: not a comparison"),
        ("compare.json", {"runs": [{"mode": "baseline"}]}, "compare.json: not a comparison"),
        ("compare.json", {"runs": {"baseline": {"summary": {}, "steps": []}}}, "not a comparison (a list"),
        (
            "compare.json",
            {"runs": [{"mode": "baseline", "summary": {"step_time_s": "x"}}]},
            "not as rlbench writes",
        ),
    ],
)
def test_report_on_wrongly_typed_saved_results_is_one_line(tmp_path, file, doc, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / file).write_text(json.dumps(doc))
    assert_one_line_error(cli("report", "run", tmp=tmp_path), message)


def test_an_interrupted_run_keeps_its_steps_without_rewriting_them(tiny_model_dir, tmp_path, monkeypatch):
    """A resume rewrites neither log when nothing is dropped (a read-only disk can still be read)."""
    args = ("train", "--out", "run", "--steps", "2", "--checkpoint-every", "2", *tiny_run(tiny_model_dir))
    assert cli(*args, tmp=tmp_path).returncode == 0
    logs = {name: (tmp_path / "run" / name).stat().st_mtime_ns for name in ("metrics.jsonl", "trace.jsonl")}
    assert cli("train", "--resume", "run", tmp=tmp_path).returncode == 0  # nothing left to run
    assert logs == {name: (tmp_path / "run" / name).stat().st_mtime_ns for name in logs}


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_kept(tiny_model_dir, tmp_path):
    """The lock is truncated and written with the holder's pid: followed, a planted link would overwrite
    the file it points to, outside the run."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    data = tiny_suite(tmp_path / "data")
    eval_args = ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir))
    for name, command in {
        "train": ("train", *tiny_run(tiny_model_dir)),
        "profile": ("profile", *tiny_run(tiny_model_dir)),
        "compare": ("compare", "--modes", "baseline", *tiny_run(tiny_model_dir)),
        "eval": eval_args,
    }.items():
        run = tmp_path / name
        run.mkdir()
        (run / ".rlbench.lock").symlink_to(notes)
        assert_one_line_error(cli(*command, "--out", str(run), tmp=tmp_path), ".rlbench.lock: is a symlink")
        assert notes.read_text() == "mine", name
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / ".rlbench.lock").symlink_to(tmp_path / "created-outside")
    res = cli("train", "--out", str(dangling), *tiny_run(tiny_model_dir), tmp=tmp_path)
    assert_one_line_error(res, ".rlbench.lock: is a symlink")
    assert not (tmp_path / "created-outside").exists()


def test_a_lock_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from reference_trainer.errors import UserError
    from reference_trainer.trace.locks import build_once, run_lock

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / ".rlbench.lock")
    with pytest.raises(UserError, match="not a regular file"), run_lock(tmp_path / "run"):
        pass
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    (tmp_path / "model.lock").symlink_to(notes)
    with pytest.raises(UserError, match="model.lock: is a symlink"):
        build_once(tmp_path / "model", lambda p: p.mkdir(), lambda p: p.is_dir())
    assert notes.read_text() == "mine" and not (tmp_path / "model").exists()


def test_appends_and_checkpoints_never_follow_a_link_out_of_the_run(tmp_path):
    from reference_trainer.errors import UserError
    from reference_trainer.trace.records import append_jsonl

    notes = tmp_path / "notes.txt"
    notes.write_text('{"mine": 1}\n{"torn')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").symlink_to(notes)
    with pytest.raises(UserError, match="metrics.jsonl: is a symlink"):
        append_jsonl(tmp_path / "run" / "metrics.jsonl", {"step": 0})
    assert notes.read_text() == '{"mine": 1}\n{"torn'  # not trimmed, not appended to
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "step-000001").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path / "elsewhere")
    from reference_trainer.train.checkpoint import save_checkpoint

    with pytest.raises(UserError, match="checkpoints: is a symlink"):
        save_checkpoint(tmp_path / "run" / "checkpoints", 5, None, None, {}, {})  # type: ignore[arg-type]
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["step-000001"]


def test_ctrl_c_during_compare_writes_the_report_of_what_finished(tiny_model_dir, tmp_path, monkeypatch):
    import rlbench.training

    real = rlbench.training.interleave

    def one_round_then_ctrl_c(trainers, steps, say, around=None, until=None):
        real(trainers, 1, say, around, until)
        raise KeyboardInterrupt

    monkeypatch.setattr(rlbench.training, "interleave", one_round_then_ctrl_c)
    res = cli("compare", "--modes", "baseline,sorted", "--steps", "3", "--out", "c", "--device", "cpu",
              *tiny_run(tiny_model_dir), tmp=tmp_path)  # fmt: skip
    assert res.returncode == 130 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(
        "interrupted: c/report.html shows the steps that finished (baseline 1, sorted 1)"
    )
    doc = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert doc["interrupted"] is True and [len(r["steps"]) for r in doc["runs"]] == [1, 1]
    assert (tmp_path / "c" / "report.html").is_file()


def test_a_missing_package_is_one_line_naming_it_and_its_install(tiny_model_dir, tmp_path, monkeypatch):
    """An environment without one of rlbench's packages (a bare GPU machine has no package index): the
    grader's math-verify is missing, and `eval` says which package and how to install it, in one line."""
    data = tiny_suite(tmp_path / "data")
    monkeypatch.setitem(sys.modules, "math_verify", None)  # its import now fails as an absent package's
    res = cli("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir),
              "--max-tokens", "4", "--out", "ev", tmp=tmp_path)  # fmt: skip
    assert_one_line_error(res, "the Python package 'math_verify' is not installed: pip install -e .")
    assert (
        missing_module("ray.util") == "the Python package 'ray' is not installed: pip install 'rlbench[ray]'"
    )


def test_the_suffix_drafter_missing_is_one_line_with_an_install_that_works():
    """It was an ImportError's traceback, and its install line built arctic-inference before nanobind."""
    import importlib.util

    from reference_trainer.errors import UserError, missing_module

    two_steps = "pip install nanobind==2.9.2 ninja && pip install --no-build-isolation 'rlbench[suffix]'"
    assert two_steps in missing_module("arctic_inference.suffix_decoding")
    if importlib.util.find_spec("arctic_inference") is not None:
        pytest.skip("arctic-inference is installed here")
    from reference_trainer.speculation.suffix import SuffixDrafter

    with pytest.raises(UserError, match="virtual environment active"):
        SuffixDrafter()
