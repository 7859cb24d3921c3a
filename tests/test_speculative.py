"""Exact speculative verification: same distribution, same greedy output, rolled-back cache, cost-aware."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import peaked_model
from scipy import stats

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.sampler import coupled_accept
from reference_trainer.engine.sequence import Request
from reference_trainer.model.attention import CachedBatch, PagedKVCache
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.speculation.cost import ForwardCosts
from reference_trainer.speculation.drafters import DRAFTERS, attach
from reference_trainer.speculation.histospec import HistoryDrafter
from reference_trainer.speculation.speculator import Speculator, SpeculatorOptions
from reference_trainer.trace.metrics import step_metrics
from rlbench.reproduce.lossless import generous_accept, homogeneity_test, sample_responses

PROMPT = [5, 6, 7, 8]
EOS = 2
CHEAP = ForwardCosts({(1, 1): 1.0, (64, 1): 1.0, (1, 16): 1.0, (64, 16): 1.0})  # verifying is free


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    return peaked_model()


def make_engine(
    model: DecoderLM, capacity: int = 64, cost_model: ForwardCosts | None = None, **spec
) -> tuple[Engine, Speculator | None]:
    engine = Engine(model, EngineConfig(max_num_seqs=capacity, max_model_len=96), eos_token_ids=[EOS])
    return engine, (attach(engine, spec, cost_model=cost_model) if spec or cost_model is not None else None)


def needs(drafter: str) -> None:
    if drafter == "suffix":
        pytest.importorskip("arctic_inference.suffix_decoding")


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list:
    return engine.generate(prompts, params)


def sampling(seeds: range, max_tokens: int = 12, **kw) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s, **kw) for s in seeds]


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_and_seeded_outputs_identical_with_drafts(model, drafter):
    needs(drafter)
    prompts = [PROMPT, [9, 10], [11, 12, 13, 14, 15], PROMPT] * 3
    for params in (
        [SamplingParams(temperature=0.0, max_tokens=30)] * len(prompts),
        sampling(range(len(prompts)), max_tokens=30, top_k=8, top_p=0.9),
    ):
        plain = run(make_engine(model)[0], prompts, params)
        engine, spec = make_engine(model, cost_model=CHEAP, drafter=drafter)
        assert spec is not None
        for p in {tuple(p) for p in prompts}:  # history: other samples of the same prompts
            for s in run(make_engine(model)[0], [list(p)] * 4, sampling(range(100, 104), max_tokens=30)):
                spec.drafter.add_response(list(p), s.response_ids)
        out = run(engine, prompts, params)
        assert [s.response_ids for s in out] == [s.response_ids for s in plain]
        assert [s.finish_reason for s in out] == [s.finish_reason for s in plain]
        for a, b in zip(out, plain, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # the target model's log-probs
        verify = [e for e in engine.trace.events if e["kind"] == "verify"]
        drafted, accepted = sum(e["drafted"] for e in verify), sum(e["accepted"] for e in verify)
        assert 0 < accepted < drafted  # drafts were verified, some rejected and rolled back
        assert sum(s.drafted for s in out) == drafted and sum(s.accepted for s in out) == accepted
        assert sum(e["tokens"] for e in engine.trace.events) == sum(len(s.response_ids) for s in out)
        m = step_metrics(engine.trace.events)[0]
        assert m["acceptance_rate"] == pytest.approx(accepted / drafted)
        assert m["mean_accepted_len"] > 1.0 and 0 < m["draft_coverage"] <= 1.0


def test_stop_conditions_apply_inside_an_accepted_run(model):
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    plain = run(make_engine(model)[0], [PROMPT], [greedy])[0]
    ids = plain.response_ids
    stop_at = ids[max(i for i in range(len(ids)) if ids[i] not in ids[:i])]  # its first use, mid-run
    for params in (
        replace(greedy, max_tokens=7),
        replace(greedy, stop_token_ids=[stop_at]),
        replace(greedy, ignore_eos=False),
    ):
        engine, spec = make_engine(model, cost_model=CHEAP, init_draft=8, max_draft=15)
        spec.drafter.add_response(PROMPT, plain.response_ids)  # the exact answer: everything is accepted
        out = run(engine, [PROMPT], [params])[0]
        expected = run(make_engine(model)[0], [PROMPT], [params])[0]
        assert out.response_ids == expected.response_ids and out.finish_reason == expected.finish_reason
        assert any(e["kind"] == "verify" for e in engine.trace.events)


def test_rollback_leaves_the_cache_equal_to_a_fresh_prefill(model):
    engine, spec = make_engine(model, capacity=4, cost_model=CHEAP)
    history = run(make_engine(model)[0], [PROMPT] * 3, sampling(range(3), max_tokens=40))
    for s in history:
        spec.drafter.add_response(PROMPT, s.response_ids)
    seqs = [engine.add_request(Request(PROMPT, p)) for p in sampling(range(10, 14), max_tokens=40)]
    for _ in range(6):
        engine.step()
    assert any(e["kind"] == "verify" and e["accepted"] < e["drafted"] for e in engine.trace.events)
    for seq in seqs:
        if seq.is_finished:
            continue
        n = seq.num_cached
        assert n == seq.length - 1
        # A fresh prefill of the kept tokens into a cache of its own: blocks 0, 1, ... in order.
        fresh = PagedKVCache(model.config, 8, engine.slots.block_size, torch.device("cpu"), torch.float32)
        blocks = list(range(-(-n // engine.slots.block_size)))
        with torch.no_grad():
            ids = torch.tensor([seq.all_ids[:n]])
            model.forward_cached(ids, CachedBatch(torch.tensor([0]), n, fresh, torch.tensor([blocks])))
        for layer in range(model.config.num_hidden_layers):
            for ours, ref in zip(
                engine.slots.read(seq.slot, layer, n), fresh.read(layer, blocks, n), strict=True
            ):
                torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def _samples(
    model: DecoderLM, first_seed: int, n: int, rule=None, drafter: str = "histospec"
) -> list[tuple[int, ...]]:
    history = [sample_responses(model, [PROMPT], 8, 900_000, [EOS], 12).responses[0]] if rule else []
    out = sample_responses(
        model, [PROMPT], n, first_seed, [EOS], 12, rule=rule, history=history, drafter=drafter
    )
    if rule is not None:
        assert out.accepted > 100  # drafts really were used
    return out.responses[0]


def _p_values(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> tuple[float, float]:
    """Chi-square over the first 4 tokens (one outcome per sample); KS over response lengths."""
    chi = homogeneity_test([[s[:4] for s in a]], [[s[:4] for s in b]])["p_value"]
    ks = stats.ks_2samp([len(s) for s in a], [len(s) for s in b]).pvalue
    return chi, ks


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_sampling_distribution_is_unchanged_and_a_wrong_rule_is_detected(model, drafter):
    needs(drafter)
    n = 300
    plain = _samples(model, 0, n)
    exact = _samples(model, 10_000, n, coupled_accept, drafter)  # other seeds: independent samples
    chi, ks = _p_values(plain, exact)
    assert chi > 0.01 and ks > 0.01
    # A plausible bug: accept d with probability min(1, 2 p(d)) instead of p(d).
    wrong = _samples(model, 10_000, n, generous_accept(0), drafter)
    chi_w, ks_w = _p_values(plain, wrong)
    assert min(chi_w, ks_w) < 0.01


def test_cost_model_interpolates_and_chooser_respects_cost():
    table = {(b, q): 0.001 * b * q for b in (1, 8) for q in (1, 4, 8)}
    cm = ForwardCosts(table)
    assert cm.cost(4, 2) == pytest.approx(0.001 * 4 * 2)
    assert cm.cost(16, 8) == pytest.approx(0.001 * 16 * 8)  # linear extrapolation beyond the grid

    expensive = Speculator(HistoryDrafter(), SpeculatorOptions(prior_acceptance=0.9), cost_model=cm)
    assert expensive.choose_width([8] * 8) == 0  # q+1 tokens cost q+1 decode steps: never worth it
    flat = ForwardCosts({(b, q): 0.01 for b in (1, 64) for q in (1, 16)})
    cheap = Speculator(HistoryDrafter(), SpeculatorOptions(prior_acceptance=0.5), cost_model=flat)
    assert cheap.choose_width([8, 3, 0]) == 8  # free verification: verify every draft token
    assert cheap.choose_width([0, 0]) == 0  # nothing to verify
    # Verification costing 2x a decode: worth it at high acceptance, not at low.
    double = ForwardCosts({(1, 1): 1.0, (1, 2): 2.0, (1, 16): 2.0, (64, 1): 1.0, (64, 2): 2.0, (64, 16): 2.0})
    assert (
        Speculator(
            HistoryDrafter(), SpeculatorOptions(prior_acceptance=0.95), cost_model=double
        ).choose_width([8])
        > 0
    )
    assert (
        Speculator(HistoryDrafter(), SpeculatorOptions(prior_acceptance=0.3), cost_model=double).choose_width(
            [8]
        )
        == 0
    )


def test_measured_cost_model_and_plain_steps_when_verification_is_expensive(model):
    engine, spec = make_engine(model, capacity=8, cost_batches=(1, 8), cost_qs=(1, 4), cost_repeats=1)
    assert spec.cost_model is not None and set(spec.cost_model.table) == {(1, 1), (1, 4), (8, 1), (8, 4)}
    assert all(t > 0 for t in spec.cost_model.table.values())
    spec.cost_model = ForwardCosts({(b, q): 0.001 * q for b in (1, 8) for q in (1, 16)})
    spec.drafter.add_response(PROMPT, list(range(10, 30)))
    run(engine, [PROMPT] * 4, sampling(range(4)))
    kinds = Counter(e["kind"] for e in engine.trace.events)
    assert kinds["verify"] == 0 and kinds["decode"] > 0  # falls back to plain decode steps


@pytest.mark.parametrize("spec_mode", ["rhyme", "suffix"])
def test_speculative_modes_attach_their_drafter_and_match_baseline(tmp_path, tiny_model_dir, spec_mode):
    from reference_trainer.modes import get_mode
    from reference_trainer.speculation.suffix import SuffixDrafter
    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    needs(get_mode(spec_mode).speculation)
    rows, seqs = {}, {}
    for mode in ("baseline", spec_mode):
        config = TrainConfig(
            eval_every=0,
            mode=mode,
            model=str(tiny_model_dir),
            steps=2,
            prompts_per_step=2,
            group_size=3,
            max_tokens=12,
            max_num_seqs=6,
            max_model_len=256,
            prompt_pool=2,
            mode_options={"spec": {"cost_model": [[1, 1, 1.0], [64, 1, 1.0], [1, 16, 1.0], [64, 16, 1.0]]}}
            if mode == spec_mode
            else {},
        )
        trainer = Trainer(config, tmp_path / mode)
        assert (trainer.engine.speculation is not None) == (mode == spec_mode)
        if mode == spec_mode:
            drafter = trainer.engine.speculation.drafter
            assert isinstance(drafter, SuffixDrafter if spec_mode == "suffix" else HistoryDrafter)
        rows[mode] = [trainer.train_step() for _ in range(2)]
        seqs[mode] = [
            (e["id"], e["response_tokens"]) for e in trainer.trace.events if e["kind"] == "sequence"
        ]
    assert seqs[spec_mode] == seqs["baseline"]  # the pool repeats prompts; exact speculation, same samples
    assert [r["reward_mean"] for r in rows[spec_mode]] == [r["reward_mean"] for r in rows["baseline"]]
    assert len({sid for sid, _ in seqs[spec_mode]}) == 6  # 2 prompts x 3 samples, seen in both epochs
