"""The reference decoder against transformers' forward on the same random weights."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_hf_checkpoint

from reference_trainer.errors import ModelLoadError
from reference_trainer.model.loader import load_model, save_model


def cached(model, ids, start, cache, rows, select=None, **batch):  # type: ignore[no-untyped-def]
    """The engine's cached forward: [B, Q] ids continuing at `start` in `rows` of `cache`."""
    from reference_trainer.model.attention import CachedBatch

    return model.forward_cached(ids, CachedBatch(start, ids.shape[1], cache, rows, **batch), select=select)


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
    """Prefill in two chunks through the paged KV cache gives the full forward's logits, with the rows'
    blocks scattered over the pool in different orders."""
    from reference_trainer.model.attention import PagedKVCache

    model = load_model(request.getfixturevalue(f"{family}_dir"))
    ids = torch.randint(3, 98, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = PagedKVCache(model.config, 10, 4, torch.device("cpu"), torch.float32)  # 10 blocks of 4
    tables = torch.tensor([[7, 2, 5, 0, 3], [1, 6, 4, 9, 8]])
    with torch.no_grad():
        full = model(ids)
        first = cached(model, ids[:, :12], torch.tensor([0, 0]), cache, tables[:, :3])
        rest = cached(model, ids[:, 12:], torch.tensor([12, 12]), cache, tables)
    assert torch.allclose(torch.cat([first, rest], 1), full, atol=1e-5)


def test_cached_forward_ragged_rows(llama_dir):
    """Rows with fewer real tokens than the batch width (num_new) store only those, so padding never
    overwrites another row's blocks; `select` picks each row's last real position."""
    from reference_trainer.model.attention import PagedKVCache

    model = load_model(llama_dir)
    ids = torch.randint(3, 98, (2, 9), generator=torch.Generator().manual_seed(3))
    cache = PagedKVCache(model.config, 6, 4, torch.device("cpu"), torch.float32)
    tables = torch.tensor([[1, 2, 3], [4, 5, 0]])  # row 1 owns two blocks: its padding must not touch 0..3
    with torch.no_grad():
        full = model(ids)
        got = cached(
            model,
            ids,
            torch.tensor([0, 0]),
            cache,
            tables,
            num_new=torch.tensor([9, 6]),
            select=torch.tensor([8, 9 + 5]),
        )
        after = cached(model, ids[:1, :1], torch.tensor([9]), cache, tables[:1])
    assert torch.allclose(got[0, 0], full[0, 8], atol=1e-5)
    assert torch.allclose(got[1, 0], full[1, 5], atol=1e-5)
    # row 0's cache is intact: continuing it matches a full forward over the 10 tokens
    expected = model(torch.cat([ids[:1], ids[:1, :1]], 1))[0, 9]
    assert torch.allclose(after[0, 0], expected, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_slot_cache_forward_matches_full_forward(family, request):
    """The contiguous layout: chunked prefill into slots [3, 1], then decode steps over the slot range read
    as a view (contiguous=True) and over gathered slots, all equal to the full forward."""
    from reference_trainer.model.attention import SlotKVCache

    model = load_model(request.getfixturevalue(f"{family}_dir"))
    ids = torch.randint(3, 98, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = SlotKVCache(model.config, capacity=4, max_len=32, device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        full = model(ids)
        first = cached(model, ids[:, :12], torch.tensor([0, 0]), cache, torch.tensor([3, 1]))
        mid = cached(model, ids[:, 12:16], torch.tensor([12, 12]), cache, torch.tensor([3, 1]))
        # slots 1..3 as one view; slot 2 is idle and gets a dummy row at position 0
        view = cached(
            model,
            torch.stack([ids[1, 16:], torch.zeros(4, dtype=torch.long), ids[0, 16:]]),
            torch.tensor([16, 0, 16]),
            cache,
            torch.arange(1, 4),
            num_new=torch.tensor([4, 1, 4]),
            contiguous=True,
        )
    got = torch.cat([first, mid, torch.stack([view[2], view[0]])], 1)
    assert torch.allclose(got, full, atol=1e-5)


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
    with pytest.raises(ModelLoadError, match="config.json:1: malformed JSON \\(Expecting property name"):
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


def test_rope_inv_freq_stays_fp32_in_bf16_and_matches_transformers_past_position_1000(tmp_path):
    """Casting the model to bf16 (loader, engine factory, rollout workers) keeps inv_freq fp32 and exact: in
    bf16 RoPE's angle at position 1,000 would be off by about a radian. cos/sin at positions 1,000-3,000 equal
    transformers' own rotary embedding of the same bf16 model, and the exact angles to bf16 rounding."""
    from transformers import AutoModelForCausalLM

    from reference_trainer.model.decoder import rope_inv_freq

    path = write_hf_checkpoint(tmp_path / "llama", "llama", max_position_embeddings=4096)
    ours = load_model(path, dtype="bfloat16")
    assert ours.inv_freq.dtype == torch.float32
    assert torch.equal(ours.inv_freq, rope_inv_freq(ours.config))
    assert torch.equal(ours.to(torch.float16).to(torch.bfloat16).inv_freq, rope_inv_freq(ours.config))
    positions = torch.arange(1000, 3000)[None]
    cos, sin = ours._rope(positions, torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    x = torch.zeros(1, positions.shape[1], 8, dtype=torch.bfloat16)
    their_cos, their_sin = theirs.model.rotary_emb(x, positions)
    half, step = ours.config.head_dim // 2, 2**-8  # a bf16 step at magnitudes up to 1

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(((a.double() - b.double()).abs() <= step).all())

    assert close(cos[0, :, 0], their_cos[0]) and close(sin[0, :, 0, half:], their_sin[0, :, half:])
    assert close(sin[0, :, 0, :half], -their_sin[0, :, :half])  # stored negated for `rotate`
    exact = positions[0, :, None].double() * rope_inv_freq(ours.config).double()
    assert close(cos[0, :, 0, :half], exact.cos()) and close(sin[0, :, 0, half:], exact.sin())
    # the fp32 buffer is what keeps it so: the same angles from a bf16 inv_freq are off by up to a radian
    drifted = positions[0, :, None].double() * rope_inv_freq(ours.config).bfloat16().double()
    assert (drifted - exact).abs().max() > 1.0
