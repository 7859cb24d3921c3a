"""A nano-vllm style rollout engine: continuous batching over fixed slots with a preallocated KV cache.

It knows nothing of RL: requests in, tokens and log-probs out, one trace event per step. Import from the
modules (engine.engine, engine.sequence, ...): this package imports nothing, so the engine's checks
(rollout/engines.py check_engine_kind) and config stay importable without torch.
"""
