"""Tokenizers: char round trip, and an HF tokenizer built in-test checked against transformers as oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_trainer.model.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer

QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = ["what is 2 + 2 ? the answer is 4", "hello world", "knights and knaves tell the truth", "boxed 12"]


def test_char_round_trip_and_specials(tmp_path: Path) -> None:
    tok = CharTokenizer()
    assert tok.vocab_size == 99
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    text = "Find $x$ with x^2 = 4.\n\\boxed{2} {}|"
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == tok.bos_id and len(ids) == len(text) + 1
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id], skip_special=False) == "<bos>" + text + "<eos>"
    assert tok.decode(tok.encode("π ≈ 3~")) == "? ? 3~"  # unknown characters degrade, never crash
    assert not tok.has_chat_template
    tok.save(tmp_path)
    raw = json.loads((tmp_path / "char_tokenizer.json").read_text())
    assert raw["type"] == "char" and raw["special"] == {"pad": 0, "bos": 1, "eos": 2}
    again = load_tokenizer(tmp_path)
    assert isinstance(again, CharTokenizer) and again.encode(text) == tok.encode(text)


def _build_hf_dir(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tmp_path.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": {"content": "<|im_end|>", "special": True},
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "chat_template": QWEN_TEMPLATE,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 1]}))
    return tmp_path


def test_hf_tokenizer_matches_transformers(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    model_dir = _build_hf_dir(tmp_path)
    tok = load_tokenizer(model_dir)
    assert isinstance(tok, HFTokenizer)
    oracle = PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json"), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    text = "what is 2 + 2 ? hello knights"
    assert tok.encode(text) == oracle.encode(text, add_special_tokens=False)
    assert tok.decode(tok.encode(text)) == text
    im_end = tok._tok.token_to_id("<|im_end|>")
    assert tok.eos_id == im_end and tok.pad_id == tok._tok.token_to_id("<|endoftext|>")
    assert tok.eos_token_ids == {im_end, 1}  # tokenizer_config eos plus generation_config's list
    assert tok.decode([*tok.encode("hello"), im_end]) == "hello"
    assert "<|im_end|>" in tok.decode([im_end], skip_special=False)

    messages = [{"role": "user", "content": "What is 2 + 2? Put it in \\boxed{}."}]
    for gen in (True, False):
        ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
        ref = oracle.apply_chat_template(
            messages, chat_template=QWEN_TEMPLATE, tokenize=False, add_generation_prompt=gen
        )
        assert ours == ref
    assert tok.apply_chat_template(messages).endswith("<|im_start|>assistant\n")


def test_hf_chat_template_file_and_sandbox(tmp_path: Path) -> None:
    from reference_trainer.errors import ModelLoadError

    model_dir = _build_hf_dir(tmp_path)
    (model_dir / "chat_template.jinja").write_text(
        "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
        "{{ messages[0]['content']|tojson }}{{ eos_token }}"
    )
    tok = load_tokenizer(model_dir)
    assert tok.apply_chat_template([{"role": "user", "content": "<a & b>"}]) == '"<a & b>"<|im_end|>'
    with pytest.raises(ModelLoadError, match="chat template was refused .TemplateError: one message only"):
        tok.apply_chat_template([{"role": "user", "content": "a"}] * 2)
    (model_dir / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ModelLoadError, match="chat template was refused .SecurityError"):
        load_tokenizer(model_dir).apply_chat_template([{"role": "user", "content": "a"}])


def test_hf_save_round_trip(tmp_path: Path) -> None:
    tok = load_tokenizer(_build_hf_dir(tmp_path / "a"))
    tok.save(tmp_path / "b")
    again = load_tokenizer(tmp_path / "b")
    assert again.encode("hello world") == tok.encode("hello world")
    assert again.has_chat_template and again.eos_id == tok.eos_id


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no tokenizer in"):
        load_tokenizer(tmp_path)
