"""Shared run options: defined once in rlbench/options.py, shown by every command that takes them."""

from __future__ import annotations

from dataclasses import fields

import pytest
from typer.testing import CliRunner

from rlbench.cli import app_
from rlbench.options import RunOptions, with_run_options


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("command", ["train", "profile", "compare"])
def test_every_shared_option_is_on_every_run_command(command):
    res = CliRunner().invoke(app_, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for f in fields(RunOptions):
        assert _flag(f.name) in res.output, (command, f.name)


def test_every_shared_option_reaches_the_trainer_config():
    # build_config passes options on by name (lr/kl_coef aside), so each field must name a TrainConfig field;
    # the KEY=VALUE lists become mode_options and task_options.
    from reference_trainer.train.trainer import TrainConfig

    train_fields = {f.name for f in fields(TrainConfig)} | {"mode_option", "task_option"}
    assert {f.name for f in fields(RunOptions)} <= train_fields


def test_decorated_command_gets_one_run_options():
    seen = {}

    @with_run_options
    def command(run: RunOptions, steps: int = 3) -> None:
        seen.update(run=run, steps=steps)

    command(**{f.name: f.default for f in fields(RunOptions)} | {"task": "kk", "steps": 5})
    assert seen == {"run": RunOptions(task="kk"), "steps": 5}
    # every field and the command's own values reach the config that build_config checks and returns
    from rlbench.training import build_config

    config = build_config(**RunOptions(task="kk", group_size=4).config_kwargs(mode="sorted", steps=2))
    assert (config.task, config.mode, config.steps, config.group_size) == ("kk", "sorted", 2, 4)
    assert config.task_options == {"num_people": 3}  # the task's run defaults, as on the CLI
    with pytest.raises(TypeError, match="no `run: RunOptions`"):
        with_run_options(lambda steps=1: None)
