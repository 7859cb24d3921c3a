"""rlbench: find and remove rollout bubbles in LLM reinforcement learning."""

__version__ = "0.1.0"
