"""The embedded default model: a ~0.9M-parameter character-level decoder warm-started by SFT on the
embedded tasks with the project's own training code. Built on first use (about 4 minutes on 2 CPU cores)
and cached under a directory keyed by its config and recipe, so every later run starts at once.

Why this small: a 5-minute CPU budget buys ~1M training tokens, and copying (the operand of the next step,
the next name of a puzzle) only emerges after enough optimizer steps. At d=256 (3.2M params) or d=192 the
same wall time gave 300 slow steps and ~2% arith accuracy; d=128 gets 900 steps and ~17% (greedy).
SFT sees the full heavy tail of arith chains (up to 48 operations), so rollouts of the embedded model have
the long tail that makes bubbles; an SFT capped at 8 operations gave responses of at most ~75 tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from reference_trainer.model.config import ModelConfig
from reference_trainer.train.sft import SFTConfig
from rlbench.records import replace_dir

RECIPE_VERSION = 1
MODEL_CONFIG = ModelConfig(
    vocab_size=99,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
)
SFT_CONFIG = SFTConfig(steps=900, batch_size=16, lr=4e-3, warmup=30, seed=0)
# (task name, constructor kwargs, share of SFT examples); SFT prompts come from a seed RL never uses.
SFT_MIX: list[tuple[str, dict, float]] = [("arith", {}, 0.5), ("kk", {"num_people": (2, 3)}, 0.5)]
SFT_DATA_SEED = 1_000_000


def cache_root() -> Path:
    return Path(os.environ.get("RLBENCH_CACHE_DIR", Path.home() / ".cache" / "rlbench"))


def recipe_key() -> str:
    recipe = {"model": asdict(MODEL_CONFIG), "sft": asdict(SFT_CONFIG), "mix": SFT_MIX, "v": RECIPE_VERSION}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def default_model_dir(
    build: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
    on_wait: Callable[[], None] | None = None,
) -> Path:
    """The cached embedded model's directory, warm-starting it first if it does not exist yet.

    Processes started together on a fresh cache build it once: the first takes the cache's lock and
    builds, the others wait (`on_wait` is called when they start to) and then load what it built.
    """
    path = cache_root() / f"embedded-{recipe_key()}"
    if not build:
        return path
    return build_once(path, lambda tmp: warm_start(tmp, on_step), _is_built, on_wait)


def _is_built(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def build_once(
    path: Path,
    build: Callable[[Path], object],
    ready: Callable[[Path], bool],
    on_wait: Callable[[], None] | None = None,
) -> Path:
    """Build directory `path` unless `ready(path)`, under an exclusive lock on `path`.lock, so concurrent
    callers build it once. The build goes into a temp directory published by rename, so a builder killed
    midway leaves no half directory behind (the lock dies with its process)."""
    if ready(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(path.with_name(path.name + ".lock"), on_wait):
        if not ready(path):  # checked again: the holder we waited for has usually built it
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                build(tmp)
                replace_dir(tmp, path)  # also replaces an incomplete directory left by older versions
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return path


@contextmanager
def _exclusive_lock(lock_path: Path, on_wait: Callable[[], None] | None) -> Iterator[None]:
    """fcntl.flock on a lock file (stdlib, released by the OS if the holder dies); no lock without fcntl."""
    try:
        import fcntl
    except ImportError:  # not POSIX: builders may race, and the rename still keeps the result whole
        yield
        return
    with open(lock_path, "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def warm_start(out_dir: Path, on_step: Callable[[int, int, float], None] | None = None) -> Path:
    import torch

    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.prompting import encode_prompt, encode_response
    from reference_trainer.model.tokenizer import CharTokenizer
    from reference_trainer.tasks import get_task
    from reference_trainer.train.sft import train_sft

    tokenizer = CharTokenizer()
    tasks = [(get_task(name, **kwargs), share) for name, kwargs, share in SFT_MIX]
    counter = iter(range(10**9))

    def sample_batch(rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
        rows = []
        for _ in range(n):
            task = rng.choices([t for t, _ in tasks], weights=[s for _, s in tasks])[0]
            problem = task.problems(1, seed=SFT_DATA_SEED, start=next(counter))[0]
            response = task.sft_response(problem, rng)
            rows.append((encode_prompt(tokenizer, problem.prompt), encode_response(tokenizer, response)))
        return rows

    torch.manual_seed(SFT_CONFIG.seed)
    model = DecoderLM(MODEL_CONFIG)
    total = SFT_CONFIG.steps
    train_sft(
        model, sample_batch, SFT_CONFIG, None if on_step is None else lambda s, loss: on_step(s, total, loss)
    )
    save_model(model, out_dir)
    tokenizer.save(out_dir)
    return out_dir
