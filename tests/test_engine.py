"""The rollout engine: exact greedy decoding, continuous batching, sampling, log-probs, resume, trace."""

from __future__ import annotations

import pytest
import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.sequence import Request
from reference_trainer.model.loader import load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 30, (n,), generator=gen).tolist()
    return [torch.randint(3, 98, (k,), generator=gen).tolist() for k in lengths]


def make_engine(model, capacity: int = 8, **kw) -> Engine:
    return Engine(model, EngineConfig(max_num_seqs=capacity, max_model_len=128, **kw), eos_token_ids=[2])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate(family, request):
    from transformers import AutoModelForCausalLM

    model_dir = request.getfixturevalue(f"{family}_dir")
    ours = make_engine(load_model(model_dir))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = prompts(6, seed=3)
    assert len({len(p) for p in batch}) > 1, "the batch must mix prompt lengths"
    seqs = ours.generate(batch, GREEDY)
    for prompt, seq in zip(batch, seqs, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=24,
                min_new_tokens=24,
                pad_token_id=0,
            )
        assert seq.response_ids == out[0, len(prompt) :].tolist()


def test_staggered_arrivals_match_one_at_a_time(llama_dir):
    model = load_model(llama_dir)
    batch = prompts(10, seed=5)
    alone = [make_engine(model, capacity=1).generate([p], GREEDY)[0].response_ids for p in batch]
    engine = make_engine(model, capacity=4)  # fewer slots than requests: later ones wait for free slots
    seqs, pending = [], list(batch)
    while pending or engine.has_unfinished():
        if pending:  # a new request arrives every step, mid-flight
            seqs.append(engine.add_request(Request(pending.pop(0), GREEDY)))
        engine.step()
    assert [s.response_ids for s in seqs] == alone
    assert max(e["active_slots"] for e in engine.trace.events) == 4


def test_seeded_sampling_is_reproducible_and_batch_independent(llama_dir):
    model = load_model(llama_dir)
    batch = prompts(5, seed=7)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=40, max_tokens=20, seed=100 + i) for i in range(5)
    ]
    first = [s.response_ids for s in make_engine(model).generate(batch, params)]
    again = [s.response_ids for s in make_engine(model).generate(batch, params)]
    alone = [
        make_engine(model).generate([p], [sp])[0].response_ids for p, sp in zip(batch, params, strict=True)
    ]
    assert first == again == alone
    other = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=40, max_tokens=20, seed=200 + i) for i in range(5)
    ]
    assert [s.response_ids for s in make_engine(model).generate(batch, other)] != first


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_equal_full_forward_recomputation(qwen2_dir, temperature):
    model = load_model(qwen2_dir)
    batch = prompts(4, seed=11)
    params = SamplingParams(temperature=temperature, max_tokens=16, seed=1, ignore_eos=True)
    for prompt, seq in zip(batch, make_engine(model).generate(batch, params), strict=True):
        ids = torch.tensor([prompt + seq.response_ids])
        with torch.no_grad():
            logits = model(ids)[0, len(prompt) - 1 : -1].float()
        logits = logits / (temperature if temperature > 0 else 1.0)
        expected = (
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq.response_ids)[:, None]).squeeze(-1)
        )
        assert torch.allclose(torch.tensor(seq.logprobs), expected, atol=1e-4)


def test_top_k_one_is_greedy(llama_dir):
    model = load_model(llama_dir)
    batch = prompts(3, seed=13)
    greedy = [s.response_ids for s in make_engine(model).generate(batch, GREEDY)]
    topk = SamplingParams(temperature=1.3, top_k=1, max_tokens=24, seed=0, ignore_eos=True)
    assert [s.response_ids for s in make_engine(model).generate(batch, topk)] == greedy


def test_abort_and_resume_continues_exactly(llama_dir):
    """A partial rollout resumed from its tokens finishes as the uninterrupted greedy run does."""
    model = load_model(llama_dir)
    prompt = prompts(1, seed=17)[0]
    full = make_engine(model).generate([prompt], GREEDY)[0]
    engine = make_engine(model)
    seq = engine.add_request(Request(prompt, GREEDY))
    for _ in range(8):
        engine.step()
    engine.abort(seq)
    assert seq.finish_reason == "abort" and 0 < len(seq.response_ids) < 24
    assert not engine.has_unfinished() and engine.slots.num_free == engine.slots.capacity
    resumed = engine.add_request(
        Request(
            prompt,
            GREEDY,
            response_ids=seq.response_ids,
            logprobs=seq.logprobs,
            policy_versions=[7] * len(seq.response_ids),
        )
    )
    while engine.has_unfinished():
        engine.step()
    assert resumed.response_ids == full.response_ids
    assert resumed.policy_versions[: len(seq.response_ids)] == [7] * len(seq.response_ids)
    assert torch.allclose(torch.tensor(resumed.logprobs), torch.tensor(full.logprobs), atol=1e-4)


