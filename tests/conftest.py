"""Shared fixtures: tiny random checkpoints written with transformers' save_pretrained."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from unittest import mock

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One intra-op thread here and in the processes the tests start, unless OMP_NUM_THREADS says otherwise
# (scripts/vllm_tests.sh gives vLLM 2): tiny shapes gain nothing from a second one, and where another
# process keeps a core busy OpenMP's spinning threads wait on each other (the attention tests took 53-100 s
# on 2 threads and 20 s on 1 at load 4-5 on 2 cores). The commands' own default, resolve_threads, leaves a
# core free for the same reason.
torch.set_num_threads(max(1, int(os.environ.setdefault("OMP_NUM_THREADS", "1").split(",")[0])))


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip cleanly on machines without CUDA (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The interpreter's `rlbench` console script, where an install made one (CI's next step runs it).
RLBENCH_SCRIPT = Path(sysconfig.get_path("scripts")) / "rlbench"
RLBENCH_SCRIPT_AT_START = RLBENCH_SCRIPT.exists()


def pytest_sessionfinish(session, exitstatus):
    """The tests leave the interpreter's own packages alone: a test's `pip install --prefix` once uninstalled
    the venv's rlbench, and CI's next step found no `rlbench` command."""
    if RLBENCH_SCRIPT_AT_START and not RLBENCH_SCRIPT.exists():
        print(f"\nerror: the tests removed {RLBENCH_SCRIPT} (an uninstall of this interpreter's rlbench)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _click_command():  # type: ignore[no-untyped-def]
    """The Click command tree that Typer builds from rlbench's app on every call (about 0.1 s, most of an
    error case's time), built once for the in-process calls of `cli`. The commands' functions look up what
    they call when they run, so a test's monkeypatch of it still takes effect."""
    import typer

    from rlbench.cli import app_

    return typer.main.get_command(app_)


