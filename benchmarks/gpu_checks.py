"""The GPU run's correctness stage: what a GPU must show before any of its timings mean anything.

    python -m benchmarks.gpu_checks --out DIR [--device cuda|cpu] [--shape smollm2|tiny]

Each check runs on its own (one failing does not stop the others) and DIR/correctness.json is rewritten
after each, so a run cut off by its time limit keeps the checks it finished:
- sampler: the keyed sampler draws bitwise the same tokens on the device as on the CPU (T = 1, T = 0.7,
  top-k, top-p and greedy rows over a 49,152-token vocabulary), log-probs within float32 rounding;
- graphs: at batch 64 and 256, CUDA graphs replayed give the tokens of the same static forward run eagerly
  (bitwise, seeded sampling at T = 1), and the share of rows equal to the own-shape eager engine;
- readbacks: host synchronisations per decode step of a running engine (CUDA's sync debug mode counts them;
  the target is one, the read-back of the sampled tokens);
- logits: bf16 logits of the reference model against transformers' on the same weights, per position band
  up to 1,536 (RoPE's angles at long positions), beside transformers' own bf16-vs-fp32 gap as the floor.
`--device cpu --shape tiny` is the dry run CI makes (tests/test_gpu_run.py).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_step import TINY_SHAPE, record
from benchmarks.gpu import SMOLLM2_SHAPE
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.sampler import SamplingBatch, sample, seed_key
from reference_trainer.engine.sequence import Request
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import load_model, save_model
from reference_trainer.trace.records import write_json

BANDS = ((0, 128), (128, 512), (512, 1024), (1024, 1536))


def check_sampler(device: str, shape: ModelConfig) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    rows = 256
    logits = torch.randn(rows, shape.vocab_size, generator=gen) * 4
    kinds = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=50),
        SamplingParams(temperature=0.9, top_p=0.9),
        SamplingParams(temperature=0.0),
    ]
    params = [kinds[i % len(kinds)] for i in range(rows)]
    keys = [seed_key(i) for i in range(rows)]
    positions = torch.randint(0, 4096, (rows,), generator=gen).tolist()
    out = {}
    for where in ("cpu", device):
        batch = SamplingBatch.build(params, keys, positions, torch.device(where))
        tokens, logprobs = sample(logits.to(where), batch)
        out[where] = (tokens.cpu(), logprobs.cpu())
    (t_cpu, lp_cpu), (t_dev, lp_dev) = out["cpu"], out[device]
    mismatches = int((t_cpu != t_dev).sum())
    return {
        "rows": rows,
        "token_mismatches": mismatches,
        "max_logprob_diff": float((lp_cpu - lp_dev).abs().max()),
        "passed": mismatches == 0,
    }


def _model(shape: ModelConfig, device: str) -> DecoderLM:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return DecoderLM(shape).to(device, dtype)


def _prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        [1, *torch.randint(3, vocab, (int(16 + (i * 7) % 24),), generator=gen).tolist()] for i in range(batch)
    ]


def check_graphs(device: str, shape: ModelConfig, batches: tuple[int, ...]) -> dict[str, Any]:
    """Graph replay vs the same static forward eager (must be bitwise equal), and vs the own-shape eager
    engine (bf16 reductions at other shapes may differ: reported, not required)."""
    model = _model(shape, device)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        prompts = _prompts(batch, shape.vocab_size)
        params = [
            SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=i) for i in range(batch)
        ]

        def run(
            graphs: bool, capture: bool, batch=batch, prompts=prompts, params=params
        ) -> tuple[list[list[int]], float, int]:
            config = EngineConfig(max_num_seqs=batch, max_model_len=128, device=device, cuda_graphs=graphs)
            engine = Engine(copy.deepcopy(model), config, eos_token_ids=[])
            if graphs and not capture and engine.runner.static is not None:
                engine.runner.static = StaticForward(
                    engine.model,
                    engine.slots,
                    config.max_verify_tokens,
                    False,
                    engine.runner.static.attention,
                    sampling=engine.sampling,  # as the runner's: decode samples inside the forward
                )
            start = time.perf_counter()
            out = [s.response_ids for s in engine.generate(prompts, params)]
            captured = len(engine.runner.static.graphs) if engine.runner.static is not None else 0
            return out, time.perf_counter() - start, captured

        replayed, replay_s, captured = run(True, True)
        static_eager, _, _ = run(True, False)
        own_shape, own_s, _ = run(False, False)
        rows.append({
            "batch": batch,
            "graphs_captured": captured,
            "replay_equals_static_eager": replayed == static_eager,
            "rows_equal_own_shape_eager": sum(map(list.__eq__, replayed, own_shape)) / batch,
            "generate_s": {"graphs": replay_s, "own_shape_eager": own_s},
        })  # fmt: skip
    return {"rows": rows, "passed": all(r["replay_equals_static_eager"] for r in rows)}


def check_readbacks(device: str, shape: ModelConfig) -> dict[str, Any]:
    """Synchronisations per decode step, counted by CUDA's sync debug mode over steps of a full batch."""
    if device != "cuda":
        return {"skipped": "CUDA's sync debug mode needs CUDA"}
    engine = Engine(_model(shape, device), EngineConfig(max_num_seqs=64, max_model_len=128, device=device))
    prompts = _prompts(64, shape.vocab_size, seed=1)
    params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=0)
    engine.generate(prompts, params)  # warm-up: graphs captured, allocator filled
    for prompt in prompts:
        engine.add_request(Request(prompt, params))
    for _ in range(3):  # prefill, then the first decode steps at this batch
        engine.step()
    steps, counts = 16, []
    for _ in range(steps):
        torch.cuda.synchronize()
        counts.append(syncs_during(engine.step))
    while engine.has_unfinished():
        engine.step()
    return {"steps": steps, "syncs_per_step": counts, "passed": max(counts) <= 1}


