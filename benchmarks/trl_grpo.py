"""A TRL GRPOTrainer run measured by rlbench.integrations.trl, on the CPU, with nothing downloaded.

    python -m benchmarks.trl_grpo [--steps 8] [--max-completion 64] [--out runs/trl-grpo]

A tiny random Llama and a character tokenizer are made in-process; the task's reward counts the letter "a".
The recorder (with the length probe and wrap_generation) writes OUT/{trace.jsonl, lengths.jsonl,
metrics.json, report.html}; the what-if replays the run's lengths at --workers. Prints one JSON line and
writes benchmarks/results/trl_grpo.json (TRL's own per-step figures beside rlbench's) and the run's length
log, benchmarks/results/trl_grpo_lengths.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import write_json, write_text

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh", "ghb", "hca"]


def build_trainer(out: Path, recorder: Any, steps: int, max_completion: int = 12, prompts: int = 2,
                  group_size: int = 4, seed: int = 0, **grpo: Any) -> Any:  # fmt: skip
    """A GRPOTrainer over a tiny random Llama (1 layer, hidden 32) and a character tokenizer, on the CPU,
    `prompts` x `group_size` samples per step, with the recorder's probe as a weight-0 second reward.
    `grpo`: more GRPOConfig fields (log_completions=True, ...)."""
    import torch
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate("abcdefgh ")}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    specials = {"unk_token": "<unk>", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **specials)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip

    def count_a(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(c.count("a")) for c in completions]

    # TRL turns gradient checkpointing on by default under the old name, which transformers 5 renamed
    # `activation_checkpointing` (a FutureWarning at every config): the same setting, under the name the
    # installed transformers has.
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = (
        "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    )
    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=prompts * group_size,
                      num_generations=group_size, max_completion_length=max_completion, max_steps=steps,
                      use_cpu=True, logging_steps=1, report_to="none", save_strategy="no", learning_rate=1e-3,
                      bf16=False, reward_weights=[1.0, 0.0], seed=seed, **{checkpointing: True},
                      **grpo)  # fmt: skip
    data = Dataset.from_dict({"prompt": PROMPTS * (steps * prompts // len(PROMPTS) + 1)})
    return GRPOTrainer(model=LlamaForCausalLM(config), reward_funcs=[count_a, recorder.probe], args=args,
                       train_dataset=data, processing_class=tokenizer, callbacks=[recorder])  # fmt: skip


def main() -> None:
    from rlbench.integrations.trl import RLBenchRecorder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-completion", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--workers", default="1,8,64,512,4096")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "trl-grpo")
    args = parser.parse_args()
    import trl

    recorder = RLBenchRecorder(args.out, whatif_workers=tuple(int(w) for w in args.workers.split(",")))
    trainer = build_trainer(
        args.out, recorder, args.steps, args.max_completion, args.prompts, args.group_size
    )
    recorder.wrap_generation(trainer)
    trainer.train()
    doc = json.loads((args.out / "metrics.json").read_text())
    s = doc["summary"]
    result = {
        "command": f"python -m benchmarks.trl_grpo --steps {args.steps} --max-completion "
        f"{args.max_completion} --prompts {args.prompts} --group-size {args.group_size} "
        f"--workers {args.workers}",
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, CPU",
        "trl": trl.__version__,
        "summary": {
            k: s[k]
            for k in (
                "steps",
                "bubble_ratio",
                "tail_time_share",
                "step_time_s",
                "timing_s/gen",
                "timing_s/update",
                "response_len_mean",
                "response_len_max",
            )
        },  # fmt: skip
        "length_variance": doc["integration"]["length_variance"],
        "per_step": doc["integration"]["per_step"],
        "whatif": doc["whatif"],
    }
    write_json(ROOT / "benchmarks" / "results" / "trl_grpo.json", result)
    # the run's length log, for `rlbench import lengths` (docs/integrations.md) without re-running TRL
    write_text(
        ROOT / "benchmarks" / "results" / "trl_grpo_lengths.jsonl", (args.out / "lengths.jsonl").read_text()
    )
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
