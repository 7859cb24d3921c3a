"""SortedRL's rollout strategy and buffer: oversubscribed, length-aware rollout with early termination.

One stateful component decides which prompts enter the engine and which finished groups an update consumes:

- oversubscription: up to oversubscription x update_batch x group_size unfinished samples (running, queued
  or cached) at once, i.e. more prompts than one update needs; inside that bound, prompts are admitted
  lazily, whenever the engine's queue would not cover its free slots (plus `refill_margin` requests), so
  freed slots are refilled at the very next engine step. The bound counts unfinished samples, not prompts:
  a long prompt with one sample left holds one slot, not a group's worth, so it never idles the engine;
- early termination: the update fires as soon as `update_batch` groups are complete (all n samples of a
  prompt); if more completed in the same engine step, the shortest (fewest response tokens) are taken;
- the rest is stopped. `sorted` (fully on-policy) aborts it and regenerates those prompts from scratch under
  the new policy, with a new `attempt` so the seeds differ; finished samples of unconsumed groups are
  discarded too (they came from a policy the next update no longer has). `sorted-partial` keeps every
  sample's tokens, sampling log-probs and per-token policy versions in the buffer, and resumes unfinished
  ones in the engine under the new weights;
- no starvation: re-queued work (cached partials, regenerations) enters the engine at priority 0 and no new
  prompt is admitted while any of it is still waiting for a slot; a sample whose oldest token would be more
  than `max_staleness` versions old at the update is regenerated from scratch; with `max_attempts`, a prompt
  regenerated that many times is dropped explicitly (`dropped`), never silently lost.

The engine is empty between `collect` calls (everything in flight is converted to buffer state when the
update fires), so `state_dict` is plain JSON and a resumed run replays the uninterrupted one exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from reference_trainer.engine.sequence import Sequence, SequenceStatus
from reference_trainer.errors import UserError
from reference_trainer.option import Options, option
from reference_trainer.rollout.base import BubbleFill, Group, RolloutContext, max_staleness

REQUEUED, NEW = 0, 1  # engine priorities: lower is admitted first


@dataclass
class Sample:
    """One sample of a prompt: its progress so far, as the buffer keeps it between steps."""

    sample: int
    attempt: int = 0
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # set once the sample is complete (eos / stop / length)
    seq: Sequence | None = None  # the engine sequence while in flight or just finished (not persisted)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def reset(self) -> None:
        """Regenerate from scratch: a new attempt, so the request's seed differs."""
        self.attempt += 1
        self.response_ids, self.logprobs, self.policy_versions = [], [], []
        self.finish_reason, self.seq = None, None

    def keep(self, seq: Sequence) -> None:
        self.response_ids, self.logprobs = list(seq.response_ids), list(seq.logprobs)
        self.policy_versions = list(seq.policy_versions)

    def to_json(self) -> dict[str, Any]:
        """Every field but the engine sequence (not persisted)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seq"}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Sample:
        return cls(
            sample=int(raw["sample"]),
            attempt=int(raw["attempt"]),
            response_ids=[int(t) for t in raw["response_ids"]],
            logprobs=[float(x) for x in raw["logprobs"]],
            policy_versions=[int(v) for v in raw["policy_versions"]],
            finish_reason=raw["finish_reason"],
        )


@dataclass
class PromptState:
    index: int  # position in the prompt stream
    samples: list[Sample]
    regenerations: int = 0
    admitted: int = 0  # the policy version at which the prompt was first admitted

    @property
    def complete(self) -> bool:
        return all(s.done for s in self.samples)

    def tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.samples)


def prompts_held(oversubscription: float, update_batch: int, group_size: int) -> int:
    """The prompts SortedRL admits with unfinished samples at once, at most: the oversubscription bound on
    unfinished samples in whole groups (a prompt pool smaller than this brings a prompt back while its
    earlier draw still runs, and the two would share request ids)."""
    return math.ceil(oversubscription * update_batch * group_size) // group_size


@dataclass(frozen=True)
class SortedOptions(Options):
    """SortedRL's options (modes sorted, sorted-partial and those built on them)."""

    oversubscription: float = option(
        2.0,
        "unfinished samples allowed at once, as a multiple of one update's (prompts admitted beyond the "
        "update: the early-termination pool)",
        minimum=1.0,
        simulated=True,
    )
    max_staleness: int = max_staleness()
    max_attempts: int | None = option(
        None, "drop a prompt after this many regenerations; none = never", minimum=1
    )
    refill_margin: int | None = option(
        None, "requests kept queued beyond the free slots; none = group_size", minimum=0
    )


