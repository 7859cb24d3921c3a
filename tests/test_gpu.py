"""CUDA checks: the reference model and engine against transformers on the same weights, NVML for real,
and `rlbench doctor` seeing the GPU. Marked `gpu`: they skip on machines without CUDA (conftest.py)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.loader import load_model

pytestmark = pytest.mark.gpu


def _prompts(n: int, vocab: int = 98, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, vocab, (int(4 + 3 * i),), generator=gen).tolist() for i in range(n)]


def _transformers(path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to("cuda").eval()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_logits_match_transformers(family, request):
    path = request.getfixturevalue(f"{family}_dir")
    ours = load_model(path, device="cuda")
    assert next(ours.parameters()).dtype == torch.bfloat16  # "auto" on CUDA
    theirs = _transformers(path, torch.bfloat16)
    ids = torch.tensor(_prompts(4, seed=1)[3:4], device="cuda")
    with torch.no_grad():
        a, b = ours(ids).float(), theirs(ids).logits.float()
    # bf16 has 8 mantissa bits: compare against the logits' scale, and the argmax exactly where it is clear.
    scale = b.abs().max()
    assert (a - b).abs().max() <= 0.02 * scale
    clear = (b.topk(2, -1).values.diff(dim=-1).abs().squeeze(-1)) > 0.05 * scale
    assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def test_fp32_greedy_tokens_match_transformers_over_128_tokens(llama_dir):
    """128 greedy tokens per prompt, continuous batching on CUDA against transformers' generate, fp32."""
    ours = load_model(llama_dir, device="cuda", dtype="float32")
    engine = Engine(ours, EngineConfig(max_num_seqs=4, max_model_len=256, device="cuda"), eos_token_ids=[])
    prompts = _prompts(6, seed=2)
    seqs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True))
    theirs = _transformers(llama_dir, torch.float32)
    for prompt, seq in zip(prompts, seqs, strict=True):
        with torch.no_grad():
            out = theirs.generate(
                torch.tensor([prompt], device="cuda"),
                do_sample=False,
                max_new_tokens=128,
                min_new_tokens=128,
                pad_token_id=0,
            )
        assert seq.response_ids == out[0, len(prompt) :].tolist()


def test_nvml_samples_the_gpu_at_the_requested_rate():
    """The real sampler on a busy GPU: utilisation, memory and power are read, sample after sample (the rate
    is the schedule's, checked on a virtual clock in test_nvml.py: timings are not asserted here)."""
    from rlbench.observe.nvml import NvmlSampler

    sampler = NvmlSampler(now=time.perf_counter, interval_s=0.02).start()
    x = torch.randn(4096, 4096, device="cuda")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5:
        x = (x @ x).tanh_()
        torch.cuda.synchronize()  # keep the GPU busy for 1.5 s of wall time, not 1.5 s of launches
    result = sampler.stop()
    assert result["available"], result
    samples = [s for s in result["samples"] if s["gpu"] == 0]
    assert len(samples) >= 3 and [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    busy = [s["util"] for s in samples if s["util"] is not None]
    assert busy and max(busy) >= 50
    assert all(s["mem_used_mib"] > 0 and s["power_w"] > 0 for s in samples)


def test_doctor_reports_the_gpu(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "rlbench.cli", "doctor", "--json"], capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out)
    assert report["cuda_available"] is True
    assert torch.cuda.get_device_name(0) in json.dumps(report)
