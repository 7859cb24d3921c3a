"""The graph-ready forward (engine/graphs.py): batches padded to buckets, keys to a power-of-two span, inputs
in one persistent buffer. Run eagerly on CPU it emits the tokens the engine's own-shape forward emits,
greedy and seeded, plain and with HistoSpec verification, in both KV layouts; on CUDA, replayed graphs emit
the tokens the same static forward emits eagerly."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from reference_trainer.engine import kv_cache
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward, batch_buckets
from reference_trainer.model import embedded
from reference_trainer.model.loader import load_model
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.speculation.cost import ForwardCosts
from reference_trainer.speculation.drafters import attach
from reference_trainer.tasks import get_task

FREE_VERIFY = ForwardCosts({(1, 1): 1.0, (64, 1): 1.0, (1, 16): 1.0, (64, 16): 1.0})


def test_buckets_end_at_the_capacity():
    assert batch_buckets(1) == [1]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]


def workload(which: str, request: pytest.FixtureRequest) -> tuple:
    """A model, 10 prompts and their parameters: greedy, plain seeded, top-k and top-p rows mixed."""
    if which == "embedded":
        model = load_model(embedded.default_model_dir())
        tokenizer = CharTokenizer()
        prompts = [encode_prompt(tokenizer, p.prompt) for p in get_task("arith").problems(10, seed=5)]
        eos = [tokenizer.eos_id]
    else:
        model = load_model(request.getfixturevalue("llama_dir"))
        gen = torch.Generator().manual_seed(4)
        prompts = [torch.randint(3, 98, (int(n),), generator=gen).tolist() for n in range(3, 23, 2)]
        eos = [2]
    params = [
        SamplingParams(
            temperature=0.0 if i % 3 == 0 else 1.0,
            top_k=10 if i % 3 == 1 else 0,
            top_p=0.9 if i % 6 == 2 else 1.0,
            max_tokens=40,
            seed=100 + i,
        )
        for i in range(len(prompts))
    ]
    return model, prompts, params, eos


def run(model, prompts, params, eos, layout, static, monkeypatch, history=None):  # type: ignore[no-untyped-def]
    """The responses (tokens and log-probs) of one engine with 4 slots (requests queue and refill
    slots: batches of 1 to 4 rows), and the static shapes it ran."""
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0 if layout == "paged" else 2**40)
    engine = Engine(model, EngineConfig(max_num_seqs=4, max_model_len=256), eos_token_ids=eos)
    assert engine.runner.static is None  # CPU: eager at each step's own shape unless told otherwise
    shapes: Counter[tuple[int, int]] = Counter()
    if static:
        # with the engine's sampling table, as the runner builds it on CUDA: decode samples inside the forward
        forward = StaticForward(model, engine.slots, engine.config.max_verify_tokens, capture=False,
                                sampling=engine.sampling)  # fmt: skip
        run_shape = forward._forward

        def spy(ids, starts, where, span, *sampled):  # type: ignore[no-untyped-def]
            shapes[tuple(ids.shape)] += 1
            return run_shape(ids, starts, where, span, *sampled)

        forward._forward = spy  # type: ignore[method-assign]
        engine.runner.static = forward
    if history is not None:
        spec = attach(engine, {}, cost_model=FREE_VERIFY)
        for prompt, response in history:
            spec.drafter.add_response(prompt, response)
    out = engine.generate(prompts, params)
    return [(s.response_ids, s.logprobs) for s in out], shapes, engine


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("which", ["embedded", "llama"])
def test_static_shapes_emit_the_own_shape_tokens(which, layout, request, monkeypatch):
    model, prompts, params, eos = workload(which, request)
    eager, _, _ = run(model, prompts, params, eos, layout, False, monkeypatch)
    static, shapes, engine = run(model, prompts, params, eos, layout, True, monkeypatch)
    assert [tokens for tokens, _ in static] == [tokens for tokens, _ in eager]
    for (_, a), (_, b) in zip(static, eager, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert {batch for batch, _ in shapes} >= {4, 2, 1}  # full and padded buckets both ran
    # refills rode in decode steps on the static admitting path (engine/mixed.py), not the eager one
    admitting = engine.runner.admitting
    assert admitting is not None and admitting.ran
    riding = [e for e in engine.trace.events if e.get("prefill_rows")]
    assert len(riding) >= len(admitting.ran) > 0


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_static_verification_emits_the_plain_tokens(layout, request, monkeypatch):
    """HistoSpec on the static path (verify forwards of several widths) emits plain eager decoding's
    tokens, with drafts verified and some rejected."""
    model, prompts, params, eos = workload("llama", request)
    plain, _, _ = run(model, prompts, params, eos, layout, False, monkeypatch)
    history = []
    for offset in (1000, 2000):  # earlier samples of the same prompts (other seeds)
        resampled = [SamplingParams(**{**vars(p), "seed": p.seed + offset}) for p in params]
        earlier, _, _ = run(model, prompts, resampled, eos, layout, False, monkeypatch)
        history += [(p, tokens) for p, (tokens, _) in zip(prompts, earlier, strict=True)]
    drafted, shapes, engine = run(model, prompts, params, eos, layout, True, monkeypatch, history=history)
    assert [tokens for tokens, _ in drafted] == [tokens for tokens, _ in plain]
    verify = [e for e in engine.trace.events if e["kind"] == "verify"]
    assert sum(e["accepted"] for e in verify) > 0 and any(e["accepted"] < e["drafted"] for e in verify)
    assert any(width > 1 for _, width in shapes)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_cuda_graphs_emit_the_eager_tokens(layout, request, monkeypatch):
    """On CUDA: graphs replayed vs the same static forward run eagerly, token-identical (greedy and seeded,
    plain and verified, refills riding in decode steps on their own graphs), and greedy fp32 also equal to
    the own-shape eager forward."""
    model, prompts, params, eos = workload("llama", request)
    model = copy.deepcopy(model).to("cuda")
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 0 if layout == "paged" else 2**40)

    def generate(graphs: bool, capture: bool, history=None, params=params):  # type: ignore[no-untyped-def]
        engine = Engine(model, EngineConfig(max_num_seqs=4, max_model_len=256, cuda_graphs=graphs), [2])
        if graphs and not capture:
            engine.runner.static = StaticForward(model, engine.slots, engine.config.max_verify_tokens, False,
                                                 sampling=engine.sampling)  # fmt: skip
        if history:
            spec = attach(engine, {}, cost_model=FREE_VERIFY)
            for prompt, response in history:
                spec.drafter.add_response(prompt, response)
        out = [s.response_ids for s in engine.generate(prompts, params)]
        if graphs and capture:
            assert engine.runner.static is not None and len(engine.runner.static.graphs) > 1
            if not history:  # refills rode in decode steps replayed from their own graphs (engine/mixed.py)
                assert engine.runner.admitting is not None and engine.runner.admitting.graphs
        return out

    replayed = generate(True, True)
    assert replayed == generate(True, False)
    resampled = [SamplingParams(**{**vars(p), "seed": p.seed + 1000}) for p in params]
    history = list(zip(prompts, generate(True, True, params=resampled), strict=True))
    assert generate(True, True, history) == replayed
    greedy = [i for i, p in enumerate(params) if p.greedy]
    own_shape = generate(False, False)
    assert [replayed[i] for i in greedy] == [own_shape[i] for i in greedy]
