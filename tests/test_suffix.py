"""The SuffixDecoding drafter: drafts from every prompt's responses, running ones too, and from the prompt;
selected per mode. Its exactness is tested with HistoSpec's in test_speculative.py (by drafter)."""

from __future__ import annotations

import pytest

from reference_trainer.engine.config import SamplingParams
from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.errors import UserError
from reference_trainer.modes import get_mode
from reference_trainer.speculation.drafters import SpeculationOptions, VLLMSpecOptions
from reference_trainer.speculation.histospec import HistoryDrafter, HistoSpecOptions

pytest.importorskip("arctic_inference.suffix_decoding")

from reference_trainer.speculation.suffix import SuffixDrafter, SuffixOptions  # noqa: E402

PROMPT = [7, 8, 9]


def seq(response: list[int], prompt: list[int] = PROMPT) -> Sequence:
    return Sequence("s", list(prompt), SamplingParams(), response_ids=list(response))


def finished(response: list[int], prompt: list[int] = PROMPT) -> Sequence:
    s = seq(response, prompt)
    s.status = SequenceStatus.FINISHED
    return s


def test_drafts_from_other_prompts_responses_where_histospec_has_none():
    suffix, history = (
        SuffixDrafter(SuffixOptions(suffix_min_prob=0.0)),
        HistoryDrafter(HistoSpecOptions(min_confidence=0.0)),
    )
    for drafter in (suffix, history):
        drafter.add_response([1, 2], [10, 11, 12, 13, 14, 15])
    other = seq([10, 11], prompt=[3, 4])  # a prompt never seen: HistoSpec's first epoch
    assert history.draft(other, 4) == []
    assert suffix.draft(other, 4) == [12, 13]  # drafts no longer than the match (spec_factor 1.0)
    assert (
        SuffixDrafter(SuffixOptions(suffix_min_prob=0.0, suffix_spec_offset=4)).draft(other, 3) == []
    )  # no history
    wide = SuffixDrafter(SuffixOptions(suffix_min_prob=0.0, suffix_spec_factor=4.0))
    wide.add_response([1, 2], [10, 11, 12, 13, 14, 15])
    assert wide.draft(other, 3) == [12, 13, 14]  # the engine's limit caps it
    assert wide.draft(seq([10, 11], prompt=[5]), 8) == [12, 13, 14, 15]
    assert (
        SuffixDrafter(SuffixOptions(max_draft=1, suffix_spec_factor=4.0)).draft(other, 8) == []
    )  # empty global tree


def test_drafts_from_the_prompt_and_from_running_responses():
    drafter = SuffixDrafter(SuffixOptions(suffix_min_prob=0.0, suffix_spec_factor=2.0))
    echo = seq([20, 21], prompt=[20, 21, 22, 23, 5])
    # The prompt's text, then the response itself (prompt + response is one text), continue the response.
    assert drafter.draft(echo, 4) == [22, 23, 5, 20]
    running = seq([30, 31, 32, 33, 34])
    assert drafter.draft(running, 4) == []  # nothing to match yet, but its tokens are now in the tree
    sibling = seq([30, 31])
    assert drafter.draft(sibling, 4) == [32, 33, 34]  # a running sibling's partial response drafts
    running.response_ids.append(35)
    assert drafter.draft(seq([33, 34], prompt=[1]), 4) == []  # its new token goes in when it next drafts
    drafter.draft(running, 4)
    assert drafter.draft(seq([33, 34], prompt=[1]), 4) == [35]


def test_finished_and_aborted_responses_stay_and_memory_is_bounded():
    drafter = SuffixDrafter(SuffixOptions(suffix_min_prob=0.0, suffix_max_cached=2, suffix_spec_factor=4.0))
    done = seq([40, 41, 42])
    drafter.draft(done, 4)
    done.response_ids.append(43)
    done.status = SequenceStatus.ABORTED  # a partial response is text this policy wrote: kept
    drafter.on_done(done, epoch=0)
    assert drafter.stats() == {"cached_responses": 1, "running": 0}
    assert drafter.draft(seq([41, 42]), 4) == [43]  # the tokens that came after its last draft too
    drafter.on_done(seq([41, 42]), epoch=0)
    for first in (50, 60):
        drafter.add_response(PROMPT, [first, first + 1, first + 2])
    assert drafter.stats()["cached_responses"] == 2  # FIFO: the oldest responses went
    assert drafter.draft(seq([60, 61]), 4) == [62]  # this request takes a slot: 50's response goes
    assert drafter.draft(seq([50, 51]), 4) == []


def test_selected_per_mode_and_options_of_the_other_drafter_are_errors():
    suffix, rhyme = get_mode("suffix"), get_mode("rhyme")
    assert suffix.speculation_options({}) == SpeculationOptions.of({"drafter": "suffix"})
    assert rhyme.speculation_options({"max_draft": 4}) == SpeculationOptions.of(
        {"drafter": "histospec", "max_draft": 4}
    )
    assert suffix.speculation_options({}, "vllm") == VLLMSpecOptions(
        method="suffix"
    )  # vLLM's own SuffixDecoding
    assert get_mode("sorted+suffix").check_options({"spec": {"suffix_min_prob": 0.2}})
    assert rhyme.check_options({"spec": {"drafter": "suffix", "suffix_max_depth": 32}})
    with pytest.raises(UserError, match="option spec.min_confidence needs spec.drafter=histospec"):
        suffix.check_options({"spec": {"min_confidence": 0.2}})
    with pytest.raises(UserError, match="option spec.suffix_min_prob needs spec.drafter=suffix"):
        rhyme.check_options({"spec": {"suffix_min_prob": 0.2}})
    # One set of options for several modes (rlbench compare): each drafter takes its own and the shared ones.
    both = {"spec": {"min_confidence": 0.6, "suffix_min_prob": 0.2, "max_draft": 4}}
    assert suffix.accepted(both) == {"spec": {"suffix_min_prob": 0.2, "max_draft": 4}}
    assert rhyme.accepted(both) == {"spec": {"min_confidence": 0.6, "max_draft": 4}}
    with pytest.raises(UserError, match="unknown spec.drafter 'eagle'"):
        rhyme.check_options({"spec": {"drafter": "eagle"}})


def test_the_benchmark_attributes_drafts_to_other_prompts():
    from benchmarks.histospec import SourceCounter

    counter = SourceCounter(SuffixDrafter(SuffixOptions(suffix_min_prob=0.0)))
    counter.add_response([1, 2], [10, 11, 12, 13, 14, 15])  # another prompt's response
    other = seq([10, 11], prompt=[3, 4])
    assert counter.draft(other, 4) == [12, 13]
    counter.observe(other, 2, 1)
    own = seq([10, 11], prompt=[10, 11, 12, 13])  # the prompt itself continues "10 11" the same way
    assert counter.draft(own, 4) == [12, 13]
    counter.observe(own, 2, 2)
    taken = counter.take()
    assert taken["verified_draft_tokens"] == 4
    assert taken["from_other_prompts"] == 0.5 and taken["acceptance_from_other_prompts"] == 0.5
    assert counter.take()["verified_draft_tokens"] == 0  # counts restart
    other.response_ids += [12, 13, 20]
    counter.on_done(other, epoch=0)  # a finished response is its prompt's own text from then on
    again = seq([10, 11], prompt=[3, 4])
    assert counter.draft(again, 4) == [12, 13]
    counter.observe(again, 2, 0)
    assert counter.take()["from_other_prompts"] == 0.0
