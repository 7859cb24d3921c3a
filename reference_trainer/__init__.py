"""The compact reference GRPO trainer: model, tokenizers, rollout engine, tasks, loop."""
