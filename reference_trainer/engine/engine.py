"""The engine: requests in, one scheduled forward per `step()`, tokens and log-probs out, all traced."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from reference_trainer.engine import timing
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.hostclock import FORWARDS, HostClock
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.protocol import DecodeReport, Speculation, VerifyCounts
from reference_trainer.engine.requests import RequestBook
from reference_trainer.engine.runner import ModelRunner
from reference_trainer.engine.sampler import (
    AcceptRule,
    SamplerOps,
    SlotParams,
    coupled_accept,
    plain_tokens,
    sample,
    scaled_logits,
    seed_key,
    token_logprobs,
)
from reference_trainer.engine.scheduler import Scheduler
from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.engine.timing import interpolate
from reference_trainer.engine.transfers import read_back
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import resolve_dtype
from reference_trainer.trace.schema import CAPTURE, PREFILL, VERIFY
from reference_trainer.trace.writer import Trace


@dataclass
class Scheduled:
    """One step as `Engine._prepare` planned it: its kind, the running sequences, those admitted into it,
    the running rows' sampler ops (graphs), when it started and the slots it occupies (for the trace)."""

    kind: str
    running: list[Sequence]
    admitted: list[Sequence]
    ops: SamplerOps | None
    t_start: float
    occupied: dict[str, str]
    seqs: list[Sequence] = field(init=False)
    admitted_tokens: int = field(init=False)  # the admitted rows' uncached tokens, fed in this step

    def __post_init__(self) -> None:
        self.seqs = self.running + self.admitted
        self.admitted_tokens = sum(s.length - s.num_cached for s in self.admitted)


