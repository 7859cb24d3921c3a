"""The inference path's pre-packed CPU matmuls: equal to F.linear up to summation order, refreshed after an
in-place weight update, and invisible in what the engine generates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model import packed
from reference_trainer.model.loader import load_model

needs_packing = pytest.mark.skipif(
    not packed.can_pack(torch.zeros(512, 512)), reason="no oneDNN linear in this torch build"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_matches_f_linear_and_follows_updates(dtype):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(512, 512, generator=gen).to(dtype), torch.randn(512, generator=gen).to(dtype)
    if not packed.can_pack(weight):  # oneDNN's bf16 linear needs CPU support that some runners lack
        pytest.skip(f"no oneDNN {dtype} linear on this CPU")
    linear = packed.InferenceLinear(weight, bias)
    assert linear.packed is not None
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for shape in ((1, 512), (3, 7, 512)):
        x = torch.randn(*shape, generator=gen).to(dtype)
        torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=tol * 30, rtol=tol)
    weight.mul_(-1)  # an in-place update: the packed copy is stale until repack()
    linear.repack()
    x = torch.randn(2, 512, generator=gen).to(dtype)
    torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=tol * 30, rtol=tol)


def test_small_weights_stay_on_f_linear():
    assert packed.InferenceLinear(torch.randn(384, 128)).packed is None  # the call overhead would dominate


@needs_packing
def test_engine_output_and_weight_updates_with_packed_matmuls(llama_dir, monkeypatch):
    prompts = [[1, 5, 9, 13], [1, 7, 7, 2, 40, 41]]
    params = [
        SamplingParams(temperature=0, max_tokens=24),
        SamplingParams(temperature=1, max_tokens=24, seed=3),
    ]

    def run(pack: bool, update_from=None) -> list[list[int]]:
        monkeypatch.setattr(packed, "MIN_PACKED_ELEMENTS", 0 if pack else 2**62)
        engine = Engine(load_model(llama_dir), EngineConfig(max_num_seqs=2, max_model_len=64))
        assert (engine.model.head.packed is not None) == pack
        if update_from is not None:  # weights copied in place, then repacked by the engine
            engine.update_weights(load_model(update_from).state_dict())
        return [s.response_ids for s in engine.generate(prompts, params)]

    assert run(True) == run(False)
    other = llama_dir.parent / "other"
    if not other.exists():
        from conftest import write_hf_checkpoint

        write_hf_checkpoint(other, "llama", seed=1)
    assert run(True, update_from=other) == run(False, update_from=other) != run(False)
