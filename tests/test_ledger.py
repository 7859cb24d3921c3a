"""The wait shares, the bound label and the bias and starvation ledger (docs/metrics.md), on hand-built
traces whose values are worked out by hand."""

from __future__ import annotations

import pytest

from reference_trainer.trace import ledger, metrics


def _phase(kind, step, t0, t1, **extra):
    return {"kind": kind, "step": step, "t_start": t0, "t_end": t1, **extra}


def _seq(step, sid, n, status="finished", index=0, admit=0, reward=None, reason="eos", versions=None):
    return {"kind": "sequence", "step": step, "id": sid, "prompt_id": f"p{index}", "sample": 0,
            "prompt_tokens": 3, "response_tokens": n, "t_admit": None, "t_finish": None, "status": status,
            "finish_reason": reason, "policy_versions": versions, "prompt_index": index,
            "admit_version": admit, "reward": reward}  # fmt: skip


def test_a_synchronous_step_waits_out_the_other_sides_phase():
    """The update waits for the whole rollout (4 s); the engine for the rest of the 10 s step."""
    events = [
        _phase("rollout", 0, 0.0, 4.0, policy_version=0),
        _phase("reward", 0, 4.0, 5.0),
        _phase("update", 0, 5.0, 9.0, policy_version=0),
        _phase("sync", 0, 9.0, 10.0),
    ]
    step = metrics.step_metrics(events)[0]
    assert step["step_time_s"] == 10.0
    assert (step["trainer_wait_s"], step["rollout_wait_s"]) == (4.0, 6.0)
    summary = metrics.summary(events)
    assert summary["trainer_wait_share"] == pytest.approx(0.4)
    assert summary["rollout_wait_share"] == pytest.approx(0.6)
    # A synchronous run is labelled by its idle shares (as rlbench audit labels any run): without engine
    # events its rollout's idle share is unknown, so no label; its wait shares would say sync-overhead.
    assert summary["bound"] is None and not summary["run_ahead"]
    assert (
        metrics.bound_label(summary["trainer_wait_share"], summary["rollout_wait_share"]) == "sync-overhead"
    )


def test_a_step_run_ahead_is_the_trainers_span_and_its_traced_waits():
    """Step 1's rollout (side rollout) ran during step 0 and does not stretch step 1, which is its trainer
    wait (1 s), reward, update and sync: 7 s. Before it the rollout waited 1 s (for weights or room)."""
    side = {"side": "rollout"}
    events = [
        _phase("trainer_wait", 0, 0.0, 3.0),
        _phase("rollout", 0, 0.0, 3.0, policy_version=0, **side),
        _phase("update", 0, 3.0, 8.0, policy_version=0),
        _phase("sync", 0, 8.0, 9.0),
        _phase("rollout_wait", 1, 3.0, 4.0, **side),
        _phase("rollout", 1, 4.0, 6.0, policy_version=0, **side),
        _phase("trainer_wait", 1, 9.0, 10.0),
        _phase("reward", 1, 10.0, 11.0),
        _phase("update", 1, 11.0, 15.0, policy_version=1),
        _phase("sync", 1, 15.0, 16.0),
    ]
    steps = {s["step"]: s for s in metrics.step_metrics(events)}
    assert steps[1]["step_time_s"] == 7.0 and steps[1]["timing_s/gen"] == 2.0
    assert (steps[1]["trainer_wait_s"], steps[1]["rollout_wait_s"]) == (1.0, 1.0)
    summary = metrics.summary(events)
    assert summary["trainer_wait_share"] == pytest.approx(4.0 / 16.0)
    assert summary["rollout_wait_share"] == pytest.approx(1.0 / 16.0)
    assert summary["bound"] == "rollout-bound"


