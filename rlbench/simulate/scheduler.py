"""The modes' schedulers (SimModes built from the mode registry: modes.py), replayed step by step over a
stream of groups on W simulated workers.

A step trains on B complete groups (all samples of a prompt). Which worker runs each new request is the
trainer's own dispatch policy object (reference_trainer/rollout/dispatch.py), called as the trainer calls
it: once per step over the step's new requests (group = the group's uid, work = its predicted length),
against the load the carried work leaves on each worker.
Synchronous modes (baseline, histopipe, rhyme) roll out exactly the step's B groups and wait for the last.
SortedRL keeps ceil(oversub * B) groups outstanding and fires the update when B groups are complete (the
first B to complete: shortest first); on-policy mode drops the rest and regenerates them from scratch
later, partial mode keeps their progress on the worker (resumed with a prefill of prompt + kept tokens
under the new policy), regenerates work older than max_staleness policy versions, and admits new prompts
only behind the kept work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from reference_trainer.rollout.dispatch import DispatchPolicy, EngineLoad, Unit, make_policy
from rlbench.simulate import engine
from rlbench.simulate.cost import CostModel
from rlbench.simulate.jobs import Jobs, Stream
from rlbench.simulate.modes import SimMode
from rlbench.simulate.workload import LengthTrace

__all__ = ["simulate_mode", "spec_rate", "totals"]


def spec_rate(acc: np.ndarray, k: int) -> np.ndarray:
    """Expected tokens per verify forward with k drafted tokens, i.i.d. per-token acceptance (plus bonus)."""
    acc = np.clip(acc, 0.0, 0.999999)
    return (1.0 - acc ** (k + 1)) / (1.0 - acc)


def choose_draft_len(cost: CostModel, acc: float, batch: int, ctx: float, max_k: int = 8) -> int:
    """Draft length (at most max_k) with the most tokens per second at a full batch (cost-aware: it is 0
    where verifying costs more than it saves, as on a CPU)."""
    best, best_k = 1.0 / float(cost.decode(np.array([batch]), np.array([ctx]))[0]), 0
    for k in range(1, max_k + 1):
        rate = float(spec_rate(np.array([acc]), k)[0])
        t = float(cost.decode(np.array([batch]), np.array([ctx]), q=k + 1)[0])
        if rate / t > best * 1.001:
            best, best_k = rate / t, k
    return best_k


def _dispatch(
    policy: DispatchPolicy,
    step: int,
    carried: Jobs,
    uids: np.ndarray,
    work: np.ndarray,
    n_w: int,
    predicted: np.ndarray,
) -> np.ndarray:
    """A worker per new request: the policy's assignment, from the load of the carried requests still
    running (their count and predicted tokens per worker)."""
    live = ~carried.done
    on = carried.worker[live]
    load = EngineLoad(
        np.bincount(on, minlength=n_w).tolist(),
        np.bincount(on, weights=predicted[carried.row[live]], minlength=n_w).astype(float).tolist(),
    )
    policy.begin_step(step)
    units = [Unit(g, w) for g, w in zip(uids.tolist(), work.astype(float).tolist(), strict=True)]
    return np.asarray(policy.assign(units, load), dtype=np.int64)


def _admit(
    policy: DispatchPolicy,
    step: int,
    carried: Jobs,
    new_uids: np.ndarray,
    stream: Stream,
    trace: LengthTrace,
    predicted: np.ndarray,
    n_w: int,
) -> Jobs:
    """The sequences of the groups `new_uids`, each on the worker the policy assigns it."""
    rows, which = stream.expand(new_uids)
    return Jobs(
        rows,
        new_uids[which],
        _dispatch(policy, step, carried, new_uids[which], predicted[rows], n_w, predicted),
        trace.response_tokens[rows],
        trace.prompt_tokens[rows],
        np.zeros(rows.size, dtype=bool),
        np.full(rows.size, -1, dtype=np.int64),
    )


def _queues(jobs: Jobs, keys: np.ndarray, rate: np.ndarray, n_w: int) -> tuple[engine.Queues, np.ndarray]:
    """Pad jobs into per-worker queues ordered by `keys`; returns the queues and each job's position
    (-1 for jobs already done)."""
    w = jobs.worker
    order = np.lexsort((keys, w))
    order = order[~jobs.done[order]]
    counts = np.bincount(w[order], minlength=n_w)
    starts = np.cumsum(counts) - counts
    pos = np.full(len(jobs), -1, dtype=np.int64)
    pos[order] = np.arange(order.size) - starts[w[order]]
    q = max(1, int(counts.max()) if counts.size else 1)
    tokens = np.ones((n_w, q), dtype=np.int64)
    ctx0 = np.zeros((n_w, q))
    rates = np.ones((n_w, q))
    wo, po = w[order], pos[order]
    tokens[wo, po] = jobs.tokens[order]
    ctx0[wo, po] = jobs.ctx0[order]
    rates[wo, po] = rate[order]
    return engine.Queues(tokens, ctx0, rates, counts), pos


def simulate_mode(
    sim_mode: SimMode,
    trace: LengthTrace,
    predicted: np.ndarray,
    acceptance: np.ndarray,
    cost: CostModel,
    workers: int,
    capacity: int,
    steps: int,
    groups_per_step: int | None = None,
    max_prefill_tokens: float = 8192,
    per_worker: bool = False,
) -> dict:
    """Run `steps` RL steps of `policy` on `workers`; per-step dicts and run totals (ratios of sums).
    `per_worker`: each step's row also lists every worker's forward count and the forwards themselves as
    trace-like events (a validation compares them per engine; a sweep at thousands of workers leaves them
    out)."""
    stream = Stream.of(trace)
    n_w = workers
    if n_w == 1:  # as in the trainer, where one worker runs the mode's one-engine strategy: nothing to place
        sim_mode = replace(sim_mode, dispatch="round-robin", order="fifo", migrate=False)
    policy = make_policy(sim_mode.dispatch)
    k = _draft_len(sim_mode, trace, acceptance, cost, capacity)
    rate_of = spec_rate(acceptance, k) if k else np.ones(len(trace))
    box = Box(n_w, capacity, cost, k, max_prefill_tokens, per_worker)
    pos, front, carried = 0, np.zeros(0, dtype=np.int64), Jobs.empty()  # front: groups to redo first
    per_step = []
    for s in range(steps):
        b = groups_per_step or stream.step_groups[s % len(stream.step_groups)]
        carried, stale_waste = _expire_stale(sim_mode, carried, trace, s)
        held = np.unique(carried.uid)
        want = max(b, math.ceil(sim_mode.oversub * b)) - held.size
        fresh = max(0, want - front.size)
        new_uids = np.concatenate([front[:want], np.arange(pos, pos + fresh)])
        front, pos = front[want:], pos + fresh
        jobs = Jobs.cat(carried, _admit(policy, s, carried, new_uids, stream, trace, predicted, n_w))
        keys = _queue_keys(sim_mode, jobs, len(carried), predicted, s)
        rate = rate_of[jobs.row]
        res, qpos = box.run(jobs, keys, rate)
        if sim_mode.migrate and n_w > 1:
            res, qpos = _migrate(box, jobs, keys, rate, res, qpos)
        row, trained, horizon = _account(sim_mode, jobs, qpos, res, trace, b, box, rate)
        row["wasted_tokens"] += stale_waste
        per_step.append(row)
        carried, redo = _carry(sim_mode, jobs, qpos, res, trained, horizon, rate, s)
        front = np.concatenate([redo, front])
    return {
        "policy": sim_mode.name,
        "mode": sim_mode.mode,
        "mode_options": dict(sim_mode.options),
        "workers": n_w,
        "draft_len": k,
        **totals(per_step, n_w),
        "steps": per_step,
    }


def _draft_len(
    sim_mode: SimMode, trace: LengthTrace, acceptance: np.ndarray, cost: CostModel, capacity: int
) -> int:
    """The run's one cost-aware draft length (0: no speculation)."""
    if not sim_mode.spec:
        return 0
    ctx = float(trace.prompt_tokens.mean() + trace.response_tokens.mean() / 2.0)
    return choose_draft_len(cost, float(np.nanmean(acceptance)), capacity, capacity * ctx, sim_mode.max_draft)


