"""What a reproduction runner receives (Context) and returns (Outcome)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_trainer.model.embedded import label
from reference_trainer.trace.records import read_json, write_json
from reference_trainer.train.config import TrainConfig


@dataclass
class Context:
    device: str  # "cpu" or "cuda"
    quick: bool  # the CPU-sized version (every reproduction's `--quick`)
    model: str | None  # a model dir or name; None: the embedded default model
    work_dir: Path  # this reproduction's scratch: runs and traces, kept so a killed run resumes
    seed: int = 0
    progress: Callable[[str], None] = print

    def model_label(self) -> str:
        """The model as results record it: the name or directory given, else the embedded weights' label."""
        return self.model or label()

    def pick(self, full: Any, quick: Any) -> Any:
        """The full-size setting, or the quick one under --quick."""
        return quick if self.quick else full

    def finished(self, name: str, key: Any, what: str) -> Any | None:
        """What a finished run saved as work_dir/<name> for the same workload `key`, or None: a rerun of a
        killed or repeated reproduction reuses it instead of training again."""
        path = self.work_dir / name
        saved = read_json(path) if path.is_file() else {}
        if saved.get("workload") == as_json(key) and "result" in saved:
            self.progress(f"reusing the finished {what}")
            return saved["result"]
        return None

    def finish(self, name: str, key: Any, result: Any) -> Any:
        """Save a finished run's `result` as work_dir/<name> under its workload `key` (see `finished`)."""
        write_json(self.work_dir / name, {"workload": key, "result": result})
        return result


def quiet_config(lr: float | None = None, micro_batch_size: int | None = None, **fields: Any) -> TrainConfig:
    """A reproduction's run: neither evaluated nor checkpointed on the way (Context.finish keeps finished
    runs whole), with GRPO's learning rate and micro-batch where given (None: the trainer's)."""
    config = TrainConfig(**fields, eval_every=0, checkpoint_every=10**9)
    if lr is not None:
        config.grpo.lr = lr
    if micro_batch_size is not None:
        config.grpo.micro_batch_size = micro_batch_size
    return config


def as_json(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists), so a saved workload compares equal to the
    one that wrote it."""
    return json.loads(json.dumps(value))


@dataclass
class Outcome:
    # Numbers the verdict rule reads (spec.toml [verdict] names them) and the page shows; flat keys.
    measured: dict[str, Any]
    config: dict[str, Any]  # the workload as run: enough to repeat it
    seeds: list[int]
    # HTML sections: (heading, parts), a part being an HTML string or a plotly figure
    sections: list[tuple[str, list[Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a reader must know to interpret the numbers
    # the raw numbers behind the plots (small), kept in result.json
    data: dict[str, Any] = field(default_factory=dict)
