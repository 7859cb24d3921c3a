"""One side of benchmarks/decode_step.py in a fresh process: its decode step timed by difference and, for
the engine on CUDA, profiled. decode_step.py starts these.

    python benchmarks/decode_step_runs.py '{"side": "engine", "model": DIR, "device": "cuda", ...}'

prints one JSON line. Run as a script with PYTHONPATH set to the checkout whose engine is measured, so
`reference_trainer` comes from there (an older checkout for the `before` side): only the standard library,
torch, transformers and the engine API that every checkout since d990e15 shares are used here.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Host calls that start work on the GPU: a kernel each, or a whole captured graph.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")


def engine_side(spec: dict[str, Any]) -> Callable[[int], None]:
    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.engine.engine import Engine
    from reference_trainer.model.loader import load_model

    model = load_model(spec["model"], device=spec["device"])
    prompts = spec["prompts"]
    longest = max(map(len, prompts)) + spec["lengths"][-1] + 1
    # engine-eager: this checkout's engine with CUDA graphs off (the fall-back if capture fails on a GPU)
    eager = {"cuda_graphs": False} if spec["side"] == "engine-eager" else {}
    config = EngineConfig(max_num_seqs=len(prompts), max_model_len=longest, device=spec["device"], **eager)
    engine = Engine(model, config, eos_token_ids=[])

    def generate(tokens: int) -> None:
        params = [
            SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i)
            for i in range(len(prompts))
        ]
        engine.generate(prompts, params)

    return generate


def transformers_side(spec: dict[str, Any], static: bool) -> Callable[[int], None]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if spec["device"] == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype).to(spec["device"]).eval()
    ids = torch.tensor(spec["prompts"], device=spec["device"])  # equal lengths: no padding
    cache = {"cache_implementation": "static"} if static else {}

    def generate(tokens: int) -> None:
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=0,
                **cache,
            )

    return generate


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(generate: Callable[[int], None], tokens: int, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    generate(tokens)
    synchronize(device)
    return time.perf_counter() - start


def count_events(events: Any) -> dict[str, float]:
    """Kernel time (s) and host launches, graph launches and device-to-host copies in profiler events
    (torch.profiler's FunctionEvents, or anything with .name, .device_type and .time_range)."""
    from torch.autograd import DeviceType

    out = {"kernel_s": 0.0, "launches": 0.0, "graph_launches": 0.0, "dtoh_copies": 0.0}
    for event in events:
        if event.device_type == DeviceType.CUDA:
            if event.name.startswith("Memcpy DtoH"):
                out["dtoh_copies"] += 1
            else:
                out["kernel_s"] += event.time_range.elapsed_us() / 1e6
        elif event.name in LAUNCHES:
            out["launches"] += 1
        elif event.name in GRAPH_LAUNCHES:
            out["graph_launches"] += 1
    return out


def profiled(generate: Callable[[int], None], tokens: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    synchronize("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(tokens)
        synchronize("cuda")
    return count_events(prof.events())


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Per decode step: the median over `repeats` of (time of `long` tokens - time of `short`) / (long -
    short), after one untimed run of each length (graph captures, compiles, allocator warm-up); on CUDA for
    the engine sides, the profiled difference of the two lengths per step as well."""
    import torch

    torch.manual_seed(0)
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    side, device = spec["side"], spec["device"]
    engine = side in ("engine", "engine-eager", "before")
    generate = engine_side(spec) if engine else transformers_side(spec, static=side == "hf-static")
    short, long = spec["lengths"]
    for tokens in (short, long):
        generate(tokens)
    steps = []
    for _ in range(spec["repeats"]):
        steps.append((timed(generate, long, device) - timed(generate, short, device)) / (long - short))
    out: dict[str, Any] = {"side": side, "batch": len(spec["prompts"]), "step_s": statistics.median(steps)}
    out["step_s_runs"] = steps
    if device == "cuda" and engine:
        a, b = profiled(generate, short), profiled(generate, long)
        out["per_step"] = {key: (b[key] - a[key]) / (long - short) for key in a}
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
