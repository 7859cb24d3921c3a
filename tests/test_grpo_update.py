"""The updater's fast path: the same numbers as before, a constant number of host reads per update (not one
per micro-batch), bf16 autocast with fp32 master weights, and a fused or multi-tensor AdamW.

EXPECTED holds what the updater computed before its host reads were removed (commit c624845, recorded by
running `record()` below on that commit's grpo.py): the stats of one update and two random projections of the
weight change, for five configurations on a tiny decoder in float32."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from conftest import tiny_config
from test_sync_free import counting

from benchmarks.gpu_checks import syncs_during
from reference_trainer.errors import UserError
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.train.config import GRPOConfig
from reference_trainer.train.grpo import GRPOUpdater, NonFiniteUpdate, RolloutBatch

VOCAB = 37
CASES: dict[str, dict] = {
    "token-mean": {"lr": 1e-2, "micro_batch_size": 4},
    "seq-mean-kl-two-epochs": {
        "lr": 1e-2,
        "micro_batch_size": 1,
        "aggregation": "seq-mean",
        "kl_coef": 0.1,
        "ppo_epochs": 2,
        "max_grad_norm": 0.0,
        "scale_std": True,
    },
    "tis-and-weights": {"lr": 1e-2, "micro_batch_size": 3, "tis_cap": 2.0, "max_grad_norm": 0.5},
    "rollout-logprobs": {
        "lr": 1e-2,
        "micro_batch_size": 8,
        "recompute_old_logprobs": False,
        "temperature": 0.7,
    },
    "logits-budget": {"lr": 1e-2, "micro_batch_size": 8, "max_logits_mib": 3 * 14 * VOCAB * 4 / 2**20},
}

EXPECTED: dict[str, tuple[dict[str, float], list[float]]] = {
    "token-mean": (
        {
            "adv_abs_mean": 0.1875,
            "approx_kl": 0.0,
            "clip_frac": 0.0,
            "entropy": 3.4539405239952936,
            "forward_tokens": 100.0,
            "grad_norm": 0.21185746788978577,
            "loss": -0.027777778916060925,
            "lr": 0.01,
            "num_tokens": 36.0,
            "ratio_mean": 1.0,
            "response_len_mean": 4.5,
            "reward_mean": 0.875,
        },
        [-1.0351778914613199, -0.978989065406086, 207.6214218463283],
    ),
    "seq-mean-kl-two-epochs": (
        {
            "adv_abs_mean": 0.7499969601631165,
            "approx_kl": 0.1763774048950937,
            "clip_frac": 0.8611111111111112,
            "entropy": 3.4410237537489996,
            "forward_tokens": 73.0,
            "grad_norm": 0.23885102570056915,
            "kl_ref": 0.22299930163555676,
            "loss": -0.10475661605596542,
            "lr": 0.01,
            "num_tokens": 36.0,
            "ratio_mean": 1.3012269511818886,
            "response_len_mean": 4.5,
            "reward_mean": 0.875,
        },
        [-0.5964502572514645, -1.1187813762271823, 324.5247399425134],
    ),
    "tis-and-weights": (
        {
            "adv_abs_mean": 0.1875,
            "approx_kl": 0.0,
            "clip_frac": 0.0,
            "entropy": 3.4539406299591064,
            "forward_tokens": 97.0,
            "grad_norm": 0.20668858289718628,
            "loss": -0.029091835021972656,
            "lr": 0.01,
            "num_tokens": 36.0,
            "ratio_mean": 1.0,
            "response_len_mean": 4.5,
            "reward_mean": 0.875,
            "tis_clip_frac": 0.0,
            "tis_weight_mean": 0.8391024982886522,
        },
        [-0.7655886515812181, -1.5119532096454038, 207.62690068315715],
    ),
    "rollout-logprobs": (
        {
            "adv_abs_mean": 0.1875,
            "approx_kl": 0.27467474341392517,
            "clip_frac": 0.3611111044883728,
            "entropy": 3.301279067993164,
            "forward_tokens": 112.0,
            "grad_norm": 0.20351888239383698,
            "loss": -0.0034110345877707005,
            "lr": 0.01,
            "num_tokens": 36.0,
            "ratio_mean": 0.8380959033966064,
            "response_len_mean": 4.5,
            "reward_mean": 0.875,
        },
        [-1.4027028724849346, 0.19020268156564976, 207.3032244835049],
    ),
    "logits-budget": (
        {
            "adv_abs_mean": 0.1875,
            "approx_kl": 0.0,
            "clip_frac": 0.0,
            "entropy": 3.4539406299591064,
            "forward_tokens": 97.0,
            "grad_norm": 0.21185748279094696,
            "loss": -0.027777777053415775,
            "lr": 0.01,
            "num_tokens": 36.0,
            "ratio_mean": 1.0,
            "response_len_mean": 4.5,
            "reward_mean": 0.875,
        },
        [-1.0351679418416422, -0.9789585499262373, 207.62146867509],
    ),
}


def make_model(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    config = tiny_config(VOCAB, 64)
    return DecoderLM(config)


def make_batch(n: int = 8, seed: int = 0) -> RolloutBatch:
    """n samples in groups of 4 with mixed rewards, ragged prompts and responses, rollout log-probs and
    off-policy weights (used by the cases that ask for them)."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 5))] for _ in range(n)]
    responses = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
    old = [[-3.6 + rng.uniform(-0.3, 0.3) for _ in r] for r in responses]
    weights = [[rng.uniform(0.5, 1.5) for _ in r] for r in responses]
    batch = RolloutBatch(prompts, responses, rewards, group_size=4, old_logprobs=old)
    batch.is_weights = weights
    return batch


