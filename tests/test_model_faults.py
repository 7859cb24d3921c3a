"""Model directories that lie: a config.json that disagrees with its weights (or is not a config at all), and
chat templates the sandbox refuses. Each is one line naming the file, through generate, eval and train, before
any weights are read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli, write_tiny_char_model

CONFIG_LIES = [
    (
        {"hidden_size": 48},
        "model.safetensors: lm_head.weight has shape [99, 32], where config.json implies [99, 48]",
    ),
    (
        {"vocab_size": 120},
        "model.safetensors: lm_head.weight has shape [99, 32], where config.json implies [120, 32]",
    ),
    ({"num_attention_heads": 0}, "config.json: num_attention_heads is 0, not an integer in 1.."),
    ({"intermediate_size": -64}, "config.json: intermediate_size is -64, not an integer in 1.."),
    ({"hidden_size": 10**9}, "config.json: hidden_size is 1000000000, not an integer in 1.."),
    ({"hidden_size": "32"}, "config.json: hidden_size is '32', not an integer in 1.."),
    ({"num_key_value_heads": 3}, "num_attention_heads 2 is not a multiple of num_key_value_heads 3"),
    ({"rms_norm_eps": "tiny"}, "config.json: rms_norm_eps is 'tiny', not a positive number"),
    ({"eos_token_id": 500}, "config.json: eos_token_id is 500, not a token id below vocab_size 99"),
    (
        {"max_position_embeddings": 10**12},
        "config.json: max_position_embeddings is 1000000000000, not an integer",
    ),
    ({"num_hidden_layers": 3}, "do not match the config: missing ['model.layers.2."),
    ("list", "config.json: config.json is a JSON list, not an object"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("data")
    (data / "amc23.jsonl").write_text(
        json.dumps({"id": "a", "problem": "What is 1 + 1?", "answer": "2"}) + "\n"
    )
    return data


@pytest.mark.parametrize(("lie", "message"), CONFIG_LIES)
def test_a_config_that_disagrees_with_its_weights_is_one_line(tmp_path, data, lie, message):
    model = write_tiny_char_model(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps([config] if lie == "list" else {**config, **lie}))
    commands = [
        ("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2"),
        ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(model), "--out", "ev",
         "--max-tokens", "2"),
        ("train", "--model", str(model), "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
         "--max-tokens", "2", "--eval-every", "0", "--out", "run"),
    ]  # fmt: skip
    for command in commands:
        assert_one_line_error(cli(*command, tmp=tmp_path), message)


def _chat_model(path: Path, template: object) -> Path:
    """A tiny decoder with a BPE tokenizer whose tokenizer_config.json carries `template`."""
    import torch
    from test_tokenizer import _build_hf_dir

    from reference_trainer.model.config import ModelConfig
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import load_tokenizer

    _build_hf_dir(path)
    tokenizer = load_tokenizer(path)
    torch.manual_seed(0)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    save_model(
        DecoderLM(ModelConfig(vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_id, **shape)), path
    )
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return path


HOSTILE_TEMPLATES = [
    ("{% if %}", "TemplateSyntaxError"),
    ("{{ messages.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ("{{ cycler.__init__.__globals__ }}", "SecurityError"),
    ("{{ messages.append(1) }}", "SecurityError"),
    ("{{ raise_exception('this model refuses') }}", "TemplateError: this model refuses"),
    ("{{ undefined_function() }}", "UndefinedError"),
    ("{{ messages[7].content.upper() }}", "UndefinedError"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ range(10**9) | list }}", "OverflowError"),
    ("{{ messages | tojson(separators=1) }}", "TypeError"),
    (5, "TypeError"),
]


@pytest.mark.parametrize(("template", "kind"), HOSTILE_TEMPLATES)
def test_a_refused_chat_template_is_one_line(tmp_path, template, kind):
    model = _chat_model(tmp_path / "model", template)
    res = cli("generate", "--model", str(model), "--prompt", "hello", "--max-tokens", "2", tmp=tmp_path)
    assert_one_line_error(res, f"{model}: the chat template was refused ({kind}")