def _queue_keys(sim_mode: SimMode, jobs: Jobs, carried: int, predicted: np.ndarray, step: int) -> np.ndarray:
    """Each job's place in its worker's queue: fifo, or carried work first, then new work by predicted
    length (long-first, or alternating by step)."""
    keys = np.arange(len(jobs), dtype=float)
    if sim_mode.order == "fifo":
        return keys
    sign = -1.0 if sim_mode.order == "long-first" or step % 2 == 0 else 1.0
    return np.where(keys < carried, -1e18 + keys, sign * predicted[jobs.row])


@dataclass(frozen=True)
class Box:
    """The simulated cluster of one run: workers, slots per worker, cost, draft length, prefill limit."""

    n_w: int
    capacity: int
    cost: CostModel
    k: int
    max_prefill_tokens: float
    per_worker: bool = False

    def run(self, jobs: Jobs, keys: np.ndarray, rate: np.ndarray) -> tuple[engine.Result, np.ndarray]:
        queues, qpos = _queues(jobs, keys, rate, self.n_w)
        q = float(self.k + 1)
        return engine.run(queues, self.capacity, self.cost, q, self.max_prefill_tokens), qpos


def _migrate(
    box: Box,
    jobs: Jobs,
    keys: np.ndarray,
    rate: np.ndarray,
    res: engine.Result,
    qpos: np.ndarray,
    passes: int = 3,
) -> tuple[engine.Result, np.ndarray]:
    """Straggler migration: work the slowest workers had not started by the time the fastest went idle
    moves to the fastest (half of it, from the queue's tail); kept only when the makespan drops."""
    n_w = box.n_w
    for _ in range(passes):
        end = res.end_t
        order = np.argsort(end, kind="stable")
        pairs = max(1, n_w // 4)
        fast, slow = order[:pairs], order[::-1][:pairs]
        ok = end[slow] > end[fast]
        target = np.full(n_w, -1)
        target[slow[ok]] = fast[ok]
        deadline = np.full(n_w, np.inf)
        deadline[slow[ok]] = end[fast[ok]]
        w = jobs.worker
        admit = np.where(qpos >= 0, res.admit_t[w, np.maximum(qpos, 0)], -np.inf)
        late = (target[w] >= 0) & (admit > deadline[w])
        n_late = np.bincount(w[late], minlength=n_w)
        # of each slow worker's late jobs, the back half of its queue moves
        rank_from_end = np.where(late, _rank_desc(w, qpos, late), -1)
        move = late & (rank_from_end < n_late[w] // 2)
        if not move.any():
            break
        new_w = np.where(move, target[w], w)
        new_keys = np.where(move, 1e18 + keys, keys)
        cand, cpos = box.run(replace(jobs, worker=new_w), new_keys, rate)
        if cand.end_t.max() >= res.end_t.max():
            break
        jobs.worker[:] = new_w
        keys, res, qpos = new_keys, cand, cpos
    return res, qpos


def _rank_desc(w: np.ndarray, qpos: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per worker, the rank of each masked job counted from the back of its queue (0 = last)."""
    idx = np.nonzero(mask)[0]
    order = idx[np.lexsort((-qpos[idx], w[idx]))]
    counts = np.bincount(w[order], minlength=int(w.max()) + 1 if w.size else 1)
    starts = np.cumsum(counts) - counts
    out = np.full(w.size, -1)
    out[order] = np.arange(order.size) - starts[w[order]]
    return out


def _progress(
    jobs: Jobs, qpos: np.ndarray, res: engine.Result, horizon: float, rate: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens each job has generated by `horizon` (this step) and whether it finished."""
    w, p, ok = jobs.worker, np.maximum(qpos, 0), qpos >= 0
    fin = ok & (res.finish_t[w, p] <= horizon + 1e-12)
    started = ok & (res.admit_t[w, p] < horizon)
    _, _, fwd = res.rounds.upto(horizon)
    tot = jobs.tokens.astype(float)
    run_tok = np.minimum(tot - 1, 1.0 + rate * (fwd[w] - res.admit_it[w, p]))
    return np.floor(np.where(fin, tot, np.where(started, np.maximum(1.0, run_tok), 0.0))), fin


def _account(
    sim_mode: SimMode,
    jobs: Jobs,
    qpos: np.ndarray,
    res: engine.Result,
    trace: LengthTrace,
    b: int,
    box: Box,
    rate: np.ndarray,
) -> tuple[dict, np.ndarray, float]:
    """The step's metrics, the groups it trains on, and the time the update fires."""
    w = jobs.worker
    fin_t = np.where(qpos >= 0, res.finish_t[w, np.maximum(qpos, 0)], -np.inf)  # carried done: earlier
    uids, inv = np.unique(jobs.uid, return_inverse=True)
    g_done = np.full(uids.size, -np.inf)
    np.maximum.at(g_done, inv, fin_t)
    if sim_mode.oversub > 1.0 and uids.size > b:  # early termination: the first b complete groups
        chosen = np.argsort(g_done, kind="stable")[:b]
        horizon = float(g_done[chosen].max())
    else:
        chosen = np.arange(uids.size)
        horizon = float(res.end_t.max())
    horizon = max(horizon, 0.0)
    trained = uids[chosen]
    busy, slot_time, _ = res.rounds.upto(horizon)
    forwards, slot_steps = res.rounds.work(horizon)
    done, _ = _progress(jobs, qpos, res, horizon, rate)
    in_trained = np.isin(jobs.uid, trained)
    train_tokens = float((trace.prompt_tokens[jobs.row] + trace.response_tokens[jobs.row])[in_trained].sum())
    wall = horizon + box.cost.rollout_fixed
    update = box.cost.update(train_tokens, box.n_w)
    slowest = float(busy.max()) if busy.size else 0.0
    idle = 1.0 - busy / slowest if slowest > 0 else np.zeros(box.n_w)
    cap = float(box.capacity * box.n_w * wall)
    row = {
        "rollout_s": wall,
        "update_s": update,
        "step_time_s": wall + update,
        "slot_time": float(slot_time.sum()),
        "slot_capacity": cap,
        "bubble_ratio": 1.0 - float(slot_time.sum()) / cap if cap > 0 else None,
        "forwards": int(forwards.sum()),
        "slot_steps": int(slot_steps.sum()),
        "busy_sum": float(busy.sum()),
        "busy_max": slowest,
        "worker_idle_share_mean": float(idle.mean()),
        "worker_idle_share_max": float(idle.max()),
        "generated_tokens": float(done[qpos >= 0].sum()),
        "wasted_tokens": 0.0 if sim_mode.partial else float(done[~in_trained].sum()),
        "trained_tokens": train_tokens,
        "trained_groups": int(trained.size),
    }
    if box.per_worker:
        row["worker_forwards"] = [int(f) for f in forwards]
        row["forward_events"] = forward_events(res.rounds, horizon)
    return row, trained, horizon


def forward_events(rounds: engine.Rounds, horizon: float) -> list[dict]:
    """The simulated forwards up to `horizon` as the trace's forward events (worker, t_start, t_end), so a
    metric of the trace's (trace/engines.py) reads a replay as it reads a run: a round of n forwards is n
    equal forwards, each followed by its share of the host gap."""
    n = rounds.prefill + rounds.k
    r, w = np.nonzero(n > 0)
    count = n[r, w]
    i = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    r, w, count = np.repeat(r, count), np.repeat(w, count), np.repeat(count, count)
    each = (rounds.busy[r, w] + rounds.gap[r, w]) / count
    start = rounds.t0[r, w] + i * each
    end = np.minimum(start + rounds.busy[r, w] / count, horizon)
    keep = start < horizon
    return [{"worker": int(a), "t_start": float(b), "t_end": float(c)}
            for a, b, c in zip(w[keep], start[keep], end[keep], strict=True)]  # fmt: skip


def _carry(
    sim_mode: SimMode,
    jobs: Jobs,
    qpos: np.ndarray,
    res: engine.Result,
    trained: np.ndarray,
    horizon: float,
    rate: np.ndarray,
    step: int,
) -> tuple[Jobs, np.ndarray]:
    """What outlives the update: nothing (synchronous), groups to redo (on-policy SortedRL), or the
    untrained groups' sequences with their progress, on their worker (partial SortedRL)."""
    if sim_mode.oversub <= 1.0:
        return Jobs.empty(), np.zeros(0, dtype=np.int64)
    rest = ~np.isin(jobs.uid, trained)
    if not sim_mode.partial:
        return Jobs.empty(), np.unique(jobs.uid[rest])
    done, fin = _progress(jobs, qpos, res, horizon, rate)
    kept = jobs.take(rest)
    got = done[rest].astype(np.int64)
    finished = kept.done | fin[rest]
    kept.tokens = np.where(finished, kept.tokens, kept.tokens - got)
    kept.ctx0 = np.where(finished, kept.ctx0, kept.ctx0 + got)  # resumed: prefill prompt + kept tokens
    kept.done = finished
    kept.born = np.where((kept.born < 0) & ((got > 0) | finished), step, kept.born)
    return kept, np.zeros(0, dtype=np.int64)


def _expire_stale(sim_mode: SimMode, carried: Jobs, trace: LengthTrace, step: int) -> tuple[Jobs, float]:
    """Partial mode at the start of `step`: kept work whose oldest token is more than max_staleness policy
    versions old starts over (SortedRollout._expire_stale); returns the jobs and the tokens thrown away."""
    stale = (carried.born >= 0) & (step - carried.born > sim_mode.max_staleness)
    if not stale.any():
        return carried, 0.0
    full = trace.response_tokens[carried.row]
    waste = float((full - np.where(carried.done, 0, carried.tokens))[stale].sum())
    carried.tokens = np.where(stale, full, carried.tokens)
    carried.ctx0 = np.where(stale, trace.prompt_tokens[carried.row], carried.ctx0)
    carried.done = carried.done & ~stale
    carried.born = np.where(stale, -1, carried.born)
    return carried, waste


def totals(steps: list[dict], n_w: int) -> dict:
    """A run's totals over its per-step rows (ratios of sums; times as means per step)."""
    sum_ = lambda k: sum(s[k] for s in steps)  # noqa: E731
    n = len(steps)
    rollout = sum_("rollout_s")
    return {
        "bubble_ratio": 1.0 - sum_("slot_time") / sum_("slot_capacity") if sum_("slot_capacity") else None,
        "worker_idle_share": 1.0 - sum_("busy_sum") / (sum_("busy_max") * n_w) if sum_("busy_max") else 0.0,
        "worker_idle_share_max": max(s["worker_idle_share_max"] for s in steps),
        "step_time_s": sum_("step_time_s") / n,
        "rollout_s": rollout / n,
        "update_s": sum_("update_s") / n,
        "rollout_tokens_per_s": sum_("generated_tokens") / rollout if rollout else None,
        "trained_tokens_per_s": sum_("trained_tokens") / sum_("step_time_s"),
        "wasted_token_share": sum_("wasted_tokens") / sum_("generated_tokens")
        if sum_("generated_tokens")
        else 0.0,
    }
