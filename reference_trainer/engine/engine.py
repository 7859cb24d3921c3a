"""The engine: requests in, one scheduled forward per `step()`, tokens and log-probs out, all traced."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.runner import ModelRunner
from reference_trainer.engine.sampler import SamplingBatch, sample
from reference_trainer.engine.scheduler import Scheduler
from reference_trainer.engine.sequence import Sequence, SequenceStatus, resume_seed
from reference_trainer.engine.trace import Trace
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import resolve_dtype

if TYPE_CHECKING:
    from reference_trainer.engine.speculative import Speculator


class Engine:
    """Continuous batching over `max_num_seqs` slots of a preallocated KV cache.

    The engine owns its model object; `update_weights` copies new weights into it in place between steps
    (the cache's layout does not change, so nothing is reallocated).
    """

    def __init__(
        self,
        model: DecoderLM,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer: object | None = None,
        trace: Trace | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.model = model.eval().fuse_projections()
        device = next(model.parameters()).device
        dtype = (
            next(model.parameters()).dtype
            if self.config.dtype == "auto"
            else resolve_dtype(self.config.dtype, device)
        )
        max_len = min(self.config.max_model_len, model.config.max_position_embeddings)
        self.max_model_len = max_len
        self.slots = SlotManager(
            model.config, self.config.max_num_seqs, max_len + self.config.max_verify_tokens, device, dtype
        )
        self.scheduler = Scheduler(self.slots, self.config.max_prefill_tokens)
        self.runner = ModelRunner(model, self.config, self.slots)
        self.eos_token_ids = set(eos_token_ids)
        self.tokenizer = tokenizer
        self.trace = trace if trace is not None else Trace()
        self.policy_version = 0
        self.device = device
        self._ids = itertools.count()
        self._generators: dict[str, torch.Generator | None] = {}
        self.on_finish: Callable[[Sequence], None] | None = None
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
        seq = Sequence.for_request(
            seq_id or f"seq-{next(self._ids)}",
            prompt_ids,
            params,
            max_model_len=self.max_model_len,
            policy_version=self.policy_version,
            response_ids=response_ids,
            logprobs=logprobs,
            policy_versions=policy_versions,
            priority=priority,
            meta=meta,
        )
        seq.t_admit = self.trace.now()
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(resume_seed(params.seed, seq.resumed_tokens))
            self._generators[seq.seq_id] = gen
        else:
            self._generators[seq.seq_id] = None
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> Sequence:
        """Stop a sequence now; its tokens and log-probs so far stay on the returned object."""
        if not seq.is_finished:
            self.scheduler.release(seq)
            seq.status = SequenceStatus.ABORTED
            seq.finish_reason = "abort"
            seq.t_finish = self.trace.now()
            self._generators.pop(seq.seq_id, None)
            if self.speculator is not None:
                self.speculator.on_done(seq)
        return seq

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

    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[float]) -> bool:
        """Append accepted tokens, applying stop conditions; returns True when the sequence finished."""
        for token, logprob in zip(tokens, logprobs, strict=True):
            seq.response_ids.append(token)
            seq.logprobs.append(logprob)
            seq.policy_versions.append(self.policy_version)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason)
                return True
        return False

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if not params.ignore_eos and token in self.eos_token_ids:
            return "eos"
        if token in params.stop_token_ids:
            return "stop"
        if params.stop and self.tokenizer is not None:
            tail = self.tokenizer.decode(seq.response_ids[-64:])  # type: ignore[attr-defined]
            if any(stop in tail for stop in params.stop):
                return "stop"
        if len(seq.response_ids) >= params.max_tokens or seq.length >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.t_finish = self.trace.now()
        self._generators.pop(seq.seq_id, None)
        if self.speculator is not None:  # before on_finish: a finished response is history at once
            self.speculator.on_done(seq)
        if self.on_finish is not None:
            self.on_finish(seq)

    # ---- conveniences ------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[Sequence]:
        """Run prompts to completion; returns their sequences in input order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.has_unfinished():
            done = self.step()
            if progress is not None and done:
                progress(len(done))
        return seqs

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy new weights into the engine's model in place; in-flight sequences continue under them."""
        own = self.model.state_dict()
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
        self.policy_version = self.policy_version + 1 if version is None else version
