"""The GRPO loop end to end at tiny shapes: logs, trace, checkpoints and exact resume after a kill."""

from __future__ import annotations

import json

import pytest
import torch

from reference_trainer.errors import UserError
from reference_trainer.model.loader import load_model
from reference_trainer.trace.records import read_jsonl
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.rows import TIMING_FIELDS
from reference_trainer.train.trainer import Trainer


def tiny_config(model_dir, steps: int, **kw) -> TrainConfig:
    kw.setdefault("task", "arith")
    kw.setdefault("eval_every", 0)
    config = TrainConfig(
        steps=steps,
        model=str(model_dir),
        prompts_per_step=2,
        group_size=3,
        max_tokens=16,
        max_num_seqs=4,
        max_model_len=256,
        checkpoint_every=2,
        **kw,
    )
    config.grpo.lr = 1e-2
    config.grpo.micro_batch_size = 4
    return config


class Killed(Exception):
    pass


def test_training_writes_logs_trace_and_checkpoints(tiny_model_dir, tmp_path):
    rows = Trainer(tiny_config(tiny_model_dir, 3), tmp_path).run()
    assert [r["step"] for r in rows] == [0, 1, 2]
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in logged] == [0, 1, 2]
    for row in logged:
        assert row["samples"] == 6 and 0.0 <= row["reward_mean"] <= 1.0
        assert row["step_time_s"] >= row["timing_s/gen"] > 0
        assert 1 <= row["response_len_mean"] <= row["response_len_max"] <= 16
    events = read_jsonl(tmp_path / "trace.jsonl")
    kinds = {e["kind"] for e in events}
    assert {"rollout", "reward", "update", "sync", "prefill", "decode", "sequence"} <= kinds
    assert sum(e["kind"] == "sequence" for e in events) == 18
    for step in range(3):  # every engine step falls inside its step's rollout phase
        rollout = next(e for e in events if e["kind"] == "rollout" and e["step"] == step)
        for e in events:
            if e["kind"] in ("prefill", "decode") and e["step"] == step:
                assert rollout["t_start"] <= e["t_start"] <= e["t_end"] <= rollout["t_end"]
    ckpt = tmp_path / "checkpoints" / (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert ckpt.name == "step-000003"
    model = load_model(ckpt)  # a checkpoint is a usable model directory
    initial = load_model(tiny_model_dir)
    if all(r["reward_mean"] == 0 for r in logged):  # all groups equal: GRPO must not move the weights
        assert torch.equal(model.lm_head.weight, initial.lm_head.weight)


def test_updates_move_weights_and_sync_the_engine(tiny_model_dir, tmp_path, toy_task):
    trainer = Trainer(tiny_config(tiny_model_dir, 2, task=toy_task), tmp_path)
    rows = trainer.run()
    assert any(0 < r["reward_mean"] < 1 for r in rows)
    initial = load_model(tiny_model_dir)
    assert not torch.equal(trainer.policy.lm_head.weight, initial.lm_head.weight)
    engine_weights = trainer.engine.model.state_dict()
    for name, value in trainer.policy.state_dict().items():
        assert torch.equal(engine_weights[name], value), name
    assert trainer.engine.policy_version == 2


def test_resume_after_kill_reproduces_uninterrupted_run(tiny_model_dir, tmp_path, toy_task):
    straight = Trainer(tiny_config(tiny_model_dir, 5, task=toy_task), tmp_path / "straight")
    straight.run()

    def kill_after_step_2(row):
        if row["step"] == 2:
            raise Killed  # step 2 logged, and no checkpoint holds it (they follow 2 and 4 finished steps)

    with pytest.raises(Killed):
        Trainer(tiny_config(tiny_model_dir, 5, task=toy_task), tmp_path / "killed").run(kill_after_step_2)
    assert len(read_jsonl(tmp_path / "killed" / "metrics.jsonl")) == 3
    resumed = Trainer(tiny_config(tiny_model_dir, 5, task=toy_task), tmp_path / "killed", resume=True)
    assert resumed.step == 2 and resumed.stream.next_index == 4
    resumed.run()

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]

    assert strip(read_jsonl(tmp_path / "killed" / "metrics.jsonl")) == strip(
        read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    )
    initial = load_model(tiny_model_dir)
    assert not torch.equal(straight.policy.lm_head.weight, initial.lm_head.weight)
    for name, param in straight.policy.state_dict().items():
        assert torch.equal(param, resumed.policy.state_dict()[name]), name
    trace_steps = [
        e["step"] for e in read_jsonl(tmp_path / "killed" / "trace.jsonl") if e["kind"] == "rollout"
    ]
    assert trace_steps == [0, 1, 2, 3, 4]


