"""Counter-based sampling: the hash is SplitMix64, its uniforms are uniform and uncorrelated, the draw follows
the target distribution (temperature, top-k, top-p), and a seeded request's tokens depend on nothing but its
seed, its prompt and the model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import tiny_config
from scipy import stats

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.sampler import (
    SamplingBatch,
    mix64,
    plain_tokens,
    sample,
    scaled_logits,
    seed_key,
    splitmix64,
    uniforms,
)
from reference_trainer.engine.sequence import Request
from reference_trainer.model.decoder import DecoderLM

EOS = 2


def test_tensor_hash_is_splitmix64():
    """The int64 tensor version (wrapping multiplies, logical shifts emulated) equals the unsigned Python
    reference, including values whose top bit is set."""
    rng = random.Random(0)
    values = [0, 1, 2**63 - 1, 2**63, 2**64 - 1] + [rng.getrandbits(64) for _ in range(2000)]
    signed = torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.long)
    got = [v % 2**64 for v in mix64(signed).tolist()]
    assert got == [splitmix64(v) for v in values]
    # SplitMix64's published first output for seed 0 (the state advanced by one increment).
    assert splitmix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


def _u(keys: list[int], positions: list[int]) -> np.ndarray:
    return uniforms(torch.tensor(keys), torch.tensor(positions)).numpy()


def test_uniforms_are_uniform_and_uncorrelated_across_positions_and_seeds():
    n = 20_000
    along = _u([seed_key(7)] * n, list(range(n)))  # one request's stream
    across = _u([seed_key(s) for s in range(n)], [5] * n)  # neighbouring seeds at one position
    for u in (along, across):
        assert u.min() > 0 and u.max() <= 1
        assert stats.kstest(u, "uniform").pvalue > 0.01
        counts = np.histogram(u, bins=20, range=(0, 1))[0]
        assert stats.chisquare(counts).pvalue > 0.01
        # Pairs of neighbours (positions t, t+1; seeds s, s+1) fill the unit square evenly: 10 x 10 cells.
        pairs = np.histogram2d(u[:-1], u[1:], bins=10, range=[[0, 1], [0, 1]])[0].ravel()
        assert stats.chisquare(pairs).pvalue > 0.01
        assert abs(stats.pearsonr(u[:-1], u[1:]).statistic) < 0.03
    # A stream is a function of (key, position) only: the same draw whatever else is in the batch.
    assert _u([seed_key(7), seed_key(8)], [3, 3])[0] == _u([seed_key(7)], [3])[0] == along[3]


def _reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, top-k, then top-p (smallest prefix reaching top_p), written independently of the
    sampler, in float64."""
    z = logits / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[::-1][top_k - 1], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep = np.zeros_like(p, dtype=bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.9, 8, 0.9)],
)
def test_draws_follow_the_target_distribution(temperature, top_k, top_p):
    """Chi-square goodness of fit of 12,000 draws (one request, successive positions) against the target
    distribution computed independently; truncated tokens are never drawn."""
    logits = torch.randn(24, generator=torch.Generator().manual_seed(1)) * 2
    n = 12_000
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    batch = SamplingBatch.build([params] * n, [seed_key(11)] * n, list(range(n)), torch.device("cpu"))
    tokens, _ = plain_tokens(scaled_logits(logits.expand(n, -1), batch), batch)
    observed = np.bincount(tokens.numpy(), minlength=24)
    expected = _reference_probs(logits.double().numpy(), temperature, top_k, top_p)
    assert observed[expected == 0].sum() == 0
    kept = expected > 0
    assert stats.chisquare(observed[kept], expected[kept] * n).pvalue > 0.001


