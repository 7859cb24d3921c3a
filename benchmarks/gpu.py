"""rlbench's engine on a CUDA GPU: tokens/s and GPU memory against transformers' generate, the cost of
verifying k draft tokens relative to one decode step (what decides whether HistoSpec can pay), and a decode
step per attention implementation (what `EngineConfig.attention="auto"` should pick on CUDA).

    python -m benchmarks.gpu [--batches 1,32,256] [--attention-batches 1,64,256] [--max-tokens 256]
                             [--out benchmarks/results/gpu]

Two models, both bf16 on the GPU:
- the embedded default model (real weights, char vocabulary), rollouts that stop at EOS and fixed length;
- a model of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 KV heads, 49,152 vocabulary) with
  random weights, fixed length (random weights give no meaningful EOS). Its speed is the real model's speed:
  the arithmetic does not depend on the values.
Each cell: one engine built (its decode graphs captured at construction), one warm-up run, then the median
of --repeats runs, engine and transformers interleaved. Both
sample at T = 1 with the same max tokens; each side's own generated-token count is used. The attention
table (`attention_table`) times, on the SmolLM2 shape, a decode step and an 8-token verify forward over
256 cached tokens per row, for each implementation of model/attention.py, through the engine's runner (CUDA
graphs; flex compiled, its compiles in the untimed first run of each shape). Writes OUT/engine.json,
OUT/verify_cost.json and OUT/attention.json with the device, driver, torch version and commit.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import hf_generate, resolve_model
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.model.attention import IMPLEMENTATIONS, resolve_attention
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import load_model, save_model
from reference_trainer.model.prompting import encode_prompt
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.speculation.cost import measure_cost_model
from reference_trainer.tasks import get_task
from reference_trainer.trace.records import write_json

SMOLLM2_SHAPE = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def device_record() -> dict[str, object]:
    import pynvml

    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    from rlbench.reproduce.runner import source_commit

    commit = source_commit()
    return {
        "device": torch.cuda.get_device_name(0),
        "driver": driver if isinstance(driver, str) else driver.decode(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }


def timed(fn) -> tuple[float, int, float]:
    """(seconds, result, peak GPU memory in GiB) of fn(), synchronised around the call."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    tokens = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, tokens, torch.cuda.max_memory_allocated() / 2**30


def make_engine(model: DecoderLM, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> Engine:
    """One engine per table cell, built (and its decode graphs captured) once, outside the timed runs."""
    longest = max(map(len, prompts))
    config = EngineConfig(max_num_seqs=len(prompts), max_model_len=longest + max_tokens + 1, device="cuda")
    return Engine(model, config, eos_token_ids=eos)


def engine_run(engine: Engine, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> int:
    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=not eos, seed=i)
        for i in range(len(prompts))
    ]
    seqs = engine.generate(prompts, params)
    return sum(len(s.response_ids) for s in seqs)


