"""HistoSpec's history store: suffix-automaton matching, most frequent continuation, bounds, draft length."""

from __future__ import annotations

import random

import pytest

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.speculation.histospec import HistoryDrafter, HistoSpecOptions, SuffixAutomaton

PROMPT = [7, 8, 9]


def seq(response: list[int], prompt: list[int] = PROMPT) -> Sequence:
    return Sequence("s", list(prompt), SamplingParams(), response_ids=list(response))


def match(sam: SuffixAutomaton, tokens: list[int]) -> tuple[int, int]:
    state, length = 0, 0
    for t in tokens:
        state, length = sam.step(state, length, t)
    return state, length


def test_longest_suffix_match_counts_and_separation():
    rng = random.Random(0)
    strings = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    sam = SuffixAutomaton()
    for s in strings:
        sam.add_string(s)
    text = [rng.randrange(5) for _ in range(40)]
    for end in range(len(text) + 1):
        # Brute force: the longest suffix of text[:end] that occurs inside one string (never across two).
        best = 0
        for n in range(1, end + 1):
            sub = text[end - n : end]
            if any(sub == s[i : i + n] for s in strings for i in range(len(s) - n + 1)):
                best = n
        state, length = match(sam, text[:end])
        assert length == best
        if best:
            sub = text[end - best : end]
            occurrences = sum(sub == s[i : i + best] for s in strings for i in range(len(s) - best + 1))
            assert sam.cnt[state] == occurrences


def test_draft_proposes_the_most_frequent_continuation():
    sam = SuffixAutomaton()
    for s in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 6]):
        sam.add_string(s)
    state, length = match(sam, [1, 2, 3])
    assert sam.draft(state, length, 1, 1) == [5]  # "1 2 3 5" occurs twice, "1 2 3 4" once
    state, length = match(sam, [1, 2])
    assert sam.draft(state, length, 3, 1) == [3, 5]  # 2 -> 3 (3x) -> 5 (2x), then the response ends
    assert sam.draft(*match(sam, [1, 2, 3, 5]), 4, 1) == []  # nothing ever followed "...3 5"


def test_draft_stops_when_the_continuations_share_falls_below_min_confidence():
    sam = SuffixAutomaton()
    for s in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 6]):
        sam.add_string(s)
    state, length = match(sam, [1, 2])
    # 2 -> 3 has share 3/4; then 3 -> 5 has 2/3: cumulative 1/2
    assert sam.draft(state, length, 3, 1, min_confidence=0.5) == [3, 5]
    assert sam.draft(state, length, 3, 1, min_confidence=0.6) == [3]
    assert sam.draft(state, length, 3, 1, min_confidence=0.8) == []
    drafter = HistoryDrafter(HistoSpecOptions(min_confidence=0.6))
    for s in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 6]):
        drafter.add_response(PROMPT, s)
    assert drafter.draft(seq([1, 2]), 4) == [3]


def test_match_falls_back_to_shorter_suffixes():
    sam = SuffixAutomaton()
    sam.add_string([1, 2, 3])  # "1 2 3" only ends a response...
    sam.add_string([5, 3, 4, 4])  # ... but "3" is followed by "4" elsewhere
    state, length = match(sam, [1, 2, 3])
    assert length == 3
    assert sam.draft(state, length, 2, 1) == [4, 4]
    assert sam.draft(state, length, 2, 2) == []  # a floor of 2 matched tokens forbids that fallback
    state, length = match(sam, [8, 8, 2])  # an unseen token drops the match to its known suffix
    assert length == 1 and sam.draft(state, length, 1, 1) == [3]


def test_drafter_uses_siblings_and_follows_growing_responses():
    drafter = HistoryDrafter(
        HistoSpecOptions(init_draft=4, max_draft=8, min_confidence=0.0)
    )  # every match drafts
    s = seq([])
    assert drafter.draft(s, 8) == []  # no history yet
    sibling = seq([10, 11, 12, 13, 14, 15, 2])
    sibling.status = SequenceStatus.FINISHED
    drafter.on_done(sibling, epoch=0)  # a finished sibling is history at once
    assert drafter.draft(s, 8) == [10, 11, 12, 13]  # empty response: draft the responses' opening
    s.response_ids += [10, 11]
    assert drafter.draft(s, 8) == [12, 13, 14, 15]
    assert drafter.draft(s, 2) == [12, 13]  # the engine's limit (max_tokens, cache room) caps it
    assert drafter.draft(seq([12], prompt=[1]), 8) == []  # history is per prompt
    aborted = seq([20, 21])
    aborted.status = SequenceStatus.ABORTED
    drafter.on_done(aborted, epoch=0)
    assert len(drafter.prompts[tuple(PROMPT)].responses) == 1  # partial responses are not history


def test_adaptive_draft_length_stays_in_bounds():
    drafter = HistoryDrafter(HistoSpecOptions(min_draft=2, init_draft=3, max_draft=10))
    drafter.add_response(PROMPT, list(range(10, 40)))
    s = seq([10])
    lengths = []
    for _ in range(4):  # full acceptance grows the draft, to the bound
        lengths.append(len(drafter.draft(s, 100)))
        drafter.observe(s, lengths[-1], lengths[-1])
    assert lengths == [3, 6, 10, 10]
    for _ in range(4):  # rejections shrink it, to the bound
        drafter.observe(s, drafter.draft_len(s), 0)
    assert drafter.draft_len(s) == 2
    with pytest.raises(ValueError):
        HistoryDrafter(HistoSpecOptions(min_draft=4, init_draft=2))


def test_memory_is_bounded_lru_prompts_responses_epochs():
    drafter = HistoryDrafter(
        HistoSpecOptions(max_prompts=3, max_responses=4, max_epochs=2, min_confidence=0.0)
    )
    for p in range(5):
        drafter.add_response([p], [1, 2, 3])
    assert list(drafter.prompts) == [(2,), (3,), (4,)]  # least recently used prompts evicted
    drafter.draft(seq([1], prompt=[2]), 4)  # a draft counts as a use
    drafter.add_response([5], [1])
    assert (2,) in drafter.prompts and (3,) not in drafter.prompts

    for i in range(20):
        drafter.add_response(PROMPT, [100 + i, 1, 2], epoch=0)
        hist = drafter.prompts[tuple(PROMPT)]
        assert len(hist.responses) <= 4 + 2  # max_responses plus the rebuild slack
        assert hist.sam.num_states <= 2 * sum(len(r) + 1 for _, r in hist.responses)
    assert [r[0] for _, r in hist.responses][-1] == 119  # the most recent are kept
    drafter.add_response(PROMPT, [200], epoch=1)
    drafter.add_response(PROMPT, [300], epoch=2)  # a third epoch evicts the oldest one
    assert {e for e, _ in hist.responses} == {1, 2}
    assert drafter.draft(seq([], prompt=PROMPT), 1)[0] in (200, 300)
