"""Training: GRPO loss and updater, the loop, checkpoints, SFT warm start."""
