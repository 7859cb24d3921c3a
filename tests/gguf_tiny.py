"""A tiny random Llama written as a GGUF file the way llama.cpp's converter writes one: Q/K rows permuted,
2-D weights quantized (Q8_0), a byte-level BPE vocabulary with merges, control tokens and a chat template.
The GGUF import tests read it back through transformers' GGUF loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CORPUS = ["what is 2 + 2 ? the answer is 4", "hello world", "knights and knaves tell the truth", "boxed 12"]
HEADS, KV_HEADS = 4, 2
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def train_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order (convert_hf_to_gguf.py's `permute`); transformers reverses it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path, seed: int = 0, quant: str = "Q8_0", architecture: str = "llama"
) -> tuple[dict[str, np.ndarray], object]:
    """Write the file; returns the weights the import must produce (HF names and layout, dequantized)
    and the tokenizers.Tokenizer the vocabulary came from."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer()
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tok.to_str())["model"]["merges"]]
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # peaked logits (no near-ties for greedy) and norms that are not all ones
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            else:
                param.mul_(4.0)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(64 // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3: control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(TEMPLATE)
    expected: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        data = tensor.numpy()
        if name in _TOP_NAMES:
            gguf_name = _TOP_NAMES[name]
        else:
            _, _, layer, *rest = name.split(".")
            gguf_name = f"blk.{layer}.{_LAYER_NAMES['.'.join(rest[:-1])]}.weight"
        stored = data
        if ".attn_q." in gguf_name:
            stored = _permute(data, HEADS)
        elif ".attn_k." in gguf_name:
            stored = _permute(data, KV_HEADS)
        if data.ndim == 2 and quant != "F32":
            qtype = getattr(gguf.GGMLQuantizationType, quant)
            writer.add_tensor(gguf_name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
            # Quantization works on blocks along rows, so it commutes with the row permutation.
            expected[name] = gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype).reshape(
                data.shape
            )
        else:
            writer.add_tensor(gguf_name, stored.astype(np.float32))
            expected[name] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected, tok


def write_int8_gguf(path: Path) -> None:
    """A Llama GGUF whose only tensor has a type no codec dequantizes (I8)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.int8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
