"""Metrics from small hand-built traces; every expected value is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from reference_trainer.trace import metrics


def eng(kind, step, t0, t1, slots, cap, tokens, worker=0, **extra):
    return {
        "kind": kind,
        "step": step,
        "t_start": t0,
        "t_end": t1,
        "active_slots": len(slots),
        "capacity": cap,
        "tokens": tokens,
        "worker": worker,
        "slots": {str(k): v for k, v in slots.items()},
        **extra,
    }


def phase(kind, step, t0, t1, **extra):
    return {"kind": kind, "step": step, "t_start": t0, "t_end": t1, **extra}


def seq(sid, step, n, t_finish, status="finished", versions=None, prompt="p0", drafted=0, accepted=0):
    return {
        "kind": "sequence",
        "id": sid,
        "prompt_id": prompt,
        "sample": 0,
        "prompt_tokens": 4,
        "response_tokens": n,
        "t_admit": 0.0,
        "t_finish": t_finish,
        "policy_versions": versions,
        "drafted": drafted,
        "accepted": accepted,
        "status": status,
        "step": step,
    }


def one_worker_trace():
    # capacity 2; rollout [0, 4]; decode steps: 2 slots for 1 s, then 1 slot for 1 s twice; idle [3, 4].
    return [
        phase("rollout", 0, 0.0, 4.0, policy_version=3),
        eng("decode", 0, 0.0, 1.0, {0: "a", 1: "b"}, 2, 2),
        eng("decode", 0, 1.0, 2.0, {1: "b"}, 2, 1),
        eng("decode", 0, 2.0, 3.0, {1: "b"}, 2, 1),
        seq("a", 0, 1, 1.0, versions=[3]),
        seq("b", 0, 3, 3.0, versions=[2, 3, 3]),
        phase("reward", 0, 4.0, 4.5, reward_mean=0.5, accuracy=0.25),
        phase("update", 0, 4.5, 6.0, policy_version=3, loss=0.125),
    ]


def test_single_worker_by_hand():
    (s,) = metrics.step_metrics(one_worker_trace())
    # slot-time = 2*1 + 1*1 + 1*1 = 4; capacity * wall = 2 * 4 = 8
    assert s["bubble_ratio"] == pytest.approx(0.5)
    assert s["rollout_tokens_per_s"] == pytest.approx(4 / 4)
    assert s["step_time_s"] == pytest.approx(6.0)
    assert s["timing_s/gen"] == pytest.approx(4.0)
    assert s["timing_s/reward"] == pytest.approx(0.5)
    assert s["timing_s/update"] == pytest.approx(1.5)
    # 2 finished; ceil(0.9*2) = 2nd finish at t=3; tail = (4 - 3) / 4
    assert s["tail_time_share"] == pytest.approx(0.25)
    assert s["acceptance_rate"] is None and s["mean_accepted_len"] is None
    assert s["draft_coverage"] == 0.0
    # update at version 3: a's token 0 stale; b's tokens 1, 0, 0
    assert s["staleness"] == {"0": 3, "1": 1}
    assert s["reward_mean"] == 0.5 and s["accuracy"] == 0.25 and s["loss"] == 0.125
    assert s["response_len_mean"] == 2.0 and s["response_len_max"] == 3
    assert s["update_batch_lengths"] == [1, 3]
    assert s["worker_idle_share"] == {"0": 0.0}


def test_summary_is_ratio_of_sums_over_steps():
    trace = one_worker_trace()
    # step 1: rollout [10, 11], both slots busy the whole time -> bubble 0; 4 tokens in 1 s
    trace += [phase("rollout", 1, 10.0, 11.0), eng("decode", 1, 10.0, 11.0, {0: "c", 1: "d"}, 2, 4)]
    out = metrics.compute(trace)
    s0, s1 = out["steps"]
    assert s1["bubble_ratio"] == pytest.approx(0.0)
    # overall: 1 - (4 + 2) / (2*4 + 2*1) = 0.4, not the mean of 0.5 and 0
    assert out["summary"]["bubble_ratio"] == pytest.approx(0.4)
    assert out["summary"]["rollout_tokens_per_s"] == pytest.approx(8 / 5)
    assert out["summary"]["staleness_mean"] == pytest.approx(1 / 4)
    assert out["summary"]["bubble_ratio_gpu"] is None


def test_two_workers_capacity_summed_and_idle_share():
    trace = [
        phase("rollout", 0, 0.0, 2.0),
        eng("decode", 0, 0.0, 2.0, {0: "a", 1: "b"}, 2, 4, worker=0),
        eng("decode", 0, 0.0, 1.0, {0: "c"}, 2, 1, worker=1),
        # step 1: worker 1 gets no work at all; its 2 slots still count as idle capacity
        phase("rollout", 1, 3.0, 4.0),
        eng("decode", 1, 3.0, 4.0, {0: "d", 1: "e"}, 2, 2, worker=0),
    ]
    out = metrics.compute(trace)
    s0, s1 = out["steps"]
    # step 0: slot-time 2*2 + 1*1 = 5 over (2+2) * 2 = 8
    assert s0["bubble_ratio"] == pytest.approx(1 - 5 / 8)
    assert s0["worker_idle_share"] == {"0": 0.0, "1": pytest.approx(0.5)}
    # step 1: 2*1 over 4*1
    assert s1["bubble_ratio"] == pytest.approx(0.5)
    assert s1["worker_idle_share"] == {"0": 0.0, "1": pytest.approx(1.0)}
    assert out["summary"]["bubble_ratio"] == pytest.approx(1 - 7 / 12)
    # busy w0 = 3, w1 = 1; slowest per step 2 + 1 = 3
    assert out["summary"]["worker_idle_share"] == {"0": 0.0, "1": pytest.approx(2 / 3)}


def test_speculative_metrics_from_verify_events():
    trace = [
        phase("rollout", 0, 0.0, 2.0),
        eng("decode", 0, 0.0, 1.0, {0: "a", 1: "b"}, 2, 2),
        # two sequences drafted 6 tokens, 3 accepted; emitted 3 accepted + 2 bonus = 5
        eng("verify", 0, 1.0, 2.0, {0: "a", 1: "b"}, 2, 5, drafted=6, accepted=3, draft_seqs=2),
        # sequence events disagree on purpose: verify events take precedence when they carry drafts
        seq("a", 0, 4, 2.0, drafted=100, accepted=1),
    ]
    (s,) = metrics.step_metrics(trace)
    assert s["acceptance_rate"] == pytest.approx(0.5)
    assert s["mean_accepted_len"] == pytest.approx(2.5)
    assert s["draft_coverage"] == pytest.approx(2 / 4)


def test_acceptance_falls_back_to_sequence_events():
    trace = [
        phase("rollout", 0, 0.0, 1.0),
        eng("verify", 0, 0.0, 1.0, {0: "a"}, 1, 3),
        seq("a", 0, 3, 1.0, drafted=4, accepted=1),
    ]
    (s,) = metrics.step_metrics(trace)
    assert s["acceptance_rate"] == pytest.approx(0.25)
    assert s["mean_accepted_len"] == pytest.approx(3.0)


def test_tail_time_share_ten_sequences():
    # finishes at 1..10 s, rollout [0, 20]: the 9th finish (t=9) marks 90%, so the tail is (20 - 9) / 20
    trace = [phase("rollout", 0, 0.0, 20.0)] + [seq(f"s{i}", 0, 1, float(i)) for i in range(1, 11)]
    trace.append(seq("dropped", 0, 1, None, status="aborted"))
    (s,) = metrics.step_metrics(trace)
    assert s["tail_time_share"] == pytest.approx(11 / 20)
    assert s["sequences"] == {"aborted": 1, "finished": 10}


def test_staleness_null_versions_uses_rollout_version_or_counts_unknown():
    trace = [
        phase("rollout", 0, 0.0, 1.0, policy_version=5),
        seq("a", 0, 4, 1.0, versions=None),
        seq("cached", 0, 7, None, status="cached", versions=[1] * 7),  # not consumed: ignored
        phase("update", 0, 1.0, 2.0, policy_version=7),
    ]
    (s,) = metrics.step_metrics(trace)
    assert s["staleness"] == {"2": 4} and s["staleness_unknown_tokens"] == 0
    trace[0] = phase("rollout", 0, 0.0, 1.0)
    (s,) = metrics.step_metrics(trace)
    assert s["staleness"] == {} and s["staleness_unknown_tokens"] == 4


def test_step_without_rollout_phase_uses_engine_span():
    trace = [eng("decode", 0, 1.0, 2.0, {0: "a"}, 2, 1), eng("decode", 0, 3.0, 4.0, {0: "a"}, 2, 1)]
    (s,) = metrics.step_metrics(trace)
    assert s["timing_s/gen"] == pytest.approx(3.0)
    assert s["bubble_ratio"] == pytest.approx(1 - 2 / 6)


def test_gpu_bubble_from_samples_inside_rollout():
    gpu = {
        "available": True,
        "samples": [
            {"t": 0.5, "gpu": 0, "util": 40},
            {"t": 3.5, "gpu": 0, "util": 60},
            {"t": 5.0, "gpu": 0, "util": 100},  # during the update: not part of the rollout bubble
        ],
    }
    out = metrics.compute(one_worker_trace(), gpu)
    assert out["steps"][0]["bubble_ratio_gpu"] == pytest.approx(0.5)
    assert out["summary"]["bubble_ratio_gpu"] == pytest.approx(0.5)
    out = metrics.compute(one_worker_trace(), {"available": False, "reason": "no driver"})
    assert out["summary"]["bubble_ratio_gpu"] is None
