"""The engine: requests in, one scheduled forward per `step()`, tokens and log-probs out, all traced."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.requests import RequestBook
from reference_trainer.engine.runner import ModelRunner
from reference_trainer.engine.sampler import SamplingBatch, sample
from reference_trainer.engine.scheduler import Scheduler
from reference_trainer.engine.sequence import Sequence, resume_seed
from reference_trainer.engine.trace import Trace
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import resolve_dtype

if TYPE_CHECKING:
    from reference_trainer.engine.speculative import Speculator


class Engine(RequestBook):
    """Continuous batching over `max_num_seqs` slots of a preallocated KV cache.

    The engine owns its model object; `update_weights` copies new weights into it in place between steps
    (the cache's layout does not change, so nothing is reallocated). Stop rules, finishing, aborting and
    `generate` are the shared `RequestBook`'s (requests.py).
    """

    def __init__(
        self,
        model: DecoderLM,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer: object | None = None,
        trace: Trace | None = None,
    ) -> None:
        config = config or EngineConfig()
        self.model = model.eval().fuse_projections()
        device = next(model.parameters()).device
        dtype = (
            next(model.parameters()).dtype if config.dtype == "auto" else resolve_dtype(config.dtype, device)
        )
        max_len = min(config.max_model_len, model.config.max_position_embeddings)
        self._init_book(config, max_len, eos_token_ids, tokenizer, trace)
        self.slots = SlotManager(
            model.config, config.max_num_seqs, max_len + config.max_verify_tokens, device, dtype
        )
        self.scheduler = Scheduler(self.slots, config.max_prefill_tokens)
        self.runner = ModelRunner(model, config, self.slots)
        self.device = device
        self._generators: dict[str, torch.Generator | None] = {}
        # Optional speculative decoder (engine/speculative.py); it takes over decode steps when attached.
        self.speculator: Speculator | None = None

    # ---- requests ----------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        seq_id: str | None = None,
        response_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        policy_versions: list[int] | None = None,
        priority: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Sequence:
        """Queue a request. Passing `response_ids` (with their log-probs and policy versions) resumes a
        partial rollout: the engine prefills prompt + response and continues after it."""
        params = params or SamplingParams()
        seq = self._new_sequence(
            prompt_ids, params, seq_id, response_ids, logprobs, policy_versions, priority, meta
        )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(resume_seed(params.seed, seq.resumed_tokens))
        self._generators[seq.seq_id] = gen
        self.scheduler.add(seq)
        return seq

    def _release(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        self._generators.pop(seq.seq_id, None)
        if self.speculator is not None:  # a finished response is history at once for its siblings
            self.speculator.on_done(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def running(self) -> list[Sequence]:
        return list(self.scheduler.running.values())

    @property
    def waiting(self) -> list[Sequence]:
        return self.scheduler.waiting

    # ---- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One forward: a batched prefill of newly admitted sequences or a decode of all running ones.
        Returns the sequences that finished in this step."""
        kind, seqs = self.scheduler.schedule()
        if not seqs:
            return []
        t_start = self.trace.now()
        occupied = {slot: s.seq_id for slot, s in self.scheduler.running.items()}
        if kind == "decode" and self.speculator is not None:
            return self.speculator.step(seqs, t_start, occupied)
        logits = self.runner.prefill(seqs) if kind == "prefill" else self.runner.decode(seqs)
        finished = self.emit(seqs, logits)
        self.trace.engine_step(kind, t_start, self.trace.now(), occupied, self.slots.capacity, len(seqs))
        return finished

    def emit(self, seqs: list[Sequence], logits: torch.Tensor) -> list[Sequence]:
        """Sample one token per sequence from its next-token logits ([B, V]) and append it; returns the
        sequences that finished."""
        batch = SamplingBatch.build(
            [s.params for s in seqs], [self._generators.get(s.seq_id) for s in seqs], self.device
        )
        tokens, logprobs = sample(logits, batch)
        return [
            s
            for s, t, lp in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True)
            if self._append(s, [t], [lp])
        ]

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy new weights into the engine's model in place; in-flight sequences continue under them."""
        own = self.model.state_dict()
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
        self.model.repack()  # the CPU matmuls run over packed copies of the weights (model/packed.py)
        self.policy_version = self.policy_version + 1 if version is None else version