class Engine(RequestBook):
    """Continuous batching over `max_num_seqs` slots of a preallocated KV cache.

    The engine owns its model object; `update_weights` copies new weights into it in place between steps
    (the cache's layout does not change, so nothing is reallocated). Stop rules, finishing, aborting and
    `generate` are the shared `RequestBook`'s (requests.py). A `Speculation` hook (protocol.py), when one is
    attached, proposes drafts before each decode step; the engine verifies them exactly (`verify`).
    """

    def __init__(
        self,
        model: DecoderLM,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer: object | None = None,
        trace: Trace | None = None,
    ) -> None:
        config = (config or EngineConfig()).check()
        self.model = model.eval().fuse_projections()
        device = next(model.parameters()).device
        weights = next(model.parameters()).dtype
        dtype = weights if config.dtype == "auto" else resolve_dtype(config.dtype, device)
        max_len = min(config.max_model_len, model.config.max_position_embeddings)
        self._init_book(config, max_len, eos_token_ids, tokenizer, trace)
        graphs = config.cuda_graphs and device.type == "cuda"  # the pool they are captured over stays put
        rows = max_len + config.max_verify_tokens
        self.slots = SlotManager(model.config, config.max_num_seqs, rows, device, dtype, preallocate=graphs)
        self.scheduler = Scheduler(self.slots, config.max_prefill_tokens)
        self.sampling = SlotParams(config.max_num_seqs, device)  # per slot, on the device
        self.host_clock = HostClock()  # the host's CPU seconds by part (hostclock.py); the rollout reads it
        self.runner = ModelRunner(model, config, self.slots, self.sampling, self.host_clock)
        self.device = device
        # Each request's random stream key (sampler.py): from its seed, or for an unseeded request from the
        # engine's own source, itself seeded from torch's global generator (torch.manual_seed governs it).
        self._keys: dict[str, int] = {}
        self._unseeded = random.Random(int(torch.randint(0, 2**62, ())))
        self.speculation: Speculation | None = None  # the decode-step hook (speculation/speculator.py)
        self._decode_ops: tuple[int, SamplerOps] | None = None  # (scheduler membership, running rows' ops)

    # ---- requests ----------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> Sequence:
        """Queue a request (a resumed partial rollout prefills prompt + response and continues after it)."""
        seq = self._new_sequence(request)
        # Draws are keyed by token position, so a resumed request continues its seed's stream where the
        # uninterrupted run would be: it neither replays its first draws nor needs a shifted seed.
        seed = seq.params.seed if seq.params.seed is not None else self._unseeded.getrandbits(64)
        self._keys[seq.seq_id] = seed_key(seed)
        self.scheduler.add(seq)
        return seq

    def _release(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        self._keys.pop(seq.seq_id, None)
        if self.speculation is not None:  # a finished response is history at once for its siblings
            self.speculation.released(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def running(self) -> list[Sequence]:
        return list(self.scheduler.running.values())

    @property
    def waiting(self) -> list[Sequence]:
        return self.scheduler.waiting

    # ---- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One forward: a decode of every running sequence, with the sequences admitted into free slots
        riding in it (one forward over both, runner.mixed), or, with a speculation hook that proposes
        drafts, a verify of them; a prefill of its own only for admissions while nothing runs. Returns the
        sequences that finished in this step. Three parts, as nano-vllm's step: `_prepare` (schedule, the
        admitted slots' sampling parameters, the decode graphs' ops), `_run` (the forward, the draw and the
        read-back) and `_postprocess` (append the tokens, stop rules, the trace event). Its host CPU time
        is the engine's (`host_clock`)."""
        with self.host_clock.engine:
            planned = self._prepare()
            if planned is None:
                return []
            running, admitted = planned.running, planned.admitted
            hook = self.speculation if running else None
            if hook is not None:
                drafts = hook.propose(running, [self._draft_room(s) for s in running])
                if drafts is not None:
                    return self.verify(
                        running, drafts, hook.accept_rule, admitted=admitted, t_start=planned.t_start
                    )
            t0 = time.perf_counter()
            finished = self._postprocess(planned, *self._run(planned))
            if hook is not None:  # a step with admissions is not the forward the cost table times
                hook.observe(DecodeReport(running, None if admitted else time.perf_counter() - t0))
            return finished

    def _prepare(self) -> Scheduled | None:
        """The step's plan: what runs and what is admitted into it (None: nothing to do)."""
        kind, running, admitted = self.scheduler.schedule()
        if not running and not admitted:
            return None
        if admitted:  # the slots' sampling parameters change only when their requests do
            with self.host_clock.sampling:
                self.sampling.assign(
                    [s.slot for s in admitted],  # type: ignore[misc]
                    [s.params for s in admitted],
                    [self._keys[s.seq_id] for s in admitted],
                )
        ops = self._capture_decode_graphs(running) if running and not admitted else None
        if running and admitted:
            self._capture_admitting_graph(running, admitted)
        occupied = dict(self.scheduler.occupied)
        return Scheduled(kind, running, admitted, ops, self.trace.now(), occupied)

    def _run(self, planned: Scheduled) -> tuple[list[float], list[float]]:
        """The forward (a prefill, a decode with admissions riding in it, or a plain decode), one token
        drawn per sequence from its row (unless a decode graph drew it) and read back: the step's one
        device-to-host transfer."""
        running, admitted = planned.running, planned.admitted
        if planned.kind == PREFILL:
            scored = self.runner.prefill(admitted)
        elif admitted:
            scored = self.runner.mixed(running, admitted)
        else:
            scored = self.runner.decode(running, planned.ops)
        with self.host_clock.sampling:  # the sampling parameters, then the draw and read-back (forwards)
            if scored.sampled is not None:
                tokens, logprobs = scored.sampled
                self.host_clock.switch(FORWARDS)
            else:
                params = [s.params for s in planned.seqs]
                batch = self.sampling.batch(scored.slots, scored.positions, params)  # type: ignore[arg-type]
                self.host_clock.switch(FORWARDS)
                tokens, logprobs = sample(scored.logits, batch)  # type: ignore[arg-type]
            tokens_l, logprobs_l = read_back(tokens, logprobs)
        return tokens_l, logprobs_l

    def _postprocess(self, planned: Scheduled, tokens: list[float], logprobs: list[float]) -> list[Sequence]:
        """Append each sequence's token (stop rules, finishing), then the step's trace event; returns the
        sequences that finished."""
        running, admitted, seqs = planned.running, planned.admitted, planned.seqs
        finished = self._append_one_each(seqs, tokens, logprobs)
        fed = len(running) + planned.admitted_tokens
        both = running and admitted
        extra = {"prefill_rows": len(admitted), "prefill_tokens": fed - len(running)} if both else {}
        self._trace_forward(
            planned.kind, planned.t_start, planned.occupied, seqs, len(seqs), input_tokens=fed, **extra
        )
        return finished

    def _draft_room(self, seq: Sequence) -> int:
        """Draft tokens `seq` may take in a verify: one fewer than it may still grow (max_tokens, the
        cache, the verify width), since a verify emits one token past its accepted draft."""
        grow = min(
            seq.params.max_tokens - len(seq.response_ids),
            self.max_model_len - seq.length,
            self.config.max_verify_tokens,
        )
        return max(0, grow - 1)

    def _capture_decode_graphs(self, seqs: list[Sequence]) -> SamplerOps | None:
        """The running rows' sampler ops (None without a static forward), kept while the running set is
        unchanged (its scheduler membership). Under CUDA graphs, ops that `prepare` did not capture for
        (requests with other sampling parameters than the run's) have every decode shape captured now, as
        the trace's `capture` event, outside the step's time (and again after a grown pool dropped the
        graphs)."""
        static = self.runner.static
        if static is None:
            return None
        membership = self.scheduler.membership  # the running set, hence its ops, changes only with it
        if self._decode_ops is None or self._decode_ops[0] != membership:
            self._decode_ops = (membership, SamplerOps.of([s.params for s in seqs]))
        ops = self._decode_ops[1]
        if not static.capture:
            return ops
        longest = max(s.num_cached for s in seqs) + 1
        if static.decode_graph_missing(len(seqs), longest, ops):
            with self.trace.phase(CAPTURE) as fields:
                fields["graphs"] = static.prepare(ops)
        return ops

    def _capture_admitting_graph(self, running: list[Sequence], admitted: list[Sequence]) -> None:
        """Under CUDA graphs, the shape of a decode step with admissions riding in it (runner.py
        `admitting_key`, mixed.py) captured when first met, as its own `capture` event before the step's
        clock starts (it compiles nothing: its flex shape is the plain decode step's)."""
        admitting = self.runner.admitting
        if admitting is None or not admitting.static.capture:
            return
        key = self.runner.admitting_key(running, admitted)
        if key is not None and key not in admitting.graphs:
            with self.trace.phase(CAPTURE) as fields:
                fields["graphs"] = int(admitting.ensure_captured(key))

    def prepare(self, params: SamplingParams) -> None:
        """Before a run's first timed step: capture every graph its decode steps (and, with a speculation
        hook, its verify steps) can take with the run's sampling parameters, compiling flex's shapes with
        them, and measure what admissions add to a decode step (the admission gate's overhead), as one
        `capture` event. On a CPU there is nothing to prepare: every forward runs eagerly at its own shape
        and an admission adds only its own tokens' work, so admissions ride at once."""
        static = self.runner.static
        if static is None:
            return
        with self.trace.phase(CAPTURE) as fields:
            ops = SamplerOps.of([params])
            fields["graphs"] = static.prepare(ops, verify=self.speculation is not None)
            if static.capture:  # what a mixed step's graph adds to a plain decode step's
                table = self.measure_admission_overhead()
                self.scheduler.gate.overhead = functools.partial(interpolate, table)
                fields["admission_overhead"] = {str(b): k for b, k in table.items()}

    def measure_admission_overhead(
        self, batches: Seq[int] = (1, 8, 64, 256), tokens: int = 32, repeats: int = 3
    ) -> dict[int, float]:
        """What 1 admission of `tokens` tokens adds to a decode step of b running rows, in plain decode
        steps, for each b in `batches` (below the capacity), timed on probe sequences in free slots
        (timing.py); only while no request runs."""
        if self.scheduler.running:
            raise RuntimeError("measure before any request runs: the probes take free slots")
        batches = sorted({min(b, self.slots.capacity - 1) for b in batches if b >= 1})
        return timing.admission_overhead(self.runner, self.slots, batches, tokens, repeats)

    @torch.inference_mode()
    def verify(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        accept_rule: AcceptRule = coupled_accept,
        *,
        admitted: list[Sequence] | None = None,
        t_start: float | None = None,
    ) -> list[Sequence]:
        """One forward over each running sequence's newest token and its draft (`drafts[i]`, possibly empty):
        every position draws the token plain decoding would draw there (keyed by seed and position), a draft
        token is accepted while `accept_rule` holds (the exact rule: it equals that draw), and each sequence
        emits its accepted draft plus the draw at the first rejected (or the bonus) position. Rejected
        positions are rolled back by not counting them as cached. `admitted` (sequences just admitted into
        free slots, their sampling parameters assigned) ride in the same forward and emit one token each, as
        a sequence with an empty draft does. Traced as a `verify` event; a verify width's first use under
        graphs is captured first, as its own `capture` event. Returns the sequences that finished."""
        admitted = admitted or []
        width = 1 + max(len(d) for d in drafts)
        t_start = self._capture_verify(seqs, width, bool(admitted), t_start)
        occupied = dict(self.scheduler.occupied)
        t0 = time.perf_counter()
        prefill_tokens = sum(s.length - s.num_cached for s in admitted)
        fed = sum(len(d) + 1 for d in drafts) + prefill_tokens
        drawn = self._draw_verify(seqs, drafts, admitted, accept_rule)
        every, all_drafts = seqs + admitted, drafts + [[] for _ in admitted]
        finished, accepted_each, counts = self._take_verified(every, all_drafts, *drawn)
        if self.speculation is not None:  # a step with admissions is not the forward the cost table times
            seconds = None if admitted else time.perf_counter() - t0
            self.speculation.observe(DecodeReport(seqs, seconds, list(drafts), accepted_each[: len(seqs)]))
        extra = {"prefill_rows": len(admitted), "prefill_tokens": prefill_tokens} if admitted else {}
        fields = {"input_tokens": fed, "width": width - 1, **counts.event_counts(), **extra}
        self._trace_forward(VERIFY, t_start, occupied, every, counts.emitted, counts.lookahead, **fields)
        return finished

    def _capture_verify(self, seqs: list[Sequence], width: int, admits: bool, t_start: float | None) -> float:
        """The verify forward's start, after capturing its width's graphs on their first use (a `capture`
        event of its own, outside the forward's time)."""
        static = self.runner.static
        t_start = self.trace.now() if t_start is None else t_start
        capture_start = self.trace.now()
        longest = max(s.num_cached for s in seqs) + width
        if not admits and static is not None and static.ensure_captured(len(seqs), width, longest):
            t_start = self.trace.now()
            self.trace.add_phase(CAPTURE, capture_start, t_start, graphs=1)
        return t_start

    def _draw_verify(
        self, seqs: list[Sequence], drafts: list[list[int]], admitted: list[Sequence], accept_rule: AcceptRule
    ) -> list[list[float]]:
        """The forward over the drafts (and the admitted rows), each row's draw and whether its draft token
        is accepted, read back in one transfer: per row, (accepted, emitted token, its log-prob)."""
        rows = [[s.last_token] + d for s, d in zip(seqs, drafts, strict=True)]
        scored = self.runner.mixed(seqs, admitted, rows) if admitted else self.runner.extend(seqs, rows)
        all_drafts = drafts + [[] for _ in admitted]
        # Row j of a sequence scores the token at position length + j: the draw plain decoding makes there.
        params = [
            s.params for s, d in zip(seqs + admitted, all_drafts, strict=True) for _ in range(len(d) + 1)
        ]
        draft_flat = scored.drafts
        assert draft_flat is not None and scored.logits is not None
        with self.host_clock.sampling:  # the sampling parameters, then the draws and read-back (forwards)
            batch = self.sampling.batch(scored.slots, scored.positions, params)  # type: ignore[arg-type]
            self.host_clock.switch(FORWARDS)
            scaled = scaled_logits(scored.logits, batch)
            plain, probs = plain_tokens(scaled, batch)
            accept = accept_rule(probs, plain, draft_flat) & (draft_flat >= 0)
            emit_flat = torch.where(accept, draft_flat, plain)
            logp_flat = token_logprobs(scaled, emit_flat)
            return read_back(accept, emit_flat, logp_flat)  # the step's one read-back

    def _take_verified(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        accept_l: list[float],
        emit_l: list[float],
        logp_l: list[float],
    ) -> tuple[list[Sequence], list[int], VerifyCounts]:
        """Each sequence's accepted draft and the draw after it appended (rejected positions rolled back by
        not counting them as cached): the finished sequences, each one's accepted drafts, the counts."""
        finished: list[Sequence] = []
        accepted_each: list[int] = []
        counts = []
        start = 0
        for seq, d in zip(seqs, drafts, strict=True):
            n_acc = 0
            while n_acc < len(d) and accept_l[start + n_acc]:
                n_acc += 1
            before = len(seq.response_ids)
            emitted = slice(start, start + n_acc + 1)
            if self._append(seq, [int(t) for t in emit_l[emitted]], logp_l[emitted]):
                finished.append(seq)
            else:
                seq.num_cached = seq.length - 1
            n_out = len(seq.response_ids) - before
            seq.drafted += len(d)
            accepted_each.append(n_acc)
            kept = min(n_acc, n_out)
            seq.accepted += kept
            counts.append(VerifyCounts(n_out, n_out * seq.lookahead, len(d), kept, bool(d), n_out * bool(d)))
            start += len(d) + 1
        return finished, accepted_each, sum(counts, VerifyCounts())

    def _trace_forward(
        self,
        kind: str,
        t_start: float,
        occupied: dict[str, str],
        seqs: list[Sequence],
        tokens: int,
        lookahead_tokens: int | None = None,
        **extra: object,
    ) -> None:
        """The trace event of one forward over `seqs` (its `rows`) that emitted `tokens`. Lookahead requests'
        work is its own kind (speculation/lookahead.py): their slots and tokens are counted apart and not in
        `tokens`, so the step's samples' throughput is not inflated by tokens no update trains on.
        `lookahead_tokens` None: one per lookahead request in `seqs` (a prefill or decode step emits one
        token per sequence)."""
        # Counted over `seqs`, not only while `slots` (after this forward's releases) holds any: a run that
        # ended in this forward is no slot now, and its last token is lookahead work all the same.
        slots = self.scheduler.lookahead_running
        if lookahead_tokens is None:
            lookahead_tokens = sum(s.lookahead for s in seqs)
        lookahead_tokens = lookahead_tokens or 0
        if slots or lookahead_tokens:
            extra.update(lookahead_slots=slots, lookahead_tokens=lookahead_tokens)
        self.trace.engine_step(
            kind, t_start, self.trace.now(), occupied, self.slots.capacity, tokens - lookahead_tokens,
            rows=len(seqs), **extra,
        )  # fmt: skip

    # ---- costs and weights -------------------------------------------------------------------------------
    def time_forwards(
        self, batches: Seq[int], widths: Seq[int], context: int = 64, repeats: int = 3
    ) -> dict[tuple[int, int], float]:
        """Seconds per forward of (batch, width), timed on probe sequences in free slots (timing.py): what a
        cost model is built from. Only while no request runs: the probes take free slots."""
        if self.scheduler.running:
            raise RuntimeError("time forwards before any request runs: the probes take free slots")
        batches = sorted({min(b, self.slots.capacity) for b in batches})
        widths = sorted({min(w, self.config.max_verify_tokens) for w in widths} | {1})
        context = min(context, self.max_model_len - 1)  # the cache holds max_verify_tokens more per slot
        return timing.time_forwards(self.runner, self.slots, batches, widths, context, repeats)

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy new weights into the engine's model in place; in-flight sequences continue under them."""
        own = self.model.state_dict()
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
        self.model.repack()  # the CPU matmuls run over packed copies of the weights (model/packed.py)
        self.policy_version = self.policy_version + 1 if version is None else version
