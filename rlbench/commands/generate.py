"""`rlbench generate`: quick sampling from a model directory (or the embedded default)."""

from __future__ import annotations

from typing import Annotated

import typer

from rlbench.options import Device, ModelDir, Seed, Threads, echo

MAX_SAMPLES = 4096  # generate prints every sample; larger batches are what `rlbench eval` is for


def generate_command(
    prompt: Annotated[list[str], typer.Option("--prompt", help="Prompt text (repeat for a batch).")],
    model: ModelDir = None,
    device: Device = "auto",
    threads: Threads = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Max new tokens.")] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    samples: Annotated[int, typer.Option(min=1, help="Samples per prompt.")] = 1,
    seed: Seed = 0,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="auto (float32 on CPU, bfloat16 on CUDA), float32 or bfloat16: about 2x faster on CPUs "
            "with AVX512-BF16/AMX, not bit-equal to float32.",
        ),
    ] = "auto",
) -> None:
    """Generate from prompts with the reference engine (the model's chat template when it has one)."""
    import torch

    from reference_trainer.engine.config import EngineConfig, SamplingParams
    from reference_trainer.errors import MAX_SEED, MAX_THREADS, UserError, check_integer
    from reference_trainer.model.loader import resolve_threads
    from reference_trainer.model.prompting import encode_prompt
    from reference_trainer.rollout.engines import RolloutEngineSpec, build_rollout_engine
    from rlbench.models import load_model_and_tokenizer

    check_integer("--samples", samples, low=1, high=MAX_SAMPLES)
    if threads is not None:
        check_integer("--threads", threads, low=1, high=MAX_THREADS)
    count = len(prompt) * samples
    check_integer("--seed", seed, low=0, high=MAX_SEED - count)  # request i samples with seed + i
    params = [
        SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed + i
        ).check()
        for i in range(count)
    ]  # every option checked before the model loads
    torch.set_num_threads(resolve_threads(threads))
    lm, tokenizer = load_model_and_tokenizer(model, device=device, dtype=dtype)
    ids = [encode_prompt(tokenizer, p) for p in prompt for _ in range(samples)]
    limit = lm.config.max_position_embeddings
    if max(map(len, ids)) + max_tokens > limit:
        raise UserError(f"prompt + --max-tokens exceeds the model's context of {limit} tokens")
    config = EngineConfig(max_num_seqs=min(64, len(ids)), max_model_len=limit, device=device)
    engine = build_rollout_engine(RolloutEngineSpec(config=config), tokenizer, model=lm)
    for i, seq in enumerate(engine.generate(ids, params)):
        header = f"--- prompt {i // samples}" + (f", sample {i % samples}" if samples > 1 else "")
        echo(f"{header} ({len(seq.response_ids)} tokens, {seq.finish_reason})")
        echo(tokenizer.decode(seq.response_ids))
