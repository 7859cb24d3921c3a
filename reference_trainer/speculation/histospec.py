"""HistoSpec (RhymeRL): draft tokens from earlier responses to the same prompt.

Responses to a prompt repeat from one epoch to the next, so the responses already generated for a prompt
(in earlier epochs, and siblings of the same group finished earlier in this step) predict the one being
generated. Per prompt, a suffix automaton over its most recent responses finds the longest suffix of the
response so far that occurred before and proposes its most frequent continuation as a draft; the engine
verifies the draft exactly (`Engine.verify`).

Memory is bounded: at most `max_prompts` prompts (LRU) x `max_responses` responses (+ slack, see
`PromptHistory.add`) from the last `max_epochs` policy versions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.option import Options, option
from reference_trainer.speculation.protocol import max_draft


class SuffixAutomaton:
    """A suffix automaton over several token strings, each followed by its own negative separator so that no
    match spans two responses. `cnt[v]` = occurrences (end positions) of the strings of state v, maintained
    online: a new end position counts once for every state on the new state's suffix-link path."""

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.cnt: list[int] = [0]
        self._last = 0
        self._strings = 0

    @property
    def num_states(self) -> int:
        return len(self.length)

    def add_string(self, tokens: list[int]) -> None:
        self._last = 0
        for token in tokens:
            self._extend(token)
        self._strings += 1
        self._extend(-self._strings)  # separator: unique, negative, never part of a draft

    def _new_state(self, length: int, trans: dict[int, int], link: int, cnt: int) -> int:
        self.next.append(trans)
        self.link.append(link)
        self.length.append(length)
        self.cnt.append(cnt)
        return len(self.length) - 1

    def _extend(self, c: int) -> None:
        nxt, link, length = self.next, self.link, self.length
        cur = self._new_state(length[self._last] + 1, {}, 0, 0)
        p = self._last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = self._new_state(length[p] + 1, dict(nxt[q]), link[q], self.cnt[q])
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur
        v = cur
        while v > 0:  # the new end position is an occurrence of every suffix of the current prefix
            self.cnt[v] += 1
            v = link[v]

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Extend a match (state, matched length) by one token, dropping its oldest tokens on a mismatch."""
        nxt, link = self.next, self.link
        while state > 0 and token not in nxt[state]:
            state = link[state]
            length = self.length[state]
        return (nxt[state][token], length + 1) if token in nxt[state] else (0, 0)

    def best_next(self, state: int) -> tuple[int | None, float]:
        """The most frequent real (non-separator) continuation of a state's strings and its share of all
        the state's continuations (separators included: a response that ended there counts against it)."""
        best, best_cnt, total = None, 0, 0
        for token, target in self.next[state].items():
            total += self.cnt[target]
            if token >= 0 and self.cnt[target] > best_cnt:
                best, best_cnt = token, self.cnt[target]
        return best, (best_cnt / total if total else 0.0)

    def draft(
        self, state: int, length: int, k: int, min_match: int, min_confidence: float = 0.0
    ) -> list[int]:
        """Up to k tokens following the match, most frequent continuation first, while the product of the
        continuations' empirical shares stays >= `min_confidence` (a draft's expected acceptance falls with
        it). A match with no continuation (it only ends responses) falls back to shorter suffixes, never
        below `min_match`."""
        out: list[int] = []
        confidence = 1.0
        while len(out) < k:
            token, share = self.best_next(state)
            while token is None and state > 0 and self.length[self.link[state]] >= min_match:
                state = self.link[state]
                length = self.length[state]
                token, share = self.best_next(state)
            confidence *= share
            if token is None or confidence < min_confidence:
                break
            out.append(token)
            state, length = self.next[state][token], length + 1
        return out


