"""Embedded tasks: deterministic problem generators, SFT traces and reward functions."""

from __future__ import annotations

from typing import Any

from reference_trainer.tasks.arith import ArithTask
from reference_trainer.tasks.base import Problem, Task, final_answer_section
from reference_trainer.tasks.kk import KKTask, parse_compact_assignment

TASKS: dict[str, type] = {ArithTask.name: ArithTask, KKTask.name: KKTask}

# What a run's task is when --task-option says nothing else: each task class's `run_options`.
RUN_TASK_OPTIONS: dict[str, dict[str, Any]] = {name: dict(cls.run_options) for name, cls in TASKS.items()}


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate a registered task by name; constructor knobs go through `kwargs`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)


def response_budget(name: str) -> int:
    """The task's default response length in tokens (what --max-tokens falls back to)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name].max_response_tokens


__all__ = [
    "RUN_TASK_OPTIONS",
    "TASKS",
    "ArithTask",
    "KKTask",
    "Problem",
    "Task",
    "final_answer_section",
    "get_task",
    "parse_compact_assignment",
    "response_budget",
]