def make_updater(case: str) -> tuple[GRPOUpdater, RolloutBatch]:
    cfg = dict(CASES[case])
    model = make_model()
    ref = copy.deepcopy(model).requires_grad_(False) if cfg.get("kl_coef") else None
    batch = make_batch()
    if case not in ("tis-and-weights",):
        batch.is_weights = None
    return GRPOUpdater(model, GRPOConfig(**cfg), ref), batch


def weight_change(model: DecoderLM, before: dict[str, torch.Tensor]) -> list[float]:
    """Two fixed random projections and the L1 norm of the weights' change: any change in what the update
    did moves them."""
    gens = [torch.Generator().manual_seed(s) for s in (11, 12)]
    out = [0.0, 0.0, 0.0]
    for name, p in sorted(model.named_parameters()):
        delta = (p.detach() - before[name]).double()
        for i, gen in enumerate(gens):
            out[i] += float((delta * torch.randn(delta.shape, generator=gen, dtype=torch.float64)).sum())
        out[2] += float(delta.abs().sum())
    return out


def run_case(case: str) -> tuple[dict[str, float], list[float]]:
    updater, batch = make_updater(case)
    before = {n: p.detach().clone() for n, p in updater.model.named_parameters()}
    stats = updater.update(batch)
    return stats, weight_change(updater.model, before)


@pytest.mark.parametrize("case", list(CASES))
def test_an_update_gives_the_numbers_it_gave_before(case: str) -> None:
    stats, change = run_case(case)
    expected_stats, expected_change = EXPECTED[case]
    assert set(stats) == set(expected_stats)
    for key, value in expected_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # The projections move by ~0.01 per weight whose update changed sign; thread counts move them by 1e-5.
    assert change[:2] == pytest.approx(expected_change[:2], abs=1e-3)
    assert change[2] == pytest.approx(expected_change[2], rel=1e-5)


def reads_during_update(micro_batch_size: int, ppo_epochs: int = 1) -> tuple[dict, dict, int]:
    """Host reads and syncing ops during one update (tests/test_sync_free.py's instruments), and the number
    of micro-batches. AdamW's step is not counted: the multi-tensor kernel used on CPU reads its step counts,
    which it keeps on the host; on CUDA the fused kernel keeps them on the device (the GPU test below)."""
    updater, batch = make_updater("token-mean")
    updater.config.micro_batch_size, updater.config.ppo_epochs = micro_batch_size, ppo_epochs
    step = updater.optimizer.step
    with counting() as (reads, _, syncing):

        def uncounted_step(*args, **kwargs):  # type: ignore[no-untyped-def]
            saved = dict(reads), dict(syncing)
            step(*args, **kwargs)
            for counter, before in zip((reads, syncing), saved, strict=True):
                counter.clear()
                counter.update(before)

        updater.optimizer.step = uncounted_step  # type: ignore[method-assign]
        updater.update(batch)
    return dict(reads), dict(syncing), len(updater._partition(batch))


def test_an_update_reads_the_device_twice_per_step_whatever_its_micro_batches() -> None:
    """Before, an update read the device 36 times at 1 micro-batch and 72 at 4: 12 reads per micro-batch
    (its loss, token counts, stats, widths) and one per weight tensor for the finite-weights check."""
    one = reads_during_update(micro_batch_size=8)
    four = reads_during_update(micro_batch_size=2)
    assert one[2] == 1 and four[2] == 4
    # One read of the stats, loss and gradient norm; one of the weights' largest magnitude.
    expected = ({"tolist": 1, "__float__": 1}, {"aten._local_scalar_dense.default": 1})
    assert one[:2] == four[:2] == expected
    reads, syncing, _ = reads_during_update(micro_batch_size=2, ppo_epochs=3)
    assert (reads, syncing) == ({"tolist": 3, "__float__": 3}, {"aten._local_scalar_dense.default": 3})