def test_stop_conditions(llama_dir):
    model = load_model(llama_dir)
    prompt = prompts(1, seed=19)[0]
    free = make_engine(model).generate([prompt], GREEDY)[0].response_ids
    engine = make_engine(model)
    eos = Engine(model, EngineConfig(max_num_seqs=2, max_model_len=128), eos_token_ids=[free[5]])
    out = eos.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert out.finish_reason == "eos" and out.response_ids == free[: free.index(free[5]) + 1]
    out = engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[free[3]], ignore_eos=True)
    )[0]
    assert out.finish_reason == "stop" and out.response_ids == free[: free.index(free[3]) + 1]
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.response_ids) == 7


def test_stop_strings_use_the_tokenizer(llama_dir):
    class Digits:  # token id -> one character, enough to exercise stop strings
        def decode(self, ids):
            return "".join(chr(48 + i % 10) for i in ids)

    model = load_model(llama_dir)
    prompt = prompts(1, seed=19)[0]
    free = make_engine(model).generate([prompt], GREEDY)[0].response_ids
    stop = Digits().decode(free[4:6])
    engine = Engine(model, EngineConfig(max_num_seqs=2, max_model_len=128), tokenizer=Digits())
    out = engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop], ignore_eos=True)
    )[0]
    assert out.finish_reason == "stop" and stop in Digits().decode(out.response_ids)
    assert len(out.response_ids) <= 6


def test_update_weights_in_place_changes_outputs(llama_dir, qwen2_dir):
    model = load_model(llama_dir)
    engine = make_engine(model)
    batch = prompts(3, seed=23)
    before = [s.response_ids for s in engine.generate(batch, GREEDY)]
    cache_ptr = engine.slots.cache.k[0].data_ptr()
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    engine.update_weights(new_state)
    assert engine.policy_version == 1 and engine.slots.cache.k[0].data_ptr() == cache_ptr
    after = engine.generate(batch, GREEDY)
    assert [s.response_ids for s in after] != before
    assert all(v == 1 for s in after for v in s.policy_versions)


def test_trace_events_follow_the_contract(llama_dir, tmp_path):
    from reference_trainer.trace.records import read_jsonl

    engine = make_engine(load_model(llama_dir), capacity=3)
    seqs = engine.generate(
        prompts(5, seed=29), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    )
    engine.trace.write_jsonl(tmp_path / "trace.jsonl")
    events = read_jsonl(tmp_path / "trace.jsonl")
    assert {e["kind"] for e in events} == {"prefill", "decode"}
    for e in events:
        assert {
            "step",
            "t_start",
            "t_end",
            "active_slots",
            "capacity",
            "tokens",
            "worker",
            "slots",
        } <= e.keys()
        assert e["capacity"] == 3 and 0 < e["active_slots"] == len(e["slots"]) <= 3
        assert e["t_end"] >= e["t_start"]
    assert sum(e["tokens"] for e in events) == sum(len(s.response_ids) for s in seqs)
    held = {sid for e in events for sid in e["slots"].values()}
    assert held == {s.seq_id for s in seqs}


@pytest.mark.gpu
def test_engine_on_cuda_bf16(llama_dir):
    model = load_model(llama_dir, device="cuda")
    assert next(model.parameters()).dtype == torch.bfloat16
    engine = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=128, device="cuda"), eos_token_ids=[2])
    batch = prompts(4, seed=31)
    seqs = engine.generate(batch, SamplingParams(temperature=1.0, max_tokens=16, seed=0, ignore_eos=True))
    for prompt, seq in zip(batch, seqs, strict=True):
        ids = torch.tensor([prompt + seq.response_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids)[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(seq.response_ids, device="cuda")[:, None]
        )
        assert torch.allclose(torch.tensor(seq.logprobs), expected.squeeze(-1).cpu(), atol=5e-2)


def test_cuda_request_on_cpu_machine_is_a_clear_error(llama_dir):
    from reference_trainer.errors import ModelLoadError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_model(llama_dir, device="cuda")
