"""Embedded tasks: deterministic problem generators, SFT traces and reward functions."""

from __future__ import annotations

from typing import Any

from reference_trainer.tasks.arith import ArithTask
from reference_trainer.tasks.base import Problem, Task, final_answer_section
from reference_trainer.tasks.kk import KKTask, parse_kk_assignment

TASKS: dict[str, type] = {ArithTask.name: ArithTask, KKTask.name: KKTask}


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate a registered task by name; constructor knobs go through `kwargs`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)


__all__ = [
    "TASKS",
    "ArithTask",
    "KKTask",
    "Problem",
    "Task",
    "final_answer_section",
    "get_task",
    "parse_kk_assignment",
]