class SortedRollout:
    """SortedRL, fully on-policy: unfinished work is aborted and regenerated under the new policy."""

    name = "sorted"
    partial = False

    def __init__(self, options: SortedOptions | None = None, lookahead: bool = False) -> None:
        """`lookahead`: slots idle while the oversubscription bound holds admission back run the stream's
        next prompts ahead (base.BubbleFill); their tokens draft for those prompts when admitted."""
        self.options = options = options or SortedOptions()
        self.oversubscription, self.max_staleness = options.oversubscription, options.max_staleness
        self.max_attempts, self.refill_margin = options.max_attempts, options.refill_margin
        self.active: list[PromptState] = []  # admitted and not yet trained, in admission order
        self.dropped: list[int] = []  # prompt indices given up after max_attempts regenerations
        self.stats = {"admitted": 0, "trained": 0, "aborted": 0, "cached": 0, "regenerated": 0, "stale": 0}
        self._inflight: dict[int, tuple[PromptState, Sample]] = {}  # id(seq) -> owner, during collect only
        # The controller's per-step counts, kept during collect instead of recounted at every engine step
        # (at 128 slots a recount over every sample was most of its host time): unfinished samples, and the
        # submitted sequences that may still wait for a slot (pruned as the engine admits them).
        self._open = 0
        self._queued: list[Sequence] = []
        self.bubble: BubbleFill | None = BubbleFill() if lookahead else None

    # ---- the step ---------------------------------------------------------------------------------------
    def collect(self, ctx: RolloutContext) -> list[Group]:
        engine, version = ctx.engine, ctx.engine.policy_version
        if engine.has_unfinished():
            raise RuntimeError("the SortedRL strategy needs the engine to itself (it has unfinished work)")
        self._expire_stale(version)
        # Re-queued work goes ahead of any new prompt (priority), so nothing starves. Among it, shortest
        # resume first (a stable sort keeps admission order on ties): the engine prefills in chunks padded to
        # their longest member, so similar lengths pack tighter, and the first chunk, during which the other
        # slots are still empty, holds as many sequences as possible.
        requeued = [(p, s) for p in self.active for s in p.samples if not s.done]
        for prompt, s in sorted(
            requeued, key=lambda ps: len(ps[1].response_ids) + len(self._prompt(ctx, ps[0]))
        ):
            self._submit(ctx, prompt, s, REQUEUED)
        self._open = self.unfinished()
        complete = [p for p in self.active if p.complete]
        while len(complete) < ctx.update_batch:
            self._refill(ctx)
            if not engine.has_unfinished():
                raise RuntimeError("rollout stalled: nothing in flight and too few complete groups")
            if self.bubble is not None:
                self.bubble.fill(ctx, waiting=len(self._waiting()))
            for seq in engine.step():
                owner = self._inflight.pop(id(seq), None)
                if owner is None:
                    continue
                prompt, sample = owner
                sample.keep(seq)
                sample.finish_reason = seq.finish_reason or "eos"
                self._open -= 1
                if prompt.complete:
                    complete.append(prompt)
        # Early termination: the update_batch shortest complete groups; the micro-curriculum's order.
        chosen = sorted(complete, key=lambda p: (p.tokens(), p.index))[: ctx.update_batch]
        self._stop_the_rest(ctx, chosen)
        if self.bubble is not None:
            self.bubble.stop(ctx)
        groups = [self._group(ctx, p) for p in chosen]
        self.stats["trained"] += len(chosen)
        return groups

    def _expire_stale(self, version: int) -> None:
        """Regenerate samples whose oldest token would exceed max_staleness at this step's update."""
        for prompt in self.active:
            for s in prompt.samples:
                if s.policy_versions and version - min(s.policy_versions) > self.max_staleness:
                    s.reset()
                    self.stats["stale"] += 1

    def max_unfinished(self, ctx: RolloutContext) -> int:
        """The oversubscription bound on unfinished samples (running, queued or cached)."""
        return math.ceil(self.oversubscription * ctx.update_batch * ctx.group_size)

    def unfinished(self) -> int:
        return sum(not s.done for p in self.active for s in p.samples)

    def _capacity(self, ctx: RolloutContext) -> int:
        return int(ctx.engine.config.max_num_seqs)

    def _refill(self, ctx: RolloutContext) -> None:
        """Admit new prompts so the waiting queue covers every free slot (plus a margin), within the
        oversubscription bound, and never while re-queued work waits: only when every re-queued request
        still waiting gets a slot at the next engine step (priority puts it ahead of any new prompt)."""
        cap = self.max_unfinished(ctx)
        margin = ctx.group_size if self.refill_margin is None else self.refill_margin
        # Inside the loop only the prompts it admits change the counts, each by a group of new waiting
        # samples, so they are advanced instead of recounted.
        unfinished = self._open
        if unfinished + ctx.group_size > cap:
            return
        waiting, requeued = self._waiting_counts()
        # Lookahead runs hold slots only until real work needs them (BubbleFill.make_room).
        free = self._capacity(ctx) - sum(not s.lookahead for s in ctx.engine.running)
        if requeued > free:
            return
        while unfinished + ctx.group_size <= cap and waiting < free + margin:
            unfinished += ctx.group_size
            waiting += ctx.group_size
            self._open += ctx.group_size
            index, problem = ctx.stream.take()
            self._check_not_active(ctx, problem.prompt_id)
            samples = [Sample(k) for k in range(ctx.group_size)]
            prompt = PromptState(index, samples, admitted=ctx.engine.policy_version)
            self.active.append(prompt)
            self.stats["admitted"] += 1
            for s in prompt.samples:
                self._submit(ctx, prompt, s, NEW)

    def _check_not_active(self, ctx: RolloutContext, prompt_id: str) -> None:
        """A prompt pool cycled while a prompt is still held would give two live requests one id: one line."""
        if any(ctx.stream.problem(p.index).prompt_id == prompt_id for p in self.active):
            raise UserError(
                f"prompt {prompt_id} came round again while SortedRL still holds it ({len(self.active)} "
                f"prompts active): use a larger --prompt-pool (now {ctx.stream.pool})"
            )

    def _waiting_counts(self) -> tuple[int, int]:
        """The samples queued in the engine without a slot yet: all of them, and the re-queued ones."""
        self._queued = [seq for seq in self._queued if seq.status == SequenceStatus.WAITING]
        return len(self._queued), sum(seq.priority == REQUEUED for seq in self._queued)

    def _waiting(self) -> list[tuple[Sequence, Sample]]:
        return [
            (s.seq, s)
            for _, s in self._inflight.values()
            if s.seq is not None and s.seq.status == SequenceStatus.WAITING
        ]

    def _prompt(self, ctx: RolloutContext, prompt: PromptState) -> list[int]:
        return ctx.prompt_ids(prompt.index, ctx.stream.problem(prompt.index))

    def _submit(self, ctx: RolloutContext, prompt: PromptState, s: Sample, priority: int) -> None:
        """Queue the sample, resuming its kept tokens (a partial rollout) where it has any."""
        problem = ctx.stream.problem(prompt.index)
        request = ctx.request(prompt.index, problem, s.sample, s.attempt, priority, prompt.admitted)
        if s.response_ids:
            request = replace(request, response_ids=s.response_ids, logprobs=s.logprobs,
                              policy_versions=s.policy_versions)  # fmt: skip
        s.seq = ctx.engine.add_request(request)
        self._inflight[id(s.seq)] = (prompt, s)
        self._queued.append(s.seq)

    def _stop_the_rest(self, ctx: RolloutContext, chosen: list[PromptState]) -> None:
        """Convert everything not chosen to buffer state; the engine is empty afterwards."""
        touched: set[int] = set()  # prompts (by id) that generated tokens the on-policy mode must discard
        halt = getattr(ctx.engine, "halt", None)
        if halt is not None:  # W engines (multi.py): all stop in one round trip before the sequences are read
            halt()
        for prompt, s in list(self._inflight.values()):
            assert s.seq is not None
            if s.seq.status == SequenceStatus.FINISHED:  # finished in the engines' last gather: a done sample
                s.keep(s.seq)
                s.finish_reason = s.seq.finish_reason or "eos"
                continue
            ran = s.seq.status == SequenceStatus.RUNNING
            ctx.engine.abort(s.seq)
            if ran:  # a request that never got a slot left no trace worth recording
                ctx.record(s.seq, "cached" if self.partial else "aborted")
                self.stats["cached" if self.partial else "aborted"] += 1
            if self.partial:
                s.keep(s.seq)
                s.seq = None
            elif ran:
                s.reset()
                touched.add(id(prompt))
            else:
                s.seq = None
        self._inflight.clear()
        self._queued = []
        chosen_ids = {id(p) for p in chosen}
        self.active = [p for p in self.active if id(p) not in chosen_ids]
        if self.partial:  # finished samples wait in the buffer for their group
            return
        kept = []
        for prompt in self.active:  # on-policy: nothing sampled by this policy survives the update
            for s in prompt.samples:
                if s.done:
                    if s.seq is not None:
                        ctx.record(s.seq, "aborted")  # finished, but its group was not consumed
                        self.stats["aborted"] += 1
                    s.reset()
                    touched.add(id(prompt))
            if id(prompt) in touched:
                prompt.regenerations += 1
                self.stats["regenerated"] += 1
            if self.max_attempts is not None and prompt.regenerations >= self.max_attempts:
                self.dropped.append(prompt.index)
            else:
                kept.append(prompt)
        self.active = kept

    def _group(self, ctx: RolloutContext, prompt: PromptState) -> Group:
        problem = ctx.stream.problem(prompt.index)
        samples = []
        for s in prompt.samples:
            seq = s.seq if s.seq is not None else self._rebuild(ctx, prompt, s)
            ctx.record(seq)
            samples.append(seq)
        return Group(prompt.index, problem, samples)

    def _rebuild(self, ctx: RolloutContext, prompt: PromptState, s: Sample) -> Sequence:
        """A finished sample carried over from an earlier step (or a checkpoint) as a Sequence."""
        problem = ctx.stream.problem(prompt.index)
        request = ctx.request(prompt.index, problem, s.sample, s.attempt, admitted=prompt.admitted)
        return Sequence(
            seq_id=request.seq_id or "",
            prompt_ids=request.prompt_ids,
            params=ctx.params,
            response_ids=list(s.response_ids),
            logprobs=list(s.logprobs),
            policy_versions=list(s.policy_versions),
            meta=request.meta,
            status=SequenceStatus.FINISHED,
            finish_reason=s.finish_reason,
        )

    # ---- checkpointing ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._inflight:
            raise RuntimeError("state_dict during a rollout: the buffer is only consistent between steps")
        return {
            "active": [
                {
                    "index": p.index,
                    "regenerations": p.regenerations,
                    "admitted": p.admitted,
                    "samples": [s.to_json() for s in p.samples],
                }
                for p in self.active
            ],
            "dropped": list(self.dropped),
            "stats": dict(self.stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.active = [
            PromptState(
                int(p["index"]),
                [Sample.from_json(s) for s in p["samples"]],
                int(p["regenerations"]),
                int(p["admitted"]),
            )
            for p in state["active"]
        ]
        self.dropped = [int(i) for i in state["dropped"]]
        self.stats = {k: int(v) for k, v in state["stats"].items()}
        self._inflight, self._queued = {}, []


class SortedPartialRollout(SortedRollout):
    """SortedRL with partial rollouts: unfinished samples are cached and resumed under the new weights."""

    name = "sorted-partial"
    partial = True
