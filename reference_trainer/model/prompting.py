"""How task text becomes model input, shared by SFT, rollout and generation so they never drift apart."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """The model's own chat template when it has one; otherwise BOS + text + newline (the embedded format)."""
    if getattr(tokenizer, "has_chat_template", False):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        return tokenizer.encode(rendered)
    return tokenizer.encode(text + "\n", add_bos=True)


def encode_response(tokenizer: Any, text: str) -> list[int]:
    """Response tokens as the model must emit them: the text, then EOS."""
    return tokenizer.encode(text) + [tokenizer.eos_id]
