"""Every rollout side satisfies the protocol its callers rely on (engine/protocol.py): runtime isinstance
where an instance is cheap, and a signature comparison (names, kinds, defaults) that isinstance skips. The
shared stop rules (engine/requests.py) are checked once here for both engines."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.protocol import RequestEngine, RolloutEngine
from reference_trainer.engine.requests import STOP_TAIL_TOKENS, RequestBook, stop_reason
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus
from reference_trainer.engine.vllm_engine import VLLMEngine
from reference_trainer.model.loader import load_model
from reference_trainer.rollout.workers import LocalWorkerPool, RayWorkerPool, WorkerPool, WorkerSpec
from reference_trainer.trace.writer import Trace


def protocol_members(proto: type) -> dict[str, Any]:
    """name -> the protocol's definition (a function, a property, or None for a data member)."""
    members: dict[str, Any] = {}
    for base in reversed(proto.__mro__):
        if base is object or not getattr(base, "_is_protocol", False) or base.__module__ == "typing":
            continue
        members.update(dict.fromkeys(getattr(base, "__annotations__", {})))
        for name, value in vars(base).items():
            if not name.startswith("_"):  # typing's own (_is_protocol, _abc_impl, ...)
                members[name] = value
    return members


def mismatches(cls: type, proto: type) -> list[str]:
    """How `cls` differs from `proto`'s methods and properties: a missing member, a method that is not one,
    or parameters (name, kind, default) that differ. Annotations are not compared: implementations narrow
    them (torch.Tensor for Any)."""
    found = []
    for name, spec in protocol_members(proto).items():
        if spec is None:  # a data member: an instance attribute, checked by isinstance
            continue
        impl = inspect.getattr_static(cls, name, None)
        if impl is None:
            found.append(f"{name}: missing")
        elif isinstance(spec, property):
            if not isinstance(impl, property):
                found.append(f"{name}: not a property")
        elif not callable(impl):
            found.append(f"{name}: not a method")
        else:
            want = [(p.name, p.kind, p.default) for p in inspect.signature(spec).parameters.values()]
            got = [(p.name, p.kind, p.default) for p in inspect.signature(impl).parameters.values()]
            if want != got:
                found.append(f"{name}: {got} != {want}")
    return found


@pytest.mark.parametrize(
    ("cls", "proto"),
    [
        (Engine, RequestEngine),
        (VLLMEngine, RequestEngine),
        (LocalWorkerPool, WorkerPool),
        (RayWorkerPool, WorkerPool),
        (LocalWorkerPool, RolloutEngine),
    ],
)
def test_signatures_match_the_protocol(cls: type, proto: type) -> None:
    assert protocol_members(proto)  # the comparison sees the members (it would pass vacuously otherwise)
    assert mismatches(cls, proto) == []


def test_the_check_catches_a_wrong_engine() -> None:
    class Sloppy:
        trace = Trace()
        policy_version = 0

        def update_weights(self, state_dict: Any) -> None: ...  # no version

        running: list[Sequence] = []  # an attribute where a property is expected

    assert isinstance(Sloppy(), RolloutEngine) is False  # no close
    problems = mismatches(Sloppy, RequestEngine)
    assert any(p.startswith("update_weights:") for p in problems)
    assert "close: missing" in problems and "add_request: missing" in problems
    assert "running: not a property" in problems


def test_instances_satisfy_their_protocols(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir)
    engine = Engine(model, EngineConfig(max_num_seqs=2, max_model_len=64), eos_token_ids=[2])
    assert isinstance(engine, RequestEngine) and isinstance(engine, RolloutEngine)
    spec = WorkerSpec(model.config, EngineConfig(max_num_seqs=2, max_model_len=64), [2])
    pool = LocalWorkerPool(spec, model.state_dict(), 1, Trace())
    assert isinstance(pool, WorkerPool) and isinstance(pool, RolloutEngine)
    assert not isinstance(pool, RequestEngine)  # a pool takes requests per worker, not add_request
    # VLLMEngine needs vLLM to start (tests/vllm_backend checks a real one); its data members come from
    # the RequestBook both engines share, set up here without vLLM (isinstance reads the properties too).
    bare = VLLMEngine.__new__(VLLMEngine)
    bare._init_book(EngineConfig(), 64, [2], None, None)
    bare._live = {}
    assert isinstance(bare, RequestEngine)


