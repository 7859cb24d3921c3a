"""Prompt templates: boxed-answer math and Knights-and-Knaves, optionally in the model's chat template."""

from __future__ import annotations

from typing import Any, Protocol

from reference_trainer.errors import UserError
from reference_trainer.tasks.grading import PROMPTS

TEMPLATES = ("auto", "chat", *PROMPTS)


class ChatTokenizer(Protocol):
    has_chat_template: bool

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str: ...


def user_message(problem: str, kind: str) -> str:
    """The suite-specific instruction around the problem text (`kind`: a name of grading.PROMPTS, or a
    suite's own prompt, a text holding {problem})."""
    if "{problem}" in kind:  # replaced, not str.format: a prompt's LaTeX braces are text
        return kind.replace("{problem}", problem)
    if kind not in PROMPTS:
        raise UserError(f"unknown prompt kind {kind!r}; use {' or '.join(PROMPTS)}")
    return f"{problem}\n\n{PROMPTS[kind]}"


def plain_prompt(problem: str, kind: str) -> str:
    """For base models with no chat template: the instruction, then an open answer turn."""
    return f"Question: {user_message(problem, kind)}\nAnswer: Let's think step by step."


def resolve_template(template: str, suite_default: str, tokenizer: ChatTokenizer | None) -> str:
    """`auto`: the model's chat template when it has one, else the suite's default; returns the concrete
    choice recorded in results (chat, or a name of grading.PROMPTS)."""
    if template not in TEMPLATES:
        raise UserError(f"unknown template {template!r}; choose from {', '.join(TEMPLATES)}")
    has_chat = tokenizer is not None and bool(getattr(tokenizer, "has_chat_template", False))
    if template == "auto":
        return "chat" if has_chat else suite_default
    if template == "chat" and not has_chat:
        others = ", ".join(t for t in TEMPLATES if t != "chat")
        raise UserError(f"--template chat: the model directory has no chat template; use {others}")
    return template


def build_prompt(problem: str, template: str, suite_default: str, tokenizer: ChatTokenizer | None) -> str:
    """The text sent to the engine. `template` is a resolved choice (chat, or a name of grading.PROMPTS)."""
    if template == "chat":
        assert tokenizer is not None
        messages = [{"role": "user", "content": user_message(problem, suite_default)}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return plain_prompt(problem, template)