def hf_run(model, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> int:
    generated = hf_generate(model, prompts, max_tokens, eos[0] if eos else None, bool(eos))
    if not eos:
        return generated.numel()
    hit = generated == eos[0]
    first = torch.where(hit.any(1), hit.int().argmax(1) + 1, torch.full_like(hit[:, 0], generated.shape[1]))
    return int(first.sum())


def throughput(label, path, prompt_pool, batches, max_tokens, eos_settings, repeats) -> list[dict]:
    from transformers import AutoModelForCausalLM

    ours = load_model(path, device="cuda")  # "auto": bf16 on CUDA
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda").eval()
    rows = []
    for setting, eos in eos_settings.items():
        for batch in batches:
            prompts = prompt_pool[:batch]
            runs = {"rlbench": [], "transformers": []}
            engine = make_engine(ours, prompts, max_tokens, eos)
            engine_run(engine, prompts, 8, eos)  # warm-up (kernels, allocator, verify-free shapes)
            hf_run(theirs, prompts[:2], 8, eos)
            for _ in range(repeats):
                runs["rlbench"].append(
                    timed(lambda p=prompts, e=eos, g=engine: engine_run(g, p, max_tokens, e))
                )
                runs["transformers"].append(timed(lambda p=prompts, e=eos: hf_run(theirs, p, max_tokens, e)))
            row: dict[str, object] = {"model": label, "setting": setting, "batch": batch}
            for side, results in runs.items():
                rates = [tokens / secs for secs, tokens, _ in results]
                row[f"{side}_tokens_per_s"] = statistics.median(rates)
                row[f"{side}_peak_gib"] = max(mem for _, _, mem in results)
            row["ratio"] = row["rlbench_tokens_per_s"] / row["transformers_tokens_per_s"]
            rows.append(row)
            print(
                f"| {label} | {setting} | {batch} | {row['rlbench_tokens_per_s']:,.0f} | "
                f"{row['transformers_tokens_per_s']:,.0f} | {row['ratio']:.2f}x | "
                f"{row['rlbench_peak_gib']:.2f} / {row['transformers_peak_gib']:.2f} |",
                flush=True,
            )
    return rows


def verify_cost(label: str, path: Path, batches: list[int]) -> dict:
    model = load_model(path, device="cuda")
    engine = Engine(model, EngineConfig(max_num_seqs=max(batches), max_model_len=1024, device="cuda"))
    qs = [1, 2, 4, 8, 16]
    table = measure_cost_model(engine, batches=batches, qs=qs, context=256, repeats=5).table
    rel = {f"{b}x{q}": table[b, q] / table[b, 1] for b in batches for q in qs}
    for b in batches:
        cells = " | ".join(f"{table[b, q] / table[b, 1]:.2f}x" for q in qs)
        print(f"| {label} | {b} | {table[b, 1] * 1e3:.2f} ms | {cells} |", flush=True)
    return {"model": label, "ms": {f"{b}x{q}": t * 1e3 for (b, q), t in table.items()}, "relative": rel}


def attention_table(
    model: DecoderLM,
    batches: list[int],
    context: int = 256,
    qs: tuple[int, ...] = (1, 8),
    repeats: int = 5,
    max_model_len: int = 1024,
) -> list[dict]:
    """Per attention implementation: milliseconds of a forward of b rows x q tokens ("BxQ": q = 1 a decode
    step, q > 1 a verify), each row continuing `context` cached tokens, timed as the engine runs them
    (speculative.measure_cost_model: the fastest of `repeats` after an untimed first run, which compiles and
    captures). Runs on any device (CPU: eager, for the smoke test). An implementation that fails (flex not
    compiling, say) gets its error in its row, and the others still run."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    rows: list[dict] = []
    for attention in IMPLEMENTATIONS:
        config = EngineConfig(
            max_num_seqs=max(batches), max_model_len=max_model_len, device=device.type, attention=attention
        )
        row: dict[str, object] = {"attention": attention}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            engine = Engine(model, config)
            table = measure_cost_model(engine, batches=batches, qs=qs, context=context, repeats=repeats).table
        except Exception as err:  # a failing implementation is a result to record, not the end of the run
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
            rows.append(row)
            print(f"| {attention} | failed: {row['error']} |", flush=True)
            continue
        row["layout"] = "contiguous" if engine.slots.contiguous else "paged"
        row["cuda_graphs"] = engine.runner.static is not None
        row["wall_s"] = time.perf_counter() - start  # with every compile and capture
        row["ms"] = {f"{b}x{q}": t * 1e3 for (b, q), t in table.items()}
        if cuda:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        for b in sorted({b for b, _ in table}):
            cells = " | ".join(f"{table[b, q] * 1e3:.3f} ms" for q in sorted({q for _, q in table}))
            print(f"| {attention} | {row['layout']} | {b} | {cells} |", flush=True)
        del engine, table
        gc.collect()  # free this engine's KV cache before the next one allocates its own
        if cuda:
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--attention-batches", default="1,64,256")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu")
    parser.add_argument("--tables", default="engine,verify,attention", help="which tables to make")
    args = parser.parse_args()
    tables = set(args.tables.split(","))
    if not tables or tables - {"engine", "verify", "attention"}:
        sys.exit(f"error: --tables takes engine, verify and attention, got {args.tables!r}")
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/gpu.py needs a CUDA GPU")
    batches = [int(b) for b in args.batches.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    record = device_record()
    print(record)

    embedded, embedded_label = resolve_model(None)
    tokenizer = CharTokenizer()
    task = get_task("arith")
    arith = [encode_prompt(tokenizer, p.prompt) for p in task.problems(max(batches), seed=123)]
    with tempfile.TemporaryDirectory() as tmp:
        smol = Path(tmp) / "smollm2-shape"
        torch.manual_seed(0)
        save_model(DecoderLM(SMOLLM2_SHAPE), smol)
        gen = torch.Generator().manual_seed(0)
        random_prompts = [
            [1] + torch.randint(3, 49152, (int(32 + (i * 7) % 33),), generator=gen).tolist()
            for i in range(max(batches))
        ]
        if "engine" in tables:
            print(
                "| model | setting | batch | rlbench tok/s | transformers tok/s | ratio "
                "| peak GiB (ours / HF) |"
            )
            print("|---|---|---:|---:|---:|---:|---|")
            rows = throughput(
                embedded_label,
                embedded,
                arith,
                batches,
                args.max_tokens,
                {"rollout (stop at EOS)": sorted(tokenizer.eos_token_ids), "fixed length": []},
                args.repeats,
            )
            rows += throughput(
                "SmolLM2-135M shape, random weights",
                smol,
                random_prompts,
                batches,
                args.max_tokens,
                {"fixed length": []},
                args.repeats,
            )
            write_json(args.out / "engine.json", {**record, "max_tokens": args.max_tokens, "rows": rows})

        if "verify" in tables:
            print(
                "\n| model | batch | decode step | q=1 | q=2 | q=4 | q=8 | q=16 (verify cost / decode step) |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            costs = [verify_cost(embedded_label, embedded, batches)]
            costs.append(verify_cost("SmolLM2-135M shape, random weights", smol, batches))
            write_json(args.out / "verify_cost.json", {**record, "context": 256, "models": costs})

        if "attention" in tables:
            print("\n| attention | KV layout | batch | decode step (q=1) | verify (q=8) |")
            print("|---|---|---:|---:|---:|")
            attention_batches = [int(b) for b in args.attention_batches.split(",")]
            rows = attention_table(load_model(smol, device="cuda"), attention_batches)
            write_json(
                args.out / "attention.json",
                {
                    **record,
                    "model": "SmolLM2-135M shape, random weights",
                    "context": 256,
                    "auto_picks": resolve_attention("auto", torch.device("cuda")),
                    "rows": rows,
                },
            )


if __name__ == "__main__":
    main()