def test_close_aborts_unfinished_requests(tiny_model_dir: Path) -> None:
    engine = Engine(load_model(tiny_model_dir), EngineConfig(max_num_seqs=1, max_model_len=64))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    first, second = engine.add_request(Request([1, 5], params)), engine.add_request(Request([1, 6], params))
    engine.step()  # the first is admitted to the only slot; the second waits
    assert engine.running == [first] and engine.waiting == [second]
    engine.close()
    assert not engine.has_unfinished()
    assert [s.status for s in (first, second)] == [SequenceStatus.ABORTED] * 2
    assert len(first.response_ids) == 1 and first.finish_reason == "abort"


class Chars:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)


def seq_with(response: list[int], **params: Any) -> Sequence:
    return Sequence("s", [0, 0], SamplingParams(**params), response_ids=list(response))


@pytest.mark.parametrize(
    ("response", "params", "max_model_len", "reason"),
    [
        ([3, 2], {}, 100, "eos"),
        ([3, 2], {"ignore_eos": True}, 100, None),
        ([3, 7], {"stop_token_ids": [7]}, 100, "stop"),
        ([3, 7], {"stop_token_ids": [7], "ignore_eos": True}, 100, "stop"),
        ([0, 1, 3], {"stop": ["bd"]}, 100, "stop"),  # "abd" holds "bd"
        ([0, 1, 4], {"stop": ["bd"]}, 100, None),
        ([5, 6, *[0] * STOP_TAIL_TOKENS], {"stop": ["fg"]}, 1000, None),  # only in the decoded tail
        ([5, 6, *[0] * (STOP_TAIL_TOKENS - 2)], {"stop": ["fg"]}, 1000, "stop"),
        ([3, 4, 5], {"max_tokens": 3}, 100, "length"),
        ([3, 4, 5], {}, 5, "length"),  # prompt 2 + 3 reaches the context's end
        ([3, 4, 5], {}, 6, None),
    ],
)
def test_stop_rules(response: list[int], params: dict[str, Any], max_model_len: int, reason: str | None):
    seq = seq_with(response, **params)
    assert stop_reason(seq, response[-1], {2}, Chars(), max_model_len) == reason


def test_stop_strings_need_a_tokenizer() -> None:
    seq = seq_with([0, 1], stop=["ab"])
    assert stop_reason(seq, 1, {2}, None, 100) is None
    assert stop_reason(seq, 1, {2}, Chars(), 100) == "stop"


class Book(RequestBook):
    """The shared request book alone: sequences finish where its rules say, and nothing else happens."""

    def __init__(self, max_model_len: int) -> None:
        self._init_book(EngineConfig(), max_model_len, [2], Chars(), None)

    def _release(self, seq: Sequence) -> None:
        pass


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    prompt=st.integers(1, 6),
    resumed=st.integers(0, 3),
    max_tokens=st.integers(1, 8),
    max_model_len=st.integers(8, 14),
    ignore_eos=st.booleans(),
    stop_token_ids=st.sampled_from([[], [7]]),
    stop=st.sampled_from([[], ["hh"]]),
    tokens=st.lists(st.integers(0, 8), min_size=1, max_size=12),
)
def test_a_decode_steps_append_stops_where_the_rules_say(
    prompt: int,
    resumed: int,
    max_tokens: int,
    max_model_len: int,
    ignore_eos: bool,
    stop_token_ids: list[int],
    stop: list[str],
    tokens: list[int],
) -> None:
    """`_append_one_each` (a decode step's loop, which calls `stop_reason` only where a rule could fire)
    finishes each sequence at the same token, for the same reason, as `_append` (the rules at every token)."""
    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_token_ids, stop=stop
    )
    if prompt + resumed >= max_model_len or resumed >= max_tokens:
        return

    def make(book: Book) -> Sequence:
        return book._new_sequence(Request([0] * prompt, params, "s", response_ids=[1] * resumed))

    step_book, rule_book = Book(max_model_len), Book(max_model_len)
    stepped, ruled = make(step_book), make(rule_book)
    for token in tokens:
        if ruled.is_finished:
            break
        finished = step_book._append_one_each([stepped], [float(token)], [-1.0])
        assert finished == ([stepped] if rule_book._append(ruled, [token], [-1.0]) else [])
    assert stepped.response_ids == ruled.response_ids
    assert (stepped.status, stepped.finish_reason) == (ruled.status, ruled.finish_reason)
