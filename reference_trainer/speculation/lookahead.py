"""Lookahead drafts (BubbleSpec, SRT): a request's own continuation, generated in the previous step's bubble.

While a step's last samples finish, the rollout strategy (rollout/base.py BubbleFill) starts the next step's
requests in the idle slots under the current weights: a *lookahead request* (`Request.lookahead`), with the
sampling parameters and seed of the request it runs ahead of. When the step ends it is stopped, and its
tokens so far become that request's draft here. After the update the request itself runs under the new
weights and the engine verifies the draft exactly (`Engine.verify`). The verifier draws at each position
the token plain decoding would draw, keyed by the request's seed and the position, so a draft made from the
same seed under nearby weights is the token plain decoding draws wherever the policy moved little: that
is where the acceptance comes from. The first rejection ends the draft (the rest follows a token that was
not drawn); the request then drafts from `fallback` (HistoSpec's history, SuffixDecoding) if there is one.

A lookahead request is never a sample: the strategy never hands it to the update, and the engine counts its
slots and tokens apart (`lookahead_slots`, `lookahead_tokens` in the trace, docs/metrics.md). It gets no
drafts itself: its tokens are speculative work already, and a verify of them would widen every step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from reference_trainer.engine.sequence import Sequence
from reference_trainer.option import Options
from reference_trainer.speculation.protocol import Drafter, max_draft

DraftKey = tuple[tuple[int, ...], int | None]  # (prompt, seed): the request a draft continues


def draft_key(prompt_ids: list[int], seed: int | None) -> DraftKey:
    return tuple(prompt_ids), seed


@dataclass
class _Match:
    """A running request's lookahead draft and how far its response has been checked against it."""

    tokens: list[int]
    checked: int = 0
    alive: bool = True


@dataclass(frozen=True)
class LookaheadOptions(Options):
    """The LookaheadDrafter's own options, in front of any drafter in a lookahead mode (`spec.*`)."""

    max_draft: int = max_draft()


class LookaheadDrafter:
    """The Drafter over lookahead runs: per (prompt, seed), the tokens a lookahead request generated; else
    `fallback`'s drafts. Memory: at most `max_entries` drafts, the oldest dropped first; a draft goes once
    its request is done."""

    def __init__(
        self,
        fallback: Drafter | None = None,
        options: LookaheadOptions | None = None,
        max_entries: int = 4096,
    ) -> None:
        self.options = options or LookaheadOptions()
        self.fallback, self.max_draft, self.max_entries = fallback, self.options.max_draft, max_entries
        self.drafts: OrderedDict[DraftKey, list[int]] = OrderedDict()
        self._matches: dict[Sequence, _Match] = {}
        self.counts = {"stored": 0, "used": 0}  # drafts stored; requests that found one

    def _store(self, key: DraftKey, tokens: list[int]) -> None:
        self.drafts[key] = list(tokens)
        self.drafts.move_to_end(key)
        self.counts["stored"] += 1
        while len(self.drafts) > self.max_entries:
            self.drafts.popitem(last=False)

    def add_response(self, prompt_ids: list[int], response_ids: list[int], epoch: int = 0) -> None:
        """A response given without its seed: the fallback's history where there is one, else a draft for
        any request of the prompt that has no lookahead draft of its own (an earlier run's output)."""
        if self.fallback is not None:
            self.fallback.add_response(prompt_ids, response_ids, epoch)
        elif response_ids:
            self._store(draft_key(prompt_ids, None), response_ids)

    def on_done(self, seq: Sequence, epoch: int) -> None:
        """A lookahead request's tokens (finished or stopped) become its request's draft; a request's done
        drops its draft and tells the fallback."""
        if seq.lookahead:
            if seq.response_ids:
                self._store(draft_key(seq.prompt_ids, seq.params.seed), seq.response_ids)
            return
        if self._matches.pop(seq, None) is not None:
            self.drafts.pop(draft_key(seq.prompt_ids, seq.params.seed), None)
        if self.fallback is not None:
            self.fallback.on_done(seq, epoch)

    def _match(self, seq: Sequence) -> _Match | None:
        match = self._matches.get(seq)
        if match is None:  # looked up until found: the lookahead run may stop after its request started
            tokens = self.drafts.get(draft_key(seq.prompt_ids, seq.params.seed))
            if tokens is None:
                tokens = self.drafts.get(draft_key(seq.prompt_ids, None))
            if tokens is None:
                return None
            match = self._matches[seq] = _Match(tokens)
            self.counts["used"] += 1
        resp = seq.response_ids
        while match.alive and match.checked < len(resp):  # only the tokens emitted since the last call
            i = match.checked
            match.alive = i < len(match.tokens) and resp[i] == match.tokens[i]
            match.checked += 1
        return match

    def draft(self, seq: Sequence, limit: int) -> list[int]:
        """The lookahead run's tokens after `seq`'s response while the response still follows them (at most
        min(limit, max_draft)); else the fallback's draft."""
        if seq.lookahead:
            return []
        match = self._match(seq)
        if match is not None and match.alive:
            n = len(seq.response_ids)
            out = match.tokens[n : n + min(limit, self.max_draft)]
            if out:
                return out
        return self.fallback.draft(seq, limit) if self.fallback is not None else []

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        if self.fallback is not None:
            self.fallback.observe(seq, drafted, accepted)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lookahead_drafts": len(self.drafts), **self.counts}
        if self.fallback is not None:
            out.update(self.fallback.stats())
        return out
