"""The reference decoder against transformers' forward on the same random weights."""

from __future__ import annotations

import json

import pytest
import torch

from reference_trainer.model.loader import ModelLoadError, load_model, save_model


def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_logits_match_transformers(family, request):
    model_dir = request.getfixturevalue(f"{family}_dir")
    ours = load_model(model_dir)
    theirs = hf_model(model_dir)
    ids = torch.randint(3, 98, (3, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got - expected).abs().max()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_cached_forward_matches_full_forward(family, request):
    """Prefill in two chunks through the KV cache gives the full forward's logits."""
    from reference_trainer.model.decoder import KVCache

    model = load_model(request.getfixturevalue(f"{family}_dir"))
    ids = torch.randint(3, 98, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = KVCache(model.config, capacity=4, max_len=32, device=torch.device("cpu"), dtype=torch.float32)
    slots = torch.tensor([3, 1])
    with torch.no_grad():
        full = model(ids)
        first = model.forward_cached(ids[:, :12], torch.tensor([0, 0]), cache, slots)
        rest = model.forward_cached(ids[:, 12:], torch.tensor([12, 12]), cache, slots)
    assert torch.allclose(torch.cat([first, rest], 1), full, atol=1e-5)


def test_config_fields_read(qwen2_dir, llama_dir):
    qwen = load_model(qwen2_dir).config
    llama = load_model(llama_dir).config
    assert qwen.attention_bias and qwen.tie_word_embeddings and qwen.rope_theta == 1_000_000.0
    assert not llama.attention_bias and not llama.tie_word_embeddings and llama.rope_theta == 500_000.0
    assert qwen.num_key_value_heads == 2 and qwen.num_attention_heads == 4


def test_save_load_round_trip(llama_dir, tmp_path):
    model = load_model(llama_dir)
    save_model(model, tmp_path / "copy")
    again = load_model(tmp_path / "copy")
    ids = torch.randint(3, 98, (1, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))
    assert not list((tmp_path / "copy").glob("*.bin")), "weights must be safetensors only"


def test_bad_model_dirs(tmp_path, llama_dir):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="invalid config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(tmp_path)
    cfg = json.loads((llama_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((llama_dir / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="do not match"):
        load_model(tmp_path)
