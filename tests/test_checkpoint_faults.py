"""Damaged checkpoints, resume state and model weights: each is one line naming the file, never a traceback
from deep inside torch or safetensors (truncated tensors, missing or mistyped fields, integer or bool
weights, NaN weights, a `checkpoints/latest` that is not a checkpoint's name, a device without data)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import assert_one_line_error, cli

from faults.fault_hostile import recast as weights_as

TINY = ("--prompts-per-step", "1", "--group-size", "2", "--max-tokens", "4", "--eval-every", "0")


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A 2-step run with a checkpoint at step 2, copied by each test before it damages it."""
    where = tmp_path_factory.mktemp("ckpt")
    args = ("train", "--model", str(tiny_model_dir), *TINY, "--steps", "2", "--checkpoint-every", "2")
    assert cli(*args, "--out", "run", tmp=where).returncode == 0
    return where / "run"


def copy_of(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run", tmp_path / "run" / "checkpoints" / "step-000002"


def edit_json(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


DAMAGE = {
    "truncated optimizer.safetensors": (
        lambda c: (c / "trainer" / "optimizer.safetensors").write_bytes(
            (c / "trainer" / "optimizer.safetensors").read_bytes()[:100]
        ),
        "optimizer.safetensors",
    ),
    "empty optimizer.safetensors": (
        lambda c: (c / "trainer" / "optimizer.safetensors").write_bytes(b""),
        "optimizer.safetensors",
    ),
    "no stream": (
        lambda c: edit_json(c / "trainer" / "trainer_state.json", lambda d: d.pop("stream")),
        "trainer_state.json: stream is missing, not dict",
    ),
    "3-byte torch_rng": (
        lambda c: edit_json(c / "trainer" / "trainer_state.json", lambda d: d.update(torch_rng=[1, 2, 3])),
        "trainer_state.json: torch_rng is not a torch RNG state",
    ),
    "step as text": (
        lambda c: edit_json(c / "trainer" / "trainer_state.json", lambda d: d.update(step="2")),
        "trainer_state.json: step is str, not int",
    ),
    "param_groups a number": (
        lambda c: (c / "trainer" / "optimizer.json").write_text('{"param_groups": 5}'),
        "optimizer.json: not an optimizer's state",
    ),
    "stream without next_index": (
        lambda c: edit_json(c / "trainer" / "trainer_state.json", lambda d: d.update(stream={})),
        "cannot restore it (KeyError",
    ),
    "int8 weights": (lambda c: weights_as(c / "model.safetensors", torch.int8), "is I8, not floating point"),
    "bool weights": (
        lambda c: weights_as(c / "model.safetensors", torch.bool),
        "is BOOL, not floating point",
    ),
    "NaN weight": (
        lambda c: weights_as(c / "model.safetensors", torch.float32, float("nan")),
        "holds NaN or infinite values",
    ),
    "latest not UTF-8": (
        lambda c: (c.parent / "latest").write_bytes(b"\xff\xfe\n"),
        "latest: not a checkpoint",
    ),
    "latest a path": (lambda c: (c.parent / "latest").write_text("../../x\n"), "is not a checkpoint's name"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_on_resume(finished_run, tmp_path, damage):
    run, ckpt = copy_of(finished_run, tmp_path)
    spoil, message = DAMAGE[damage]
    spoil(ckpt)
    res = cli("train", "--resume", "run", "--steps", "3", tmp=tmp_path)
    assert_one_line_error(res, message)


@pytest.mark.parametrize(
    ("dtype", "poison", "message"),
    [
        (torch.int8, None, "is I8, not floating point"),
        (torch.int32, None, "is I32, not floating point"),
        (torch.float32, float("inf"), "holds NaN or infinite values"),
    ],
)
def test_weights_that_cannot_be_a_model_are_one_line_in_generate_and_eval(
    tiny_model_dir, tmp_path, dtype, poison, message
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights_as(model / "model.safetensors", dtype, poison)
    res = cli("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2", tmp=tmp_path)
    assert_one_line_error(res, f"{model / 'model.safetensors'}: model.layers.0.mlp.up_proj.weight")
    assert message in res.stderr
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    res = cli("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(model), "--out", "ev",
              tmp=tmp_path)  # fmt: skip
    assert_one_line_error(res, message)


def test_a_device_that_holds_no_data_is_refused(tiny_model_dir, tmp_path):
    res = cli("generate", "--model", str(tiny_model_dir), "--prompt", "x", "--device", "meta", tmp=tmp_path)
    assert_one_line_error(res, "device 'meta': rlbench runs on cpu, cuda or mps")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--temperature", "1e-320", "--temperature must be 0 (greedy) or in 1e-05..100, got 1e-320"),
        ("--temperature", "5e-324", "--temperature must be 0 (greedy) or in 1e-05..100"),
        ("--temperature", "1e300", "--temperature must be 0 (greedy) or in 1e-05..100"),
        ("--top-p", "1e-320", "--top-p must be >= 1e-06 and <= 1"),
    ],
)
def test_sampling_values_that_vanish_in_float32_are_refused(tiny_model_dir, tmp_path, option, value, message):
    """A subnormal temperature or top-p passed "finite and > 0" and became 0 in float32: an index past the
    vocabulary in generate, eval and train alike."""
    res = cli("generate", "--model", str(tiny_model_dir), "--prompt", "x", option, value, tmp=tmp_path)
    assert_one_line_error(res, message)
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    res = cli("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir), option,
              value, "--out", "ev", tmp=tmp_path)  # fmt: skip
    assert_one_line_error(res, message)
    if option == "--temperature":  # train samples only (no greedy rollouts, no --top-p)
        res = cli("train", "--model", str(tiny_model_dir), *TINY, option, value, "--out", "run", tmp=tmp_path)
        assert_one_line_error(res, f"--temperature must be in 1e-05..100, got {float(value)!r}")


@pytest.mark.parametrize("option", ["--lr", "--kl-coef"])
def test_update_coefficients_that_overflow_float32_are_refused(tiny_model_dir, tmp_path, option):
    res = cli("train", "--model", str(tiny_model_dir), *TINY, option, "1e300", "--out", "run", tmp=tmp_path)
    assert_one_line_error(res, "must be ")
    assert "<= 1e+06, got 1e+300" in res.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", "--group-size", "2147483647"), "--prompts-per-step x --group-size is "),
        (("train", "--prompts-per-step", "2147483647"), "--prompts-per-step x --group-size is "),
        (("train", "--prompts-per-step", "512", "--group-size", "256"), "at most 65,536"),
        (("eval", "-k", "2147483647"), "--samples (-k) is 2,147,483,647 sequences at once; at most 65,536"),
    ],
)
def test_sizes_that_cannot_run_are_refused_before_anything_loads(tiny_model_dir, tmp_path, args, message):
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    rest = ("--suite", "amc23", "--data-dir", str(data)) if args[0] == "eval" else TINY[4:]
    res = cli(*args, "--model", str(tiny_model_dir), *rest, "--out", "run", tmp=tmp_path)
    assert_one_line_error(res, message)
    assert not (tmp_path / "run").exists()


def test_weights_the_user_may_not_read_are_said_to_be_so(tiny_model_dir, monkeypatch):
    """safetensors says "No such file or directory" for a file it may not read (tests run as root, who
    may read anything: the refusal is the OS's, simulated)."""
    import builtins
    import errno

    from reference_trainer.errors import ModelLoadError
    from reference_trainer.model.loader import tensor_shapes

    real = builtins.open

    def refuse(file, *args, **kwargs):
        if str(file).endswith(".safetensors"):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)
    with pytest.raises(ModelLoadError, match=r"model.safetensors: Permission denied$"):
        tensor_shapes(tiny_model_dir)
