"""Generation backends for eval: the reference engine, or vLLM when installed. Tests use a fake one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from reference_trainer.engine.config import EngineConfig
from reference_trainer.errors import UserError
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.rollout.engines import RolloutEngineSpec, build_rollout_engine, check_engine_kind
from rlbench.models import load_model_and_tokenizer

if TYPE_CHECKING:
    from reference_trainer.engine.config import SamplingParams


OnText = Callable[[int, str], None] | None  # told each response's text as it finishes: (its index, text)


class GenerationBackend(Protocol):
    """Text in, text out. `tokenizer` (may be None) gives the chat template and token counts. A backend
    may also set `last_truncated`: per prompt of the last `generate`, whether it was cut to fit."""

    name: str
    model: str
    tokenizer: Any

    def generate(self, prompts: list[str], params: list[SamplingParams], on_text: OnText = None) -> list[str]:
        """The responses in prompt order; `on_text(i, text)` as each one finishes, where the backend can."""
        ...

    def close(self) -> None: ...


def _decoded(tokenizer: Any, on_text: OnText) -> Callable[[int, Any], None] | None:
    """The engine's per-sequence callback, handing the decoded response to `on_text`."""
    if on_text is None:
        return None
    return lambda i, seq: on_text(i, tokenizer.decode(seq.response_ids))


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


class _EngineBackend:
    """A backend over one of reference_trainer's rollout engines (its `_engine`): prompts cut to fit, the
    engine closed with the backend."""

    tokenizer: Any
    _engine: Any
    truncated_prompts: int = 0
    last_truncated: list[bool] = []  # reassigned by each generate, never changed in place

    def generate(self, prompts: list[str], params: list[SamplingParams], on_text: OnText = None) -> list[str]:
        """The engine's responses, each prompt cut to the room the context leaves it (`_fit`): to its last
        tokens, which hold the question and the answer cue; the cuts are counted."""
        if not prompts:
            return []
        ids = [self.tokenizer.encode(p, add_bos=not self.tokenizer.has_chat_template) for p in prompts]
        engine, room = self._fit(ids, max(p.max_tokens for p in params))
        self.last_truncated = [len(seq) > room for seq in ids]
        for i, seq in enumerate(ids):
            if len(seq) > room:
                ids[i] = seq[-room:]
                self.truncated_prompts += 1
        seqs = engine.generate(ids, list(params), on_finish=_decoded(self.tokenizer, on_text))
        return [self.tokenizer.decode(s.response_ids) for s in seqs]

    def _fit(self, ids: list[list[int]], max_tokens: int) -> tuple[Any, int]:
        """The engine to run the prompts `ids` with responses up to `max_tokens`, and the prompt tokens it
        has room for."""
        raise NotImplementedError

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine = None


class ReferenceBackend(_EngineBackend):
    """reference_trainer's engine. The engine is sized lazily to the longest prompt seen plus max_tokens
    (capped by the model's context), so a small model does not preallocate a huge KV cache."""

    name = "reference"

    def __init__(self, model_dir: Path, device: str = "cpu", max_num_seqs: int = 64) -> None:
        self.model = str(check_model_dir(Path(model_dir)))
        self.device = resolve_device(device)
        self._lm, self.tokenizer = load_model_and_tokenizer(Path(model_dir), device=self.device)
        self._max_num_seqs = max_num_seqs
        self._engine: Any = None
        self._engine_len = 0

    def _engine_for(self, needed: int) -> Any:
        limit = int(self._lm.config.max_position_embeddings)
        needed = min(limit, -(-needed // 256) * 256)  # round up so a few longer prompts don't rebuild it
        if self._engine is None or needed > self._engine_len:
            cfg = EngineConfig(max_num_seqs=self._max_num_seqs, max_model_len=needed, device=self.device)
            self._engine = build_rollout_engine(RolloutEngineSpec(config=cfg), self.tokenizer, model=self._lm)
            self._engine_len = needed
        return self._engine

    def _fit(self, ids: list[list[int]], max_tokens: int) -> tuple[Any, int]:
        engine = self._engine_for(max(len(i) for i in ids) + max_tokens)
        # A response budget the context cannot hold is capped, as vLLM caps max_tokens: prompts keep at most
        # half the context and responses stop at the context's end (finish reason "length").
        return engine, self._engine_len - min(max_tokens, self._engine_len // 2)


class VLLMBackend(_EngineBackend):
    """reference_trainer's VLLMEngine over the same model directory (needs vLLM). Prompts are tokenized with
    the model directory's own tokenizer (char-level or HF) and fed to vLLM as token ids, so every model the
    reference backend evaluates runs here too."""

    name = "vllm"

    def __init__(self, model_dir: Path, device: str = "auto", seed: int = 0, max_num_seqs: int = 64) -> None:
        check_engine_kind("vllm")  # the install line before the model directory is read
        self.model = str(check_model_dir(Path(model_dir)))
        try:
            self.tokenizer: Any = load_tokenizer(model_dir)
        except (FileNotFoundError, ValueError) as err:
            raise UserError(f"{model_dir}: {str(err).splitlines()[0]}") from None
        from reference_trainer.model.loader import read_config  # torch: only once a backend is built

        self._max_len = read_config(model_dir).max_position_embeddings  # the checked config
        cfg = EngineConfig(
            max_num_seqs=max_num_seqs, max_model_len=self._max_len, device=resolve_device(device)
        )
        spec = RolloutEngineSpec("vllm", cfg, seed=seed)
        self._engine: Any = build_rollout_engine(spec, self.tokenizer, model_dir=model_dir)

    def _fit(self, ids: list[list[int]], max_tokens: int) -> tuple[Any, int]:
        room = self._max_len - max_tokens - 1
        if room <= 0:
            raise UserError(
                f"--max-tokens leaves no room for a prompt in the model's {self._max_len}-token context"
            )
        return self._engine, room


def make_backend(engine: str, model_dir: Path, device: str, seed: int) -> GenerationBackend:
    check_engine_kind(engine)
    if engine == "vllm":
        return VLLMBackend(model_dir, device=device, seed=seed)
    return ReferenceBackend(model_dir, device=device)
