"""SuffixDecoding (Arctic Inference) as a drafter: drafts from every earlier response, not one prompt's.

SuffixDecoding keeps one global suffix tree over all responses (finished ones and the running ones, token
by token) and, per running request, a suffix tree over its prompt and response so far. Per step it matches
the end of the sequence in both trees and proposes the continuation whose estimated probabilities score
higher, as long as each token's estimate stays >= `suffix_min_prob` and the draft is no longer than
`suffix_spec_factor` x match length + `suffix_spec_offset` (and `max_draft`). So, unlike HistoSpec
(histospec.py), it drafts in the first epoch and on prompts never seen before, from other prompts'
responses and from the prompt itself. The trees are the `arctic-inference` package's (its C++
`SuffixDecodingCache`: `pip install 'rlbench[suffix]'`); the engine verifies the drafts exactly, as it
does HistoSpec's (`Engine.verify`), so only speed changes.

Memory is bounded by `suffix_max_cached` responses in the global tree (FIFO), each at most
`suffix_max_depth` tokens deep.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from reference_trainer.engine.sequence import Sequence
from reference_trainer.errors import SUFFIX_INSTALL, UserError
from reference_trainer.option import Options, option
from reference_trainer.speculation.protocol import max_draft

# arctic-inference compiles a small C++ extension against the installed torch (errors.SUFFIX_INSTALL)
INSTALL_HINT = f"the suffix drafter needs arctic-inference: {SUFFIX_INSTALL}"


def suffix_available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class SuffixOptions(Options):
    """SuffixDecoding's options (`spec.*`)."""

    suffix_max_depth: int = option(64, "suffix trees' depth: longest match + draft", minimum=1)
    # vLLM's default for suffix_decoding_max_cached_requests: the global tree's memory bound.
    suffix_max_cached: int = option(10000, "responses in the global tree (FIFO)", minimum=1)
    suffix_spec_factor: float = option(1.0, "draft <= this x match length + offset", minimum=0)
    suffix_spec_offset: float = option(0.0, "that offset, in tokens")
    suffix_min_prob: float = option(0.1, "stop at a token estimated below it", minimum=0)
    max_draft: int = max_draft()


class SuffixDrafter:
    """The Drafter (protocol.py) over Arctic Inference's SuffixDecodingCache.

    Each sequence the engine drafts for is a request of the cache, under an id of its own (a Sequence
    object would be kept alive by the cache until its response is evicted). Its new tokens go into the
    trees when it next drafts and when it leaves the engine.
    """

    def __init__(self, options: SuffixOptions | None = None) -> None:
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise UserError(INSTALL_HINT) from None  # one line, not an ImportError's traceback
        self.options = o = options or SuffixOptions()
        self.max_draft, self.max_depth = o.max_draft, o.suffix_max_depth
        self.spec_factor = o.suffix_spec_factor
        self.spec_offset = o.suffix_spec_offset
        self.min_prob = o.suffix_min_prob
        self.cache = SuffixDecodingCache(
            max_tree_depth=o.suffix_max_depth, max_cached_requests=o.suffix_max_cached
        )
        self._ids = itertools.count()
        self._seqs: dict[Sequence, tuple[int, int]] = {}  # running sequence -> (request id, tokens fed)
        self.last_match: dict[Sequence, int] = {}  # the matched context length of each sequence's last draft

    def _request(self, seq: Sequence) -> int:
        """The sequence's request id, its trees brought up to date with its response so far."""
        req, fed = self._seqs.get(seq, (-1, 0))
        if req < 0:
            req = next(self._ids)
            self.cache.start_request(req, seq.prompt_ids)
        resp = seq.response_ids  # a resumed partial response's earlier tokens are part of it too
        if len(resp) > fed:
            self.cache.add_active_response(req, resp[fed:])
        self._seqs[seq] = (req, len(resp))
        return req

    def add_response(self, prompt_ids: list[int], response_ids: list[int], epoch: int = 0) -> None:
        """A response generated elsewhere (an earlier run) joins the global tree."""
        if response_ids:
            req = next(self._ids)
            self.cache.start_request(req, prompt_ids)
            self.cache.add_active_response(req, response_ids)
            self.cache.stop_request(req)

    def on_done(self, seq: Sequence, epoch: int) -> None:
        """A sequence left the engine: its prompt tree goes, its response stays in the global tree (an
        aborted partial response too: it is text this policy wrote, and every draft is verified)."""
        if seq in self._seqs:
            self._request(seq)
            self.cache.stop_request(self._seqs.pop(seq)[0])
        self.last_match.pop(seq, None)

    def draft(self, seq: Sequence, limit: int) -> list[int]:
        """Up to min(limit, max_draft) tokens continuing `seq`, from the better-scoring of its prompt tree
        and the global tree."""
        req = self._request(seq)
        k = min(limit, self.max_draft)
        if k <= 0:
            return []
        context = (seq.prompt_ids + seq.response_ids)[-self.max_depth :]
        d = self.cache.speculate(
            req,
            context,
            max_spec_tokens=k,
            max_spec_factor=self.spec_factor,
            max_spec_offset=self.spec_offset,
            min_token_prob=self.min_prob,
        )
        self.last_match[seq] = d.match_len
        return list(d.token_ids[:k])

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """SuffixDecoding sizes drafts by match length and estimated probability, not by past acceptance."""

    def stats(self) -> dict[str, Any]:
        return {"cached_responses": len(self.cache.cached_requests), "running": len(self._seqs)}