def test_run_config_round_trips(tiny_model_dir, tmp_path):
    from reference_trainer.train.config import load_run_config

    config = tiny_config(tiny_model_dir, 2, task_options={"max_ops": 6})
    Trainer(config, tmp_path)
    assert load_run_config(tmp_path) == config
    assert json.loads((tmp_path / "train_config.json").read_text())["grpo"]["lr"] == 1e-2


# ---- one source of truth for the sampling distribution (temperature, top-p) ------------------------------


def test_update_scores_tokens_at_the_rollout_temperature(tiny_model_dir, tmp_path):
    """At T = 0.6 the recomputed old log-probs of freshly sampled tokens are the engine's sampling
    log-probs, so the first PPO ratio is exactly 1 (before the fix the update scored them at T = 1)."""
    trainer = Trainer(tiny_config(tiny_model_dir, 1, temperature=0.6), tmp_path)
    assert trainer.updater.temperature == 0.6
    batch, *_ = trainer._score(trainer.strategy.collect(trainer.ctx))
    micro_batches = trainer.updater.prepare(batch)
    recomputed = [
        row[: int(n)].tolist()
        for mb in micro_batches
        for row, n in zip(mb.old_logprobs, mb.response_lens, strict=True)
    ]
    assert sum(map(len, recomputed)) > 10
    for ours, engine in zip(recomputed, batch.old_logprobs, strict=True):
        assert ours == pytest.approx(engine, abs=1e-4)
    stats = trainer.updater.compute_gradients(micro_batches)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-8)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temperature": 0.6, "grpo_temperature": 1.0}, "differs from the rollout temperature"),
        ({"temperature": 0.0}, "temperature > 0"),
        ({"top_p": 0.9}, "top_p 0.9 is not supported for training"),
    ],
)
def test_config_refuses_a_sampling_distribution_the_update_does_not_score(
    tiny_model_dir, tmp_path, changes, message
):
    grpo_temperature = changes.pop("grpo_temperature", None)
    config = tiny_config(tiny_model_dir, 1, **changes)
    config.grpo.temperature = grpo_temperature
    with pytest.raises(UserError, match=message):
        Trainer(config, tmp_path)


def test_cli_refuses_top_p_for_training_in_one_line():
    from reference_trainer.errors import UserError
    from rlbench.training import build_config

    with pytest.raises(UserError, match="top_p"):
        build_config(mode="baseline", task="arith", top_p=0.5)


# ---- the metrics.jsonl row ------------------------------------------------------------------------------


def test_every_row_field_appears_in_a_real_row(tiny_model_dir, tmp_path, toy_task):
    """Each name of the row schema is in a real row: unconditional ones always, the KL-to-reference and
    TIS ones when their condition holds (kl_coef > 0, an off-policy mode)."""
    from reference_trainer.train.rows import CONDITIONAL_FIELDS, ROW_FIELDS

    plain = Trainer(tiny_config(tiny_model_dir, 1, task=toy_task), tmp_path / "plain").run()[0]
    assert set(ROW_FIELDS) - set(plain) == set(CONDITIONAL_FIELDS)
    config = tiny_config(tiny_model_dir, 2, task=toy_task, mode="sorted-partial", eval_every=1)
    config.eval_problems, config.eval_samples = 4, 2
    config.grpo.kl_coef = 0.01
    rows = Trainer(config, tmp_path / "all").run()
    assert set(ROW_FIELDS) <= set(rows[-1])
    assert all(isinstance(r["actor/ppo_kl"], float) and r["actor/kl_loss"] >= 0 for r in rows)
    assert set(read_jsonl(tmp_path / "all" / "metrics.jsonl")[-1]) == set(rows[-1])


