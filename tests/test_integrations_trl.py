"""rlbench.integrations.trl with a real TRL GRPOTrainer on the CPU: a tiny Llama and a character tokenizer
made here, a few steps; the recorder's run folder must agree with what TRL itself logged."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from conftest import cli  # noqa: E402

from reference_trainer.trace import metrics  # noqa: E402
from reference_trainer.trace.records import read_json, read_jsonl  # noqa: E402
from reference_trainer.trace.schema import read_trace  # noqa: E402
from rlbench.integrations.trl import RLBenchRecorder  # noqa: E402

pytestmark = pytest.mark.e2e


def _trainer(out, recorder, steps: int):
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate("abcdefgh ")}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    specials = {"unk_token": "<unk>", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **specials)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip

    def count_a(completions, **kwargs):  # the task's reward: any reward works beside the probe
        return [float(c.count("a")) for c in completions]

    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=12, max_steps=steps, use_cpu=True, logging_steps=1,
                      report_to="none", save_strategy="no", learning_rate=1e-3, bf16=False,
                      reward_weights=[1.0, 0.0], seed=0)  # fmt: skip
    data = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh"] * 4})
    return GRPOTrainer(model=LlamaForCausalLM(config), reward_funcs=[count_a, recorder.probe], args=args,
                       train_dataset=data, processing_class=tok, callbacks=[recorder])  # fmt: skip


def test_a_grpo_run_becomes_an_rlbench_run(tmp_path):
    out = tmp_path / "run"
    recorder = RLBenchRecorder(out, whatif_workers=(1, 2))
    trainer = _trainer(tmp_path, recorder, steps=3)
    recorder.wrap_generation(trainer)
    trainer.train()

    doc = read_json(out / "metrics.json")
    events = read_trace(out / "trace.jsonl")
    assert doc["summary"] == metrics.compute(events)["summary"]  # everything recomputes from the trace
    assert doc["run"]["rollout_timed_by"] == "GRPOTrainer._generate"
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2]
    groups = read_jsonl(out / "lengths.jsonl")
    assert len(groups) == 6 and {len(g["response_tokens"]) for g in groups} == {4}  # 2 prompts x 4, 3 steps
    assert all(g["prompt_tokens"] > 0 for g in groups)  # read from _generate's prompt ids
    for step, row in zip(doc["steps"], doc["integration"]["per_step"], strict=True):
        lengths = [n for g in groups if g["step"] == step["step"] for n in g["response_tokens"]]
        # the probe's lengths are the ones TRL logged
        assert sum(lengths) / len(lengths) == pytest.approx(row["TRL completions/mean_length"])
        assert max(lengths) == row["TRL completions/max_length"]
        # one generation batch decodes together: busy sample-steps over 8 slots x the longest sample
        assert step["bubble_ratio"] == pytest.approx(1 - sum(lengths) / (8 * max(lengths)))
        assert 0 < step["timing_s/gen"] < step["step_time_s"]
        assert step["timing_s/update"] > 0
    assert {r["mode"] for r in doc["whatif"]["results"]} == {
        "baseline",
        "sorted",
        "sorted-partial",
        "histopipe",
    }
    (out / "report.html").unlink()
    res = cli("report", str(out))
    assert res.returncode == 0, res.stderr
    assert "TRL GRPOTrainer" in (out / "report.html").read_text()


def test_without_the_wrapper_the_probe_closes_the_rollout(tmp_path):
    out = tmp_path / "run"
    recorder = RLBenchRecorder(out, slots=4, whatif_workers=(1,))
    _trainer(tmp_path, recorder, steps=2).train()
    doc = read_json(out / "metrics.json")
    assert doc["run"]["rollout_timed_by"] == "length probe"
    assert doc["run"]["slots_per_worker"] == 4
    rollouts = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "rollout"]
    updates = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "update"]
    assert len(rollouts) == len(updates) == 2
    for r, u in zip(rollouts, updates, strict=True):
        assert r["t_end"] == u["t_start"]  # the probe's call ends one and starts the other
    # 8 samples on 4 slots: continuous batching, so some sample waits for a slot
    seqs = [e for e in read_trace(out / "trace.jsonl") if e["kind"] == "sequence" and e["step"] == 0]
    assert len(seqs) == 8 and max(s["t_admit"] for s in seqs) > rollouts[0]["t_start"]