@pytest.mark.parametrize(
    ("trainer", "rollout", "label"),
    [(0.5, 0.05, "rollout-bound"), (0.05, 0.5, "trainer-bound"), (0.1, 0.1, "balanced"),
     (0.4, 0.6, "sync-overhead"), (None, 0.5, None)],
)  # fmt: skip
def test_the_bound_label_rule(trainer, rollout, label):
    assert metrics.bound_label(trainer, rollout) == label


def test_ks_distance_by_hand():
    assert ledger.ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ledger.ks_distance([1, 2], [3, 4]) == 1.0
    assert ledger.ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == pytest.approx(0.5)
    assert ledger.ks_distance([], [1]) is None


def _sorted_like_trace():
    """Two steps of a SortedRL-like run over prompts 0-2 (one sample each, for clarity): step 0 trains the
    short prompt 0, aborts prompt 1 at 40 tokens and prompt 2 at 30; step 1 trains prompt 1's regeneration
    (10 tokens) and aborts prompt 2 again at 50. Prompt 2 is never trained."""
    return [
        _phase("update", 0, 0.0, 1.0, policy_version=0),
        _phase("update", 1, 1.0, 2.0, policy_version=1),
        _seq(0, "p0/0", 5, index=0, admit=0, reward=1.0),
        _seq(0, "p1/0", 40, "aborted", index=1, admit=0, reward=0.0, reason="abort"),
        _seq(0, "p2/0", 30, "aborted", index=2, admit=0, reward=0.0, reason="abort"),
        _seq(1, "p1/0#1", 10, index=1, admit=0, reward=1.0),
        _seq(1, "p2/0#1", 50, "aborted", index=2, admit=0, reward=0.0, reason="abort"),
    ]


def test_the_ledger_of_a_run_that_defers_its_long_samples():
    book = ledger.ledger(_sorted_like_trace())
    # trained {5, 10} against generated {5, 40, 30, 10, 50}: the CDFs differ most just past 10 (1 vs 2/5)
    assert book["trained_vs_generated_ks"] == pytest.approx(0.6)
    assert book["long_decile_trained_share"] == 0.0  # the longest generation (50) was not trained
    assert book["oldest_waiting_age"] == {"0": 0, "1": 1}  # prompt 2 (and 1) admitted at version 0
    assert book["reward_completed"] == 1.0 and book["reward_all"] == pytest.approx(2.0 / 5.0)
    assert book["trained_lengths_by_prompt"] == {"0": [5], "1": [10]}
    summary = metrics.summary(_sorted_like_trace())
    assert summary["oldest_waiting_age_max"] == 1 and summary["long_decile_trained_share"] == 0.0


def test_a_synchronous_run_trains_what_it_generates():
    events = [_phase("update", 0, 0.0, 1.0, policy_version=0)]
    events += [_seq(0, f"p{i}/0", 10 * (i + 1), index=i, admit=0, reward=float(i % 2)) for i in range(10)]
    book = ledger.ledger(events)
    assert book["trained_vs_generated_ks"] == 0.0 and book["long_decile_trained_share"] == 1.0
    assert book["oldest_waiting_age"] == {"0": 0}
    assert book["reward_completed"] == book["reward_all"] == 0.5


def test_a_kept_partial_at_the_end_is_left_out_and_same_prompts_compare():
    events = _sorted_like_trace() + [_seq(1, "p3/0", 70, "cached", index=3, admit=1, reason=None)]
    assert ledger.ledger(events)["long_decile_trained_share"] == 0.0  # 70 has no known fate: not counted
    assert ledger.ledger(events)["generations"] == 5
    # kept at step 0 and never seen again: given up (regenerated), so generated and not trained
    given_up = _sorted_like_trace() + [_seq(0, "p4/0", 90, "cached", index=4, admit=0, reason=None)]
    assert ledger.ledger(given_up)["generations"] == 6
    baseline = {"0": [5], "1": [60], "2": [80]}
    mine = ledger.ledger(events)["trained_lengths_by_prompt"]
    assert ledger.same_prompts_ks(mine, baseline) == 0.5  # over prompts 0 and 1: {5, 10} vs {5, 60}
