"""Which function reproduces which claim: `name -> "module:function"`, imported only when run.

The names match the specs (specs/<name>.toml); tests check the two agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from rlbench.reproduce.base import Context, Outcome

RUNNERS = {
    "sortedrl-bubble": "rlbench.reproduce.sortedrl:bubble",
    "sortedrl-throughput": "rlbench.reproduce.sortedrl:throughput",
    "sortedrl-accuracy": "rlbench.reproduce.accuracy:accuracy",
    "rhymerl-length-stability": "rlbench.reproduce.history:length_stability",
    "rhymerl-reuse": "rlbench.reproduce.history:reuse",
    "histospec-lossless": "rlbench.reproduce.lossless:lossless",
    "histospec-speedup": "rlbench.reproduce.histospec:speedup",
    "histopipe-balance": "rlbench.reproduce.histopipe:balance",
    "simulator-scale": "rlbench.reproduce.scale:scale",
    "sortedrl-bubble-smollm2": "rlbench.reproduce.real_model:sortedrl_bubble",
    "sortedrl-throughput-smollm2": "rlbench.reproduce.real_model:sortedrl_throughput",
    "histospec-speedup-smollm2": "rlbench.reproduce.real_model:histospec_speedup",
    "grpo-learning-smollm2": "rlbench.reproduce.real_model:learning",
}


def runner(name: str) -> Callable[[Context], Outcome]:
    module, function = RUNNERS[name].split(":")
    return getattr(importlib.import_module(module), function)