def cli(
    *args: str, tmp: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`rlbench ARGS` run in this process, as the console script runs it (UserError -> one line, exit 2), in
    `tmp` (with imported models cached there) or the repository root. Fast enough for every error case;
    `cli_process` is the real thing for what needs a process of its own (start-up, signals, kills)."""
    import typer

    from rlbench.cli import app, app_

    build, built = typer.main.get_command, _click_command()
    environ = {**(env or {}), **({"RLBENCH_CACHE_DIR": str(tmp / "cache")} if tmp is not None else {})}
    saved_env = {key: os.environ.get(key) for key in environ}
    saved_cwd, saved_argv, threads = os.getcwd(), sys.argv, torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    os.environ.update(environ)
    os.chdir(tmp or ROOT)
    sys.argv = ["rlbench", *args]
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            mock.patch.object(typer.main, "get_command", lambda t: built if t is app_ else build(t)),
        ):
            app()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        torch.set_num_threads(threads)
        for key, value in saved_env.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(["rlbench", *args], returncode, out.getvalue(), err.getvalue())


def cli_process(*args: str, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m rlbench.cli ARGS` in a process of its own (end-to-end tests)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if tmp is not None:
        env["RLBENCH_CACHE_DIR"] = str(tmp / "cache")  # imported models go to a temporary cache
    return subprocess.run([sys.executable, "-m", "rlbench.cli", *args], capture_output=True, text=True,
                          env=env, cwd=tmp or ROOT, timeout=timeout)  # fmt: skip


def assert_one_line_error(res: subprocess.CompletedProcess, text: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and text in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def write_hf_checkpoint(path: Path, family: str, seed: int = 0, **overrides) -> Path:
    """A random tiny Llama or Qwen2 checkpoint saved by transformers (the oracle's own format)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=98,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    common.update(overrides)
    if family == "qwen2":
        config = Qwen2Config(rope_theta=1_000_000.0, tie_word_embeddings=True, **common)
        model = Qwen2ForCausalLM(config)
    elif family == "llama":
        config = LlamaConfig(rope_theta=500_000.0, tie_word_embeddings=False, **common)
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(family)
    # Random init leaves norms at 1 and biases at 0: perturb them so a wrong mapping shows in the logits.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def write_tiny_char_model(path: Path, seed: int = 0, eos_weight: float | None = None, **overrides) -> Path:
    """A random 2-layer char-level model directory (the embedded model's format at toy size). `overrides`
    change the ModelConfig; `eos_weight` sets the EOS row of the LM head (a constant row makes the EOS logit
    swing with the hidden state, so response lengths vary)."""
    from reference_trainer.model.config import ModelConfig
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer

    torch.manual_seed(seed)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    shape.update({"max_position_embeddings": 256, **overrides})
    config = ModelConfig(vocab_size=99, bos_token_id=1, eos_token_id=2, **shape)
    model = DecoderLM(config)
    if eos_weight is not None:
        with torch.no_grad():
            model.lm_head.weight[config.eos_token_id] = eos_weight
    save_model(model, path)
    CharTokenizer().save(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_char_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def toy_task(monkeypatch) -> str:
    """arith prompts, rewarded by the parity of the number of distinct characters: rewards vary within
    groups even for a random model, so updates really move the weights."""
    from reference_trainer.tasks import TASKS
    from reference_trainer.tasks.arith import ArithTask

    class Toy(ArithTask):
        name = "toy"

        def grade(self, problem, response):
            return True, len(set(response)) % 2 == 1

    monkeypatch.setitem(TASKS, "toy", Toy)
    return "toy"


def grade_as_pool(response: str, gold: str, problem: str = ""):  # -> GradeResult
    """A maths response graded as rlbench's grading pool grades it: a math-verify timeout (a busy CPU, not
    the answer) gets one retry with the longer limit, so a loaded test machine does not change a verdict."""
    from reference_trainer.tasks import grading

    result = grading.grade_item(grading.GradeItem("math", response, gold, problem=problem))
    if result.error == grading.MATH_VERIFY_TIMED_OUT:
        longer = grading.RETRY_VERIFY_TIMEOUT_S
        item = grading.GradeItem("math", response, gold, verify_timeout_s=longer, problem=problem)
        result = grading.grade_item(item)
    return result


HOLD = """
import sys, time
from reference_trainer.trace.locks import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    """A run directory another process holds (as a running train or eval would): (its path, the pid)."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    yield run, holder.pid
    holder.kill()
    holder.wait()


def small_arith_run(tmp_path_factory, micro_batch_size: int = 8, **fields) -> Path:  # type: ignore[no-untyped-def]
    """Train a small arith run on the tiny char model (no evaluation, no checkpoint on the way) and return
    its folder: the validation and replay tests' recorded runs (groups of 4, in-process engines).
    `fields` are TrainConfig's."""
    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    model = write_tiny_char_model(tmp_path_factory.mktemp("model"))
    out = tmp_path_factory.mktemp("run")
    settings = {
        "eval_every": 0,
        "max_tokens": 64,
        "max_model_len": 256,
        "checkpoint_every": 100,
        "group_size": 4,
        "worker_backend": "local",
        **fields,
    }
    train = TrainConfig(task="arith", model=str(model), **settings)
    train.grpo.micro_batch_size = micro_batch_size
    trainer = Trainer(train, out)
    try:
        trainer.run()
    finally:
        trainer.close()
    return out


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    """Torch on one thread for the test: small batches run fastest so (a second thread may be busy), and the
    float sums, hence the sampled tokens, stay those of the recorded runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(vocab_size: int, max_positions: int = 128, **extra):  # type: ignore[no-untyped-def]
    """The engine and update tests' two-layer model shape (4 query heads over 2 KV heads, width 32)."""
    from reference_trainer.model.config import ModelConfig

    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        **extra,
    )


def peaked_model():  # type: ignore[no-untyped-def]
    """A tiny DecoderLM, peaked (low-entropy) like a trained one so drafts get accepted, with EOS as likely
    as a common token so lengths vary: the speculative and lookahead tests' model."""
    from reference_trainer.model.config import ModelConfig
    from reference_trainer.model.decoder import DecoderLM

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    m = DecoderLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(6.0)
        m.lm_head.weight[2] = m.lm_head.weight[30]  # EOS (id 2)
    return m.eval()
