"""End to end through the CLI with the real reference engine: a tiny random Llama and the char tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # whole commands in processes of their own

pytest.importorskip("reference_trainer.engine.engine")


def _tiny_model(model_dir: Path) -> Path:
    import torch

    from reference_trainer.model.config import ModelConfig
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
    )
    save_model(DecoderLM(config), model_dir)
    tok.save(model_dir)
    return model_dir


def _data(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True)
    rows = [{"id": f"e2e-{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
    (data_dir / "amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


def test_eval_with_reference_engine(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rlbench.cli import app_

    model = _tiny_model(tmp_path / "model")
    data = _data(tmp_path / "data")
    args = ["eval", "--suite", "amc23", "--model", str(model), "--data-dir", str(data), "--samples", "2"]
    args += ["--max-tokens", "12", "--temperature", "1.0", "--device", "cpu", "--seed", "3"]
    first = CliRunner().invoke(app_, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    assert res["engine"] == "reference" and res["template"] == "math" and res["problems_evaluated"] == 3
    for row in res["problems"]:
        assert len(row["correct"]) == 2
        assert all(0 < n <= 12 for n in row["response_tokens"])  # the char model counts what it generated
    assert (tmp_path / "a" / "report.html").stat().st_size > 100_000

    # same seed, fresh dir: identical samples (per-request seeds derive from problem id and sample index)
    second = CliRunner().invoke(app_, [*args, "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    lines_a = (tmp_path / "a" / "problems.jsonl").read_text().splitlines()
    lines_b = (tmp_path / "b" / "problems.jsonl").read_text().splitlines()
    assert [json.loads(x)["responses"] for x in lines_a] == [json.loads(x)["responses"] for x in lines_b]


def test_a_response_budget_beyond_the_context_is_capped(tmp_path: Path) -> None:
    from reference_trainer.engine.config import SamplingParams
    from rlbench.eval.backends import ReferenceBackend

    backend = ReferenceBackend(_tiny_model(tmp_path / "model"))  # a 512-token context
    prompts = ["What is 1 + 1?", "x" * 400]  # the second must be cut to leave the response room
    params = [SamplingParams(temperature=1.0, max_tokens=1024, seed=i, ignore_eos=True) for i in range(2)]
    outs = backend.generate(prompts, params)
    # Responses run to the context's end: far past half of it for the short prompt, and for the long one
    # exactly the half the cut prompt left (decoded chars <= tokens: special ids decode to nothing).
    assert 400 < len(outs[0]) <= 512 - len("What is 1 + 1?")
    assert 200 < len(outs[1]) <= 256 and backend.truncated_prompts == 1
