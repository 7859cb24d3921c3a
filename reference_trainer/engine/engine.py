"""The engine: requests in, one scheduled forward per `step()`, tokens and log-probs out, all traced."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.lookahead import is_lookahead
from reference_trainer.engine.requests import RequestBook
from reference_trainer.engine.runner import ModelRunner, Scored
from reference_trainer.engine.sampler import SamplerOps, SlotParams, sample, seed_key
from reference_trainer.engine.scheduler import Scheduler
from reference_trainer.engine.sequence import Sequence
from reference_trainer.engine.transfers import read_back
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.loader import resolve_dtype
from reference_trainer.trace.schema import CAPTURE
from reference_trainer.trace.writer import Trace

if TYPE_CHECKING:
    from reference_trainer.engine.speculative import Speculator


class Engine(RequestBook):
    """Continuous batching over `max_num_seqs` slots of a preallocated KV cache.

    The engine owns its model object; `update_weights` copies new weights into it in place between steps
    (the cache's layout does not change, so nothing is reallocated). Stop rules, finishing, aborting and
    `generate` are the shared `RequestBook`'s (requests.py).
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
        dtype = (
            next(model.parameters()).dtype if config.dtype == "auto" else resolve_dtype(config.dtype, device)
        )
        max_len = min(config.max_model_len, model.config.max_position_embeddings)
        self._init_book(config, max_len, eos_token_ids, tokenizer, trace)
        graphs = config.cuda_graphs and device.type == "cuda"  # the pool they are captured over stays put
        self.slots = SlotManager(
            model.config, config.max_num_seqs, max_len + config.max_verify_tokens, device, dtype,
            preallocate=graphs,
        )  # fmt: skip
        self.scheduler = Scheduler(self.slots, config.max_prefill_tokens)
        self.sampling = SlotParams(config.max_num_seqs, device)  # per slot, on the device
        self.runner = ModelRunner(model, config, self.slots, self.sampling)
        self.device = device
        # Each request's random stream key (sampler.py): from its seed, or for an unseeded request from the
        # engine's own source, itself seeded from torch's global generator (torch.manual_seed governs it).
        self._keys: dict[str, int] = {}
        self._unseeded = random.Random(int(torch.randint(0, 2**62, ())))
        # Optional speculative decoder (engine/speculative.py); it takes over decode steps when attached.
        self.speculator: Speculator | None = None
        self._lookahead_seen = False  # a lookahead request (engine/lookahead.py) was ever added
        self._decode_ops: tuple[int, SamplerOps] | None = None  # (scheduler membership, running rows' ops)

    # ---- requests ----------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        seq_id: str | None = None,
        response_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        policy_versions: list[int] | None = None,
        priority: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Sequence:
        """Queue a request. Passing `response_ids` (with their log-probs and policy versions) resumes a
        partial rollout: the engine prefills prompt + response and continues after it."""
        params = params or SamplingParams()
        seq = self._new_sequence(
            prompt_ids, params, seq_id, response_ids, logprobs, policy_versions, priority, meta
        )
        # Draws are keyed by token position, so a resumed request continues its seed's stream where the
        # uninterrupted run would be: it neither replays its first draws nor needs a shifted seed.
        seed = params.seed if params.seed is not None else self._unseeded.getrandbits(64)
        self._keys[seq.seq_id] = seed_key(seed)
        self._lookahead_seen = self._lookahead_seen or is_lookahead(seq.seq_id)
        self.scheduler.add(seq)
        return seq

    def _release(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        self._keys.pop(seq.seq_id, None)
        if self.speculator is not None:  # a finished response is history at once for its siblings
            self.speculator.on_done(seq)

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
        """One forward: a batched prefill of newly admitted sequences or a decode of all running ones.
        Returns the sequences that finished in this step."""
        kind, seqs = self.scheduler.schedule()
        if not seqs:
            return []
        ops = self._capture_decode_graphs(seqs) if kind == "decode" else None
        t_start = self.trace.now()
        occupied = dict(self.scheduler.occupied)
        if kind == "decode" and self.speculator is not None:
            return self.speculator.step(seqs, t_start, occupied, ops)
        if kind == "prefill":  # the slots' sampling parameters change only when their requests do
            self.sampling.assign(
                [s.slot for s in seqs],  # type: ignore[misc]
                [s.params for s in seqs],
                [self._keys[s.seq_id] for s in seqs],
            )
        scored = self.runner.prefill(seqs) if kind == "prefill" else self.runner.decode(seqs, ops)
        finished = self.emit(seqs, scored)
        self.trace_forward(kind, t_start, occupied, seqs, len(seqs))
        return finished

    def _capture_decode_graphs(self, seqs: list[Sequence]) -> SamplerOps | None:
        """CUDA graphs: before the first decode step with these sequences' sampler ops, every decode shape
        with them is captured, as the trace's `capture` event, outside any timed step (and again after a
        grown pool dropped the graphs). Returns the ops (None without a static forward), which the step
        reuses; they are kept while the running set is unchanged (its scheduler membership)."""
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
                fields["graphs"] = static.capture_decode(ops)
        return ops

    def trace_forward(
        self,
        kind: str,
        t_start: float,
        occupied: dict[str, str],
        seqs: list[Sequence],
        tokens: int,
        lookahead_tokens: int | None = None,
        **extra: object,
    ) -> None:
        """The trace event of one forward over `seqs` that emitted `tokens`. Lookahead requests' work is its
        own kind (engine/lookahead.py): their slots and tokens are counted apart and not in `tokens`, so the
        step's samples' throughput is not inflated by tokens no update trains on. `lookahead_tokens` None:
        one per lookahead request in `seqs` (a prefill or decode step emits one token per sequence)."""
        slots = 0
        if self._lookahead_seen:  # a per-row scan, in series with the GPU: only where lookahead ever ran
            if lookahead_tokens is None:
                lookahead_tokens = sum(is_lookahead(s.seq_id) for s in seqs)
            slots = sum(is_lookahead(i) for i in occupied.values())
        lookahead_tokens = lookahead_tokens or 0
        if slots or lookahead_tokens:
            extra.update(lookahead_slots=slots, lookahead_tokens=lookahead_tokens)
        self.trace.engine_step(
            kind, t_start, self.trace.now(), occupied, self.slots.capacity, tokens - lookahead_tokens, **extra
        )

    def emit(self, seqs: list[Sequence], scored: Scored) -> list[Sequence]:
        """Sample one token per sequence from its row of `scored` (unless a decode graph did), read the
        tokens back (the step's one device-to-host transfer) and append them; returns the sequences that
        finished."""
        if scored.sampled is not None:
            tokens, logprobs = scored.sampled
        else:
            params = [s.params for s in seqs]
            batch = self.sampling.batch(scored.slots, scored.positions, params)  # type: ignore[arg-type]
            tokens, logprobs = sample(scored.logits, batch)  # type: ignore[arg-type]
        tokens_l, logprobs_l = read_back(tokens, logprobs)
        return self._append_one_each(seqs, tokens_l, logprobs_l)

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy new weights into the engine's model in place; in-flight sequences continue under them."""
        own = self.model.state_dict()
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
        self.model.repack()  # the CPU matmuls run over packed copies of the weights (model/packed.py)
        self.policy_version = self.policy_version + 1 if version is None else version
