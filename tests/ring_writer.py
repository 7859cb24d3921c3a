"""A writer of a weight ring in a process of its own (tests/test_async.py): publishes versions 0..count-1,
each tensor filled with its version, as fast as it can. Small on purpose: a spawned process imports it."""

from __future__ import annotations

import torch

from reference_trainer.rollout.ring import WeightRing


def template() -> dict[str, torch.Tensor]:
    return {"a": torch.zeros(64, 1024), "b": torch.zeros(3)}


def filled(version: int) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, float(version)) for k, v in template().items()}


def publish(ring: WeightRing, count: int) -> None:
    for version in range(count):
        ring.publish(filled(version), version)