@dataclass
class PromptHistory:
    """The recent responses to one prompt, tagged by the policy version that finished them."""

    max_responses: int
    max_epochs: int
    responses: list[tuple[int, list[int]]] = field(default_factory=list)  # (epoch tag, tokens)
    sam: SuffixAutomaton = field(default_factory=SuffixAutomaton)
    version: int = 0  # bumped on every change: cached matches against an older version are redone

    def add(self, tokens: list[int], epoch: int) -> None:
        self.responses.append((epoch, list(tokens)))
        epochs = sorted({e for e, _ in self.responses})
        # Automata cannot forget, so eviction rebuilds. Rebuilding on every add would cost O(history) per
        # finished response; instead the store may run `max_responses // 2` over before it is trimmed, so a
        # rebuild happens at most once per that many adds (and once per new epoch).
        over = len(self.responses) > self.max_responses + max(1, self.max_responses // 2)
        if len(epochs) > self.max_epochs or over:
            keep = set(epochs[-self.max_epochs :])
            kept = [(e, t) for e, t in self.responses if e in keep]
            self.responses = kept[-self.max_responses :]
            self.sam = SuffixAutomaton()
            for _, toks in self.responses:
                self.sam.add_string(toks)
        else:
            self.sam.add_string(tokens)
        self.version += 1


@dataclass
class _SeqState:
    history: PromptHistory
    version: int = -1
    consumed: int = 0
    state: int = 0
    length: int = 0
    k: int = 0


@dataclass(frozen=True)
class HistoSpecOptions(Options):
    """HistoSpec's options (`spec.*`)."""

    max_draft: int = max_draft()
    max_prompts: int = option(4096, "prompts with a history (LRU)", minimum=1)
    max_responses: int = option(16, "responses kept per prompt", minimum=1)
    max_epochs: int = option(2, "policy versions a history spans", minimum=1)
    min_draft: int = option(1, "shortest adaptive draft", minimum=1)
    init_draft: int = option(4, "a new sequence's draft length", minimum=1)
    min_match: int = option(1, "shortest suffix match that may draft", minimum=0)
    rematch_window: int = option(64, "tokens re-matched after a history change", minimum=1)
    # 0.5 measured best on the embedded model (README: HistoSpec): a little coverage for higher acceptance.
    min_confidence: float = option(0.5, "stop a draft below this cumulative share", minimum=0)


class HistoryDrafter:
    """Per-prompt history stores (LRU over prompts) plus per-sequence match state and draft length.

    Draft length adapts per sequence: doubled (up to `max_draft`) when a whole draft was accepted, halved
    (down to `min_draft`) on a rejection.
    """

    def __init__(self, options: HistoSpecOptions | None = None) -> None:
        self.options = o = options or HistoSpecOptions()
        if not o.min_draft <= o.init_draft <= o.max_draft:
            raise ValueError("need 1 <= min_draft <= init_draft <= max_draft")
        self.max_prompts, self.max_responses, self.max_epochs = o.max_prompts, o.max_responses, o.max_epochs
        self.min_draft, self.max_draft, self.init_draft = o.min_draft, o.max_draft, o.init_draft
        self.min_match, self.rematch_window = o.min_match, o.rematch_window
        self.min_confidence = o.min_confidence
        self.prompts: OrderedDict[tuple[int, ...], PromptHistory] = OrderedDict()
        self._seqs: dict[Sequence, _SeqState] = {}

    # ---- history -----------------------------------------------------------------------------------------
    def _history(self, prompt_ids: list[int]) -> PromptHistory:
        key = tuple(prompt_ids)
        hist = self.prompts.get(key)
        if hist is None:
            hist = self.prompts[key] = PromptHistory(self.max_responses, self.max_epochs)
            while len(self.prompts) > self.max_prompts:
                self.prompts.popitem(last=False)
        else:
            self.prompts.move_to_end(key)
        return hist

    def add_response(self, prompt_ids: list[int], response_ids: list[int], epoch: int = 0) -> None:
        if response_ids:
            self._history(prompt_ids).add(response_ids, epoch)

    def on_done(self, seq: Sequence, epoch: int) -> None:
        """A sequence left the engine: a finished response becomes history at once (its group's siblings
        still running draft from it); an aborted partial one does not."""
        self._seqs.pop(seq, None)
        if seq.status == SequenceStatus.FINISHED:
            self.add_response(seq.prompt_ids, seq.response_ids, epoch)

    # ---- drafting ----------------------------------------------------------------------------------------
    def _state(self, seq: Sequence) -> _SeqState:
        st = self._seqs.get(seq)
        if st is None:
            st = self._seqs[seq] = _SeqState(self._history(seq.prompt_ids), k=self.init_draft)
        return st

    def draft(self, seq: Sequence, limit: int) -> list[int]:
        """Up to min(limit, the sequence's current draft length) tokens continuing `seq`'s response."""
        st = self._state(seq)
        hist, sam = st.history, st.history.sam
        resp = seq.response_ids  # a resumed partial response's earlier tokens are part of it too
        if st.version != hist.version:  # the automaton changed: redo the match over a recent window
            st.version, st.state, st.length = hist.version, 0, 0
            st.consumed = max(0, len(resp) - self.rematch_window)
        for token in resp[st.consumed :]:
            st.state, st.length = sam.step(st.state, st.length, token)
        st.consumed = len(resp)
        k = min(limit, st.k)
        if k <= 0 or (st.length < self.min_match and resp):
            return []
        return sam.draft(st.state, st.length, k, self.min_match, self.min_confidence)

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        st = self._seqs.get(seq)
        if st is None or drafted == 0:
            return
        st.k = min(self.max_draft, st.k * 2) if accepted >= drafted else max(self.min_draft, st.k // 2)

    def draft_len(self, seq: Sequence) -> int:
        return self._state(seq).k

    def stats(self) -> dict[str, Any]:
        return {
            "prompts": len(self.prompts),
            "responses": sum(len(h.responses) for h in self.prompts.values()),
            "states": sum(h.sam.num_states for h in self.prompts.values()),
        }
