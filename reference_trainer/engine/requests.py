"""Request bookkeeping shared by both engines (engine.py, vllm_engine.py): one place for the stop rules, for
building a validated `Sequence` per request, for finishing and aborting it, and for `generate`.

The engines differ only in how a sequence leaves their batch (`_release`): the reference engine frees its
KV slot and its key and tells its speculation hook; the vLLM engine aborts the request inside vLLM.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.sequence import OnFinish, Params, Request, Sequence, SequenceStatus
from reference_trainer.trace.writer import Trace

STOP_TAIL_TOKENS = 64  # stop strings are searched in the decoded text of this many last response tokens


def stop_reason(
    seq: Sequence, token: int, eos_token_ids: set[int], tokenizer: Any, max_model_len: int
) -> str | None:
    """Why `seq` stops after `token` was appended ("eos", "stop" or "length"), or None: EOS unless
    ignore_eos, a stop token, a stop string in the decoded tail, max_tokens, or the context's end."""
    params = seq.params
    if not params.ignore_eos and token in eos_token_ids:
        return "eos"
    if token in params.stop_token_ids:
        return "stop"
    if params.stop and tokenizer is not None:
        tail = tokenizer.decode(seq.response_ids[-STOP_TAIL_TOKENS:])
        if any(stop in tail for stop in params.stop):
            return "stop"
    if len(seq.response_ids) >= params.max_tokens or seq.length >= max_model_len:
        return "length"
    return None


class RequestBook:
    """The request side of an engine: subclasses call `_init_book` and implement `_release` (free what a
    sequence held once it is finished or aborted), `add_request`, `step`, `has_unfinished`, `running`
    and `waiting`."""

    config: EngineConfig
    max_model_len: int
    eos_token_ids: set[int]
    tokenizer: Any
    trace: Trace
    policy_version: int

    def _init_book(
        self,
        config: EngineConfig,
        max_model_len: int,
        eos_token_ids: Iterable[int],
        tokenizer: Any,
        trace: Trace | None,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.tokenizer = tokenizer
        self.trace = trace if trace is not None else Trace()
        self.policy_version = 0
        self._ids = itertools.count()

    # ---- hooks: what each engine implements ----------------------------------------------------------------
    def _release(self, seq: Sequence) -> None:
        """Free what `seq` holds in the engine; its status is already FINISHED or ABORTED."""
        raise NotImplementedError

    def add_request(self, request: Request) -> Sequence:
        raise NotImplementedError

    def step(self) -> list[Sequence]:
        raise NotImplementedError

    def has_unfinished(self) -> bool:
        raise NotImplementedError

    @property
    def running(self) -> list[Sequence]:
        raise NotImplementedError

    @property
    def waiting(self) -> list[Sequence]:
        raise NotImplementedError

    # ---- shared bookkeeping ------------------------------------------------------------------------------
    def _new_sequence(self, request: Request) -> Sequence:
        """A validated sequence for a new (or resumed) request, admitted now."""
        seq = Sequence.for_request(
            request,
            request.seq_id or f"seq-{next(self._ids)}",
            max_model_len=self.max_model_len,
            policy_version=self.policy_version,
        )
        seq.t_admit = self.trace.now()
        return seq

    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[float]) -> bool:
        """Append generated tokens (each tagged with the current policy version) until a stop rule fires;
        then finish the sequence and return True (later tokens are dropped)."""
        for token, logprob in zip(tokens, logprobs, strict=True):
            seq.response_ids.append(token)
            seq.logprobs.append(logprob)
            seq.policy_versions.append(self.policy_version)
            reason = stop_reason(seq, token, self.eos_token_ids, self.tokenizer, self.max_model_len)
            if reason is not None:
                self._finish(seq, reason)
                return True
        return False

    def _append_one_each(
        self, seqs: list[Sequence], tokens: list[float], logprobs: list[float]
    ) -> list[Sequence]:
        """`_append` of one token to each sequence (a decode step), in one loop: `stop_reason` runs only
        where a rule could fire (an EOS token, or past the length below which nothing else can stop the
        sequence: `Sequence.stops_only_on_eos_below`), since at batch 256 a call per token is most of a
        step's host time. Returns the sequences that finished."""
        finished = []
        version, eos, limit = self.policy_version, self.eos_token_ids, self.max_model_len
        for seq, value, logprob in zip(seqs, tokens, logprobs, strict=True):
            token = int(value)
            response = seq.response_ids
            response.append(token)
            seq.logprobs.append(logprob)
            seq.policy_versions.append(version)
            if token in eos or len(response) >= seq.stops_only_on_eos_below:
                reason = stop_reason(seq, token, eos, self.tokenizer, limit)
                if reason is not None:
                    self._finish(seq, reason)
                    finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._end(seq, SequenceStatus.FINISHED, reason)

    def abort(self, seq: Sequence) -> Sequence:
        """Stop a sequence now; its tokens and log-probs so far stay on the returned object."""
        if not seq.is_finished:
            self._end(seq, SequenceStatus.ABORTED, "abort")
        return seq

    def _end(self, seq: Sequence, status: SequenceStatus, reason: str) -> None:
        # Status first: the release hook (HistoSpec's on_done) keeps finished responses, not aborted ones.
        seq.status = status
        seq.finish_reason = reason
        seq.t_finish = self.trace.now()
        self._release(seq)

    def generate(
        self, prompts: list[list[int]], params: Params = None, on_finish: OnFinish = None
    ) -> list[Sequence]:
        """Run prompts to completion; returns their sequences in input order. `on_finish(i, seq)` is called
        as each one finishes (i: its index in `prompts`), so a caller can save work as it completes."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(Request(p, sp)) for p, sp in zip(prompts, plist, strict=True)]
        index = {seq.seq_id: i for i, seq in enumerate(seqs)}
        while self.has_unfinished():
            for seq in self.step():
                if on_finish is not None and seq.seq_id in index:
                    on_finish(index[seq.seq_id], seq)
        return seqs

    def close(self) -> None:
        """Abort every request still queued or running (their tokens stay on the sequences)."""
        for seq in [*self.running, *self.waiting]:
            self.abort(seq)
