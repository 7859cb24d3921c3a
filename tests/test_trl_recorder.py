"""The TRL callback's folder and arguments, before any training: it claims its folder and checks every
argument when it is made. (Before: it deleted a finished run's trace.jsonl at on_train_begin, appended TRL's
steps to it, and refused only at on_train_end; two recorders appended to one trace.) Training with a real
GRPOTrainer is tests/test_integrations_trl.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from reference_trainer.errors import UserError  # noqa: E402
from rlbench.integrations.trl import RLBenchRecorder  # noqa: E402

ARGS, STATE = SimpleNamespace(num_generations=2), SimpleNamespace(global_step=0)


def _run(folder: Path, files: dict[str, str]) -> dict[Path, bytes]:
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return {p: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"train_config.json": "{}", "metrics.jsonl": "", "trace.jsonl": '{"kind": "update"}\n'},
         "holds a training run"),
        ({"run_config.json": "{}", "problems.jsonl": "", "results.json": "{}"}, "holds an evaluation"),
        ({"imported.json": "{}", "trace.jsonl": '{"kind": "update"}\n'}, "already holds a recorded"),
        ({"trace.jsonl": '{"kind": "update"}\n'}, "already holds a recorded"),
    ],
)  # fmt: skip
def test_a_folder_holding_a_run_is_refused_when_the_recorder_is_made(tmp_path, files, said):
    before = _run(tmp_path / "run", files)
    with pytest.raises(UserError, match=said):
        RLBenchRecorder(tmp_path / "run")
    assert {p: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.name != ".rlbench.lock"} == before


def test_overwrite_replaces_a_recorded_run_up_front(tmp_path):
    _run(tmp_path / "run", {"imported.json": "{}", "trace.jsonl": '{"kind": "update"}\n'})
    recorder = RLBenchRecorder(tmp_path / "run", overwrite=True)
    assert not (tmp_path / "run" / "trace.jsonl").exists()  # removed now, not when training starts
    assert json.loads((tmp_path / "run" / "imported.json").read_text())["recording"] is True
    recorder.on_train_begin(ARGS, STATE, None)
    recorder.finish()


@pytest.mark.parametrize("value", ["false", "no", [0], 0, 1, None, "True"])
def test_overwrite_takes_only_a_real_bool(tmp_path, value):
    """bool('false') is True: anything but True or False is refused, and the recorded run stays."""
    _run(tmp_path / "run", {"imported.json": "{}", "trace.jsonl": '{"kind": "update"}\n'})
    with pytest.raises(UserError, match="overwrite must be True or False"):
        RLBenchRecorder(tmp_path / "run", overwrite=value)
    assert (tmp_path / "run" / "trace.jsonl").read_text() == '{"kind": "update"}\n'


def test_one_folder_one_recorder_until_it_finishes(tmp_path):
    first = RLBenchRecorder(tmp_path / "run")
    with pytest.raises(UserError, match="another RLBenchRecorder"):
        RLBenchRecorder(tmp_path / "run")
    script = "import sys; from rlbench.integrations.trl import RLBenchRecorder; RLBenchRecorder(sys.argv[1])"
    args = [sys.executable, "-c", script, str(tmp_path / "run")]
    other = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert other.returncode != 0 and "is in use by another rlbench process" in other.stderr
    first.on_train_begin(ARGS, STATE, None)
    first.finish()  # the folder is given up: an imported run now, replaced only with overwrite
    with pytest.raises(UserError, match="already holds"):
        RLBenchRecorder(tmp_path / "run")
    RLBenchRecorder(tmp_path / "run", overwrite=True).finish()


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"slots": 0}, "--slots must be in 1.."),
        ({"slots": 2**63}, "--slots must be in 1.."),
        ({"slots": "8"}, "--slots must be an integer"),
        ({"whatif_workers": (0,)}, "--workers must be in 1.."),
        ({"whatif_workers": ()}, "give worker counts"),
        ({"gpu": "tpu"}, "unknown GPU preset"),
        ({"model_size": "900b"}, "no preset for '900b'"),
    ],
)
def test_every_argument_is_checked_when_the_recorder_is_made(tmp_path, kwargs, said):
    with pytest.raises(UserError, match=said):
        RLBenchRecorder(tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()  # checked before the folder is claimed
    with pytest.raises(UserError, match="must be a path"):
        RLBenchRecorder(3)  # type: ignore[arg-type]
