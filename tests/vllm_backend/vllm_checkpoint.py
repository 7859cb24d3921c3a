"""A tiny random Llama checkpoint that both the reference engine and vLLM load: weights written by
transformers' `save_pretrained`, a word-level tokenizer built with `tokenizers` (tokenizer.json plus the
tokenizer_config.json that transformers' AutoTokenizer, and so vLLM, reads)."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = ["<pad>", "<bos>", "<eos>", *[f"w{i}" for i in range(125)]]  # 128 ids


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32, as the embedded model
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # random init: scale up so greedy decoding is not a flat, tie-prone argmax
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path, safe_serialization=True)

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<pad>",
                "model_max_length": 512,
            }
        )
    )
    return path


def write_tiny_char_llama(path: Path, seed: int = 0) -> Path:
    """A random char-level model in the embedded model's format (reference_trainer's save_model and char
    tokenizer), at head_dim 32: what `rlbench train --engine vllm` runs on without a real checkpoint."""
    from conftest import write_tiny_char_model

    return write_tiny_char_model(
        path, seed, eos_weight=0.3, hidden_size=64, intermediate_size=128, max_position_embeddings=512
    )
