"""A nano-vllm style rollout engine: continuous batching over fixed slots with a preallocated KV cache.

It knows nothing of RL: requests in, tokens and log-probs out, one trace event per step.
"""

from reference_trainer.engine.engine import Engine
from reference_trainer.engine.protocol import RequestEngine, RolloutEngine
from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.engine.trace import Trace

__all__ = ["Engine", "RequestEngine", "RolloutEngine", "Sequence", "SequenceStatus", "Trace"]