def syncs_during(work: Callable[[], object]) -> int:
    """Host synchronisations while `work` runs, as CUDA's sync debug mode reports them (one warning each)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def check_logits(device: str, shape: ModelConfig) -> dict[str, Any]:
    """Max |logit difference| / logit scale per position band: ours vs transformers in the run's dtype, and
    transformers' own dtype-vs-fp32 gap (the floor any bf16 implementation has)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    length = min(BANDS[-1][1], shape.max_position_embeddings)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        save_model(DecoderLM(shape), Path(tmp) / "model")
        ours = load_model(
            Path(tmp) / "model", device=device, dtype="bfloat16" if device == "cuda" else "float32"
        )
        theirs = AutoModelForCausalLM.from_pretrained(Path(tmp) / "model", dtype=dtype).to(device).eval()
        exact = (
            AutoModelForCausalLM.from_pretrained(Path(tmp) / "model", dtype=torch.float32).to(device).eval()
        )
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, shape.vocab_size, (1, length), generator=gen).to(device)
    with torch.no_grad():
        a = ours(ids).float()[0]
        b = theirs(ids).logits.float()[0]
        c = exact(ids).logits.float()[0]
    scale = float(c.abs().max())
    bands = []
    for lo, hi in BANDS:
        if lo >= length:
            break
        bands.append({
            "positions": [lo, min(hi, length)],
            "ours_vs_transformers": float((a[lo:hi] - b[lo:hi]).abs().max()) / scale,
            "transformers_vs_fp32": float((b[lo:hi] - c[lo:hi]).abs().max()) / scale,
            "ours_vs_fp32": float((a[lo:hi] - c[lo:hi]).abs().max()) / scale,
            "argmax_agreement_with_fp32": float((a[lo:hi].argmax(-1) == c[lo:hi].argmax(-1)).float().mean()),
        })  # fmt: skip
    # Ours may not drift further from fp32 than transformers' own bf16 does, in any band (with slack 2x).
    passed = all(band["ours_vs_fp32"] <= 2 * band["transformers_vs_fp32"] + 1e-4 for band in bands)
    return {"dtype": str(dtype), "scale": scale, "bands": bands, "passed": passed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", default="smollm2", choices=["smollm2", "tiny"])
    args = parser.parse_args()
    shape = SMOLLM2_SHAPE if args.shape == "smollm2" else TINY_SHAPE
    batches = (64, 256) if args.shape == "smollm2" else (4, 8)
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "sampler": lambda: check_sampler(args.device, shape),
        "graphs": lambda: check_graphs(args.device, shape, batches),
        "readbacks": lambda: check_readbacks(args.device, shape),
        "logits": lambda: check_logits(args.device, shape),
    }
    result: dict[str, Any] = {**record(args.device), "shape": args.shape, "checks": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            outcome = check()
        except Exception as error:  # one check's failure is its result; the others still run
            outcome = {"passed": False, "error": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        outcome["seconds"] = time.perf_counter() - start
        result["checks"][name] = outcome
        print(f"{name}: {'passed' if outcome.get('passed') else outcome.get('skipped') or 'FAILED'} "
              f"({outcome['seconds']:.1f} s)", flush=True)  # fmt: skip
        write_json(args.out / "correctness.json", result)


if __name__ == "__main__":
    main()