def test_held_out_evaluation_at_step_0_and_every_k_steps(tiny_model_dir, tmp_path):
    """val/* fields measure the policy before the step's rollout at steps 0, K, 2K; heldout.json adds the
    final policy and the samples consumed. The greedy accuracy is that of an independent decode of the same
    weights (the checkpoint) on the same problems."""
    from reference_trainer.model.tokenizer import load_tokenizer
    from reference_trainer.tasks import get_task
    from reference_trainer.train.heldout import HeldOut, held_out_problems

    config = tiny_config(tiny_model_dir, 3, eval_every=2)
    config.eval_problems, config.eval_samples, config.checkpoint_every, config.max_tokens = 6, 2, 3, 24
    rows = Trainer(config, tmp_path).run()
    assert ["val/heldout_greedy_acc" in r for r in rows] == [True, False, True]
    curve = json.loads((tmp_path / "heldout.json").read_text())["curve"]
    assert [(c["step"], c["samples"]) for c in curve] == [(0, 0), (2, 12), (3, 18)]
    for point, row in zip(curve, (rows[0], rows[2]), strict=False):
        assert point["greedy_acc"] == row["val/heldout_greedy_acc"]
        assert point["pass1"] == row["val/heldout_pass1"]
    final = load_model(tmp_path / "checkpoints" / "step-000003")
    task = get_task("arith")
    training = [p.prompt for p in task.problems(config.prompt_pool, seed=config.seed)]
    problems = held_out_problems(task, 6, training)
    again = HeldOut(final, load_tokenizer(tiny_model_dir), task, problems, max_tokens=24).decode(0.0)
    assert curve[-1]["greedy_acc"] == sum(again.correct) / 6


def test_a_held_out_set_that_overlaps_training_is_refused(tiny_model_dir, tmp_path):
    from reference_trainer.tasks import get_task
    from reference_trainer.train.heldout import check_disjoint, held_out_problems

    with pytest.raises(UserError, match="held-out set would be training prompts"):
        Trainer(tiny_config(tiny_model_dir, 1, eval_every=1, heldout_seed=0), tmp_path)
    task = get_task("arith", min_ops=1, max_ops=1)  # few distinct prompts: seeds collide
    training = [p.prompt for p in task.problems(400, seed=0)]
    with pytest.raises(ValueError, match="shares"):
        check_disjoint(task.problems(50, seed=1), training)
    problems = held_out_problems(task, 50, training, seed=1)
    assert len(problems) == 50 and not {p.prompt for p in problems} & set(training)


def test_row_metrics_are_the_profile_metrics_of_the_trace(tiny_model_dir, tmp_path, toy_task):
    """The trace-derived fields of metrics.jsonl equal what reference_trainer.trace.metrics computes from
    trace.jsonl (the numbers `rlbench profile` and `rlbench report` show), and the update consumed what they
    count."""
    from reference_trainer.trace import metrics

    rows = Trainer(tiny_config(tiny_model_dir, 2, task=toy_task, mode="sorted"), tmp_path).run()
    steps = metrics.compute(read_jsonl(tmp_path / "trace.jsonl"))["steps"]
    keys = ("bubble_ratio", "rollout_tokens_per_s", "step_time_s", "tail_time_share", "acceptance_rate")
    for row, step in zip(rows, steps, strict=True):
        assert row["bubble_ratio"] is not None and 0.0 <= row["bubble_ratio"] < 1.0
        for key in keys:
            assert row[key] == step[key], key
        assert row["samples"] == len(step["update_batch_lengths"]) == 6
        assert row["response_len_mean"] == sum(step["update_batch_lengths"]) / 6


def test_a_chat_model_gets_the_chat_style_of_its_task() -> None:
    """A tokenizer with a chat template selects the tasks' natural-language prompts and eval grading,
    unless the run's task options name a style."""
    from dataclasses import replace

    from reference_trainer.model.tokenizer import CharTokenizer
    from reference_trainer.train.assemble import styled_task_options
    from reference_trainer.train.config import TrainConfig

    class ChatTokenizer:
        has_chat_template = True

    config = TrainConfig(task="kk", task_options={"num_people": 3})
    assert styled_task_options(config, ChatTokenizer()) == {"style": "chat", "num_people": 3}
    assert styled_task_options(config, CharTokenizer())["style"] == "compact"
    pinned = replace(config, task_options={"style": "compact"})
    assert styled_task_options(pinned, ChatTokenizer())["style"] == "compact"


def test_the_response_budget_is_the_tasks_unless_set_and_at_least_one_token():
    from reference_trainer.errors import UserError
    from rlbench.training import build_config

    assert build_config(mode="baseline", task="kk").response_tokens == 1000  # a 3-person search fits
    assert build_config(mode="baseline", task="arith").response_tokens == 400
    assert build_config(mode="baseline", task="kk", max_tokens=7).response_tokens == 7
    for bad in (0, -5):
        with pytest.raises(UserError, match="--max-tokens must be in 1..2047"):
            build_config(mode="baseline", task="kk", max_tokens=bad)
