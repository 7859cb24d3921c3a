"""Embedded tasks: deterministic problem generators, SFT traces and reward functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The `X as X` imports are this package's re-exports (tests and commands import them from here).
from reference_trainer.tasks.arith import ArithOptions as ArithOptions
from reference_trainer.tasks.arith import ArithTask
from reference_trainer.tasks.base import Problem as Problem
from reference_trainer.tasks.base import Task, TaskOptions
from reference_trainer.tasks.kk import KKOptions as KKOptions
from reference_trainer.tasks.kk import KKTask
from reference_trainer.tasks.kk import parse_compact_assignment as parse_compact_assignment

TASKS: dict[str, type] = {ArithTask.name: ArithTask, KKTask.name: KKTask}

# What a run's task is when --task-option says nothing else: each task class's `run_options`.
RUN_TASK_OPTIONS: dict[str, dict[str, Any]] = {name: dict(cls.run_options) for name, cls in TASKS.items()}


def task_class(name: str) -> type:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def task_options(name: str, values: Mapping[str, Any]) -> TaskOptions:
    """The task's options record from `values` (a config's `task_options`): a ValueError naming a key the
    task does not take, else the record's own one-line check."""
    record = task_class(name).Options
    if unknown := [k for k in values if k not in record.__dataclass_fields__]:
        raise ValueError(f"takes no option {unknown[0]!r}")
    return record(**values)


def get_task(name: str, **values: Any) -> Task:
    """A registered task by name, given its options record built from `values`."""
    return task_class(name)(task_options(name, values))


def response_budget(name: str) -> int:
    """The task's default response length in tokens (what --max-tokens falls back to)."""
    return task_class(name).max_response_tokens