def test_mixed_batch_rows_keep_their_own_rules():
    """Greedy, top-k = 1 and sampling rows in one batch: greedy and top-1 rows take the argmax; log-probs
    are the untruncated softmax(logits / T)."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.0, seed=1),
    ] * 2
    batch = SamplingBatch.build(params, [seed_key(i) for i in range(6)], [9] * 6, torch.device("cpu"))
    tokens, logprobs = sample(logits, batch)
    argmax = logits.argmax(-1)
    assert tokens[[0, 1, 3, 4]].tolist() == argmax[[0, 1, 3, 4]].tolist()
    temps = torch.tensor([1.0, 1.5, 1.0] * 2)
    expected = torch.log_softmax(logits / temps[:, None], -1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)
    cfg = tiny_config(40)
    return DecoderLM(cfg).eval()


def _generate(model: DecoderLM, prompts: list[list[int]], params: list[SamplingParams], capacity: int):
    engine = Engine(model, EngineConfig(max_num_seqs=capacity, max_model_len=96), eos_token_ids=[EOS])
    return engine.generate(prompts, params)


def test_seeded_tokens_do_not_depend_on_batch_size_neighbours_or_slot(model):
    """A seeded request alone, in a batch of one slot, among 11 others (the neighbours differ between
    runs), and in a different slot (other requests admitted first) emits the same tokens."""
    seeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=30, seed=1234, ignore_eos=True)
    target = ([5, 6, 7], seeded)
    alone = _generate(model, [target[0]], [target[1]], capacity=8)[0]
    one_slot = _generate(model, [target[0]], [target[1]], capacity=1)[0]
    rng = random.Random(3)
    runs = []
    for position in (0, 5, 11):
        others = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 9))] for _ in range(11)]
        other_params = [
            SamplingParams(temperature=rng.choice([0.0, 0.8, 1.2]), top_k=rng.choice([0, 5]), max_tokens=30)
            for _ in others
        ]
        prompts = others[:position] + [target[0]] + others[position:]
        params = other_params[:position] + [target[1]] + other_params[position:]
        runs.append(_generate(model, prompts, params, capacity=12)[position])
    for seq in [one_slot, *runs]:
        assert seq.response_ids == alone.response_ids
        assert seq.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert len(alone.response_ids) == 30


def test_unseeded_requests_follow_torch_manual_seed_and_differ_from_each_other(model):
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    runs = []
    for _ in range(2):
        torch.manual_seed(42)
        runs.append([s.response_ids for s in _generate(model, [[5, 6]] * 4, [params] * 4, capacity=4)])
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0]}) == 4  # each request its own stream


def test_a_resumed_seeded_request_continues_its_stream(model):
    """Draws are keyed by position: aborting a seeded request and resuming it from its tokens gives the
    uninterrupted run's tokens."""
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=99, ignore_eos=True)
    full = _generate(model, [[5, 6, 7]], [params], capacity=2)[0]
    engine = Engine(model, EngineConfig(max_num_seqs=2, max_model_len=96), eos_token_ids=[EOS])
    seq = engine.add_request(Request([5, 6, 7], params))
    for _ in range(10):
        engine.step()
    engine.abort(seq)
    resumed = engine.add_request(
        Request([5, 6, 7], params, response_ids=seq.response_ids, logprobs=seq.logprobs)
    )
    while engine.has_unfinished():
        engine.step()
    assert 0 < len(seq.response_ids) < 30 and resumed.response_ids == full.response_ids


def test_sampler_ops_are_the_rows_optional_ops() -> None:
    """SamplerOps.of (one loop, on the host's hot path) against its definition, over mixed batches."""
    import itertools

    from reference_trainer.engine.sampler import SamplerOps

    kinds = [SamplingParams(temperature=t, top_k=k, top_p=p)
             for t, k, p in itertools.product([0.0, 0.7, 1.0], [0, 5], [1.0, 0.9])]  # fmt: skip
    rng = random.Random(0)
    for _ in range(300):
        params = rng.sample(kinds, rng.randint(1, 4))
        sampling = [p for p in params if not p.greedy]
        assert SamplerOps.of(params) == SamplerOps(
            divisor=any(p.temperature != 1.0 for p in sampling),
            greedy=len(sampling) < len(params),
            top_k=any(p.top_k > 0 for p in sampling),
            top_p=any(p.top_p < 1 for p in sampling),
            all_greedy=not sampling,
        )