def test_a_non_finite_loss_still_stops_before_the_step() -> None:
    updater, batch = make_updater("token-mean")
    before = {n: p.detach().clone() for n, p in updater.model.named_parameters()}
    batch.rewards[0] = math.nan
    with pytest.raises(NonFiniteUpdate, match="the loss is nan"):
        updater.update(batch)
    assert all(torch.equal(p, before[n]) for n, p in updater.model.named_parameters())


def test_bf16_autocast_keeps_fp32_weights_and_nearly_the_fp32_loss() -> None:
    """Autocast runs the matmuls in bf16 (here on the CPU, as "auto" does on CUDA); the weights, gradients
    and optimizer state stay fp32, and the loss and stats are the fp32 ones to bf16 precision."""
    batch = make_batch()
    batch.is_weights = None
    results = {}
    for mode in ("off", "bfloat16"):
        model = make_model()
        updater = GRPOUpdater(model, GRPOConfig(lr=1e-2, micro_batch_size=4, autocast=mode))
        stats = updater.update(batch)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(v.dtype == torch.float32 for s in updater.optimizer.state.values() for v in s.values())
        results[mode] = stats, model
    (fp32, fp32_model), (bf16, bf16_model) = results["off"], results["bfloat16"]
    # Both steps move the weights the same way: Adam's first step is about lr * sign(gradient).
    start = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    moved = [
        torch.cat([p.detach().reshape(-1) for p in m.parameters()]) - start for m in (fp32_model, bf16_model)
    ]
    clear = moved[0].abs() > 5e-3
    assert (moved[0][clear].sign() == moved[1][clear].sign()).double().mean() > 0.9
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=2e-3)
    assert bf16["entropy"] == pytest.approx(fp32["entropy"], rel=1e-2)
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=5e-2)
    # The first ratio is 1 only if the old log-probs were recomputed under the same autocast.
    assert bf16["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and bf16["approx_kl"] == pytest.approx(
        0, abs=1e-9
    )
    assert GRPOUpdater(make_model(), GRPOConfig()).autocast_dtype is None  # "auto" on the CPU: off


def test_autocast_values_are_checked() -> None:
    GRPOConfig(autocast="bfloat16").check()
    with pytest.raises(UserError, match="grpo.autocast must be one of auto, bfloat16, off, got 'fp16'"):
        GRPOConfig(autocast="fp16").check()


def test_the_optimizer_is_multi_tensor_on_cpu_and_resumes_any_adamw_state() -> None:
    """A checkpoint written by another AdamW kernel (an older run's for-loop AdamW, a fused one on a GPU)
    resumes into this process's kernel and takes the same next step."""
    updater, batch = make_updater("token-mean")
    group = updater.optimizer.param_groups[0]
    assert group["foreach"] and not group["fused"]
    for kernel in ({"foreach": False}, {"fused": True}):
        old_model = make_model()
        old = GRPOUpdater(old_model, GRPOConfig(**CASES["token-mean"]))
        old.optimizer = torch.optim.AdamW(old_model.parameters(), lr=1e-2, **kernel)
        old.update(batch)
        resumed_model = copy.deepcopy(old_model)
        resumed = GRPOUpdater(resumed_model, GRPOConfig(**CASES["token-mean"]))
        resumed.load_state_dict(copy.deepcopy(old.state_dict()))
        assert resumed.optimizer.param_groups[0]["foreach"] and not resumed.optimizer.param_groups[0]["fused"]
        old.update(batch)
        resumed.update(batch)
        for a, b in zip(old_model.parameters(), resumed_model.parameters(), strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-6), kernel


@pytest.mark.gpu
def test_on_cuda_the_update_autocasts_fuses_adamw_and_syncs_a_constant_number_of_times() -> None:
    batch = make_batch()
    batch.is_weights = None
    model = make_model().cuda()
    updater = GRPOUpdater(model, GRPOConfig(lr=1e-2, micro_batch_size=4))
    assert updater.autocast_dtype == torch.bfloat16 and updater.optimizer.param_groups[0]["fused"]
    fp32 = GRPOUpdater(make_model().cuda(), GRPOConfig(lr=1e-2, micro_batch_size=4, autocast="off"))
    expected, got = fp32.update(batch), updater.update(batch)
    assert got["loss"] == pytest.approx(expected["loss"], abs=2e-3)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=5e-2)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())

    def syncs(micro_batch_size: int) -> int:
        cuda_updater = GRPOUpdater(
            make_model().cuda(), GRPOConfig(lr=1e-2, micro_batch_size=micro_batch_size)
        )
        cuda_updater.update(batch)  # warm-up: the caching allocators fill
        torch.cuda.synchronize()
        return syncs_during(lambda: cuda_updater.update(batch))

    assert syncs(8) == syncs(2) <= 2


def record() -> None:
    """Print EXPECTED for the updater in the working tree (how the values below were made)."""
    torch.set_num_threads(1)
    print({case: run_case(case) for case in CASES})


if __name__ == "__main__":
    record()
