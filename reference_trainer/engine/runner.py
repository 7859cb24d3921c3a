"""The model runner: turns scheduled sequences into batched forwards over the KV cache (kv_cache.py).

Every forward takes its inputs from one upload (transfers.py) and hands the sampler device tensors only:
the logits of the rows to sample, each row's slot and the position of the token drawn from it (`Scored`);
a decode forward on the graph path samples inside its graph and hands over the tokens instead.
Nothing in a decode or verify forward reads a device value back: what the forward needs to know about its
shape (the key span, the slot range) the host already knows. On CUDA, decode and verify forwards run at
static shapes, captured as CUDA graphs (graphs.py; `EngineConfig.cuda_graphs`); prefill stays eager.

An eager forward is planned as one or more `Part`s: a prefill's rows, or rows continuing their sequences
(decode, verify). A decode step with admissions riding in it (`mixed`) is two parts in one forward: the
running rows' newest tokens and the admitted rows' prompts, packed into one row of tokens, so the
projections, norms and MLP run once over all of them (model/attention.py MixedBatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_trainer.engine.config import EngineConfig
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.hostclock import FORWARDS, HostClock
from reference_trainer.engine.kv_cache import SlotManager
from reference_trainer.engine.mixed import Key, MixedForward
from reference_trainer.engine.sampler import SamplerOps, SlotParams
from reference_trainer.engine.sequence import Sequence
from reference_trainer.engine.transfers import PAD_ID, padded, upload
from reference_trainer.model.attention import CachedBatch, MixedBatch, resolve_attention
from reference_trainer.model.decoder import DecoderLM


@dataclass
class Scored:
    """The rows a step samples from, in sequence order (a verified sequence has one row per position)."""

    logits: torch.Tensor | None  # [N, V] float32; None when `sampled`
    slots: torch.Tensor | None  # [N] long: the slot of each row's sequence
    positions: torch.Tensor | None  # [N] long: the position, in its sequence, of the token drawn from the row
    drafts: torch.Tensor | None = None  # [N] long (extend): the input token after the row, -1 after the last
    sampled: tuple[torch.Tensor, torch.Tensor] | None = None  # (tokens, log-probs) a decode graph drew


@dataclass
class Part:
    """One part of an eager forward, planned on the host: `rows` rows of `width` tokens (right-padded),
    each continuing at its start in its slot or block table (`where`), and which of its rows x width
    outputs are sampled (`select`, flat, in sampling order)."""

    ids: list[int]
    starts: list[int]
    where: list[int]
    rows: int
    width: int
    select: list[int]
    key_len: int  # positions attended to: at least every row's last position + 1
    num_new: list[int] | None = None  # real tokens per row, where the padding must not be written
    slot_range: tuple[int, int] | None = None  # contiguous layout: the consecutive slots the rows cover
    fresh: bool = False  # every row starts at position 0 (attention.CachedBatch.fresh)


class ModelRunner:
    def __init__(
        self,
        model: DecoderLM,
        config: EngineConfig,
        slots: SlotManager,
        sampling: SlotParams | None = None,
        clock: HostClock | None = None,
    ) -> None:
        """`sampling`: the engine's per-slot sampling table, which the graph path's decode samples from;
        `clock`: the engine's host clock, charged the upload (sampling) and the forward (forwards)."""
        self.model = model
        self.clock = clock or HostClock()
        self.config = config
        self.slots = slots
        self.device = next(model.parameters()).device
        self.attention = resolve_attention(config.attention, self.device)  # decode and verify forwards
        # Forwards at their own shapes (prefill, and decode without graphs) vary with every batch: compiled
        # flex would compile each shape (flex.py), so on CUDA they attend with SDPA's fused kernel instead.
        compiled_flex = self.attention == "flex" and self.device.type == "cuda"
        self.own_shape_attention = "sdpa" if compiled_flex else self.attention
        self.static: StaticForward | None = None  # the graph path (graphs.py); None: own-shape forwards
        if config.cuda_graphs and self.device.type == "cuda":
            self.static = StaticForward(
                model, slots, config.max_verify_tokens, True, self.attention, sampling=sampling
            )
        self._admitting: MixedForward | None = None

    @property
    def admitting(self) -> MixedForward | None:
        """The static path of decode steps with admissions riding in them (mixed.py), over `static`'s
        buffers and graph pool: None without a sampling static forward."""
        static = self.static
        if static is None or static.sampling is None:
            return None
        if self._admitting is None or self._admitting.static is not static:
            self._admitting = MixedForward(static, self.config.max_prefill_tokens)
        return self._admitting

    def admitting_key(self, running: list[Sequence], admitted: list[Sequence]) -> Key | None:
        """The static shape a decode step of `running` with `admitted` riding in it runs at (None: it runs
        eagerly: no static path, a resumed admission, or past the buckets)."""
        admitting = self.admitting
        prompts = [s.all_ids[s.num_cached :] for s in admitted]
        fresh = all(s.num_cached == 0 for s in admitted)
        if admitting is None or not admitting.fits(len(running), prompts, fresh):
            return None
        ops = SamplerOps.of([s.params for s in running + admitted])
        return admitting.key(len(running), prompts, max(s.num_cached for s in running) + 1, ops)

    # ---- the entry points --------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> Scored:
        """Store each sequence's uncached tokens (prompt, plus response when resuming); one row per
        sequence: the logits after its last token."""
        part = self._prefill_part(seqs)
        sample = {"slots": [s.slot for s in seqs], "positions": [s.length for s in seqs]}
        logits, inputs = self._run([part], sample)  # type: ignore[dict-item]
        for seq in seqs:
            seq.num_cached = seq.length
        return Scored(logits, inputs["slots"], inputs["positions"])

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], ops: SamplerOps | None = None) -> Scored:
        """Feed each sequence's newest token; one row per sequence (sampled already on the graph path, with
        the sequences' sampler ops: `ops` where the caller has them)."""
        static = self.static
        if static is not None and static.sampling is not None and static.fits(len(seqs), 1):
            slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
            starts = [s.num_cached for s in seqs]
            ends = [start + 1 for start in starts]  # also the position of the token each row draws
            self.slots.reserve_each(slots, ends)
            ops = ops or SamplerOps.of([s.params for s in seqs])
            with self.clock.forwards:  # its upload into static buffers, the graph's replay and sampling
                sampled = static.decode([s.last_token for s in seqs], starts, slots, ends, ops)
            scored = Scored(None, None, None, sampled=sampled)
        else:
            scored = self._continue(seqs, [[s.last_token] for s in seqs], verify=False)
        for seq in seqs:
            seq.num_cached = seq.length
        return scored

    @torch.inference_mode()
    def mixed(
        self, running: list[Sequence], admitted: list[Sequence], rows: list[list[int]] | None = None
    ) -> Scored:
        """A decode or verify step with admissions riding in it, in one eager forward: the running
        sequences' rows (their newest token, or with `rows` a verify's tokens: one sampled row per token,
        `drafts` set, `num_cached` left to the caller as for `extend`), then the admitted sequences'
        uncached tokens (one row each: the logits after their last token, `drafts` -1)."""
        verify = rows is not None
        if not verify and self.admitting_key(running, admitted) is not None:
            return self._mixed_static(running, admitted)
        rows = rows if rows is not None else [[s.last_token] for s in running]
        decode = self._continue_part(running, rows)
        # The running part first: in the contiguous layout its packed slot range may write padding into an
        # admitted row's slot, which the prefill part then overwrites in the same layer (MixedBatch).
        prefill = self._prefill_part(admitted)
        sample = self._sample_rows(running, rows, verify)
        sample["slots"] += [s.slot for s in admitted]  # type: ignore[misc]
        sample["positions"] += [s.length for s in admitted]
        if verify:
            sample["drafts"] += [-1] * len(admitted)
        logits, inputs = self._run([decode, prefill], sample)
        for seq in admitted if verify else running + admitted:
            seq.num_cached = seq.length
        return Scored(logits, inputs["slots"], inputs["positions"], inputs.get("drafts"))

    def _mixed_static(self, running: list[Sequence], admitted: list[Sequence]) -> Scored:
        """`mixed`'s decode step on the static path (mixed.py): sampled inside the forward."""
        admitting = self.admitting
        assert admitting is not None
        slots: list[int] = [s.slot for s in running]  # type: ignore[misc]
        starts = [s.num_cached for s in running]
        self.slots.reserve_each(slots, [start + 1 for start in starts])
        admitted_slots: list[int] = [s.slot for s in admitted]  # type: ignore[misc]
        prompts = [s.all_ids for s in admitted]  # fresh: nothing of them is cached
        for slot, prompt in zip(admitted_slots, prompts, strict=True):
            self.slots.reserve(slot, len(prompt))
        ops = SamplerOps.of([s.params for s in running + admitted])
        with self.clock.forwards:  # its upload into static buffers, the forward and sampling
            sampled = admitting.run(
                [s.last_token for s in running], starts, slots, prompts, admitted_slots, ops
            )
        for seq in running + admitted:
            seq.num_cached = seq.length
        return Scored(None, None, None, sampled=sampled)

    @torch.inference_mode()
    def extend(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> Scored:
        """Append several tokens per sequence in one forward (speculative verification): one row per new
        token, with `drafts` set.

        The tokens are written into the cache but `num_cached` is left to the caller, who rolls back
        rejected positions simply by not counting them.
        """
        return self._continue(seqs, new_tokens, verify=True)

    # ---- planning ----------------------------------------------------------------------------------------
    def _prefill_part(self, seqs: list[Sequence]) -> Part:
        """The part that stores each sequence's uncached tokens and samples after its last one."""
        rows = [s.all_ids[s.num_cached :] for s in seqs]
        starts = [s.num_cached for s in seqs]
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        lengths = [len(r) for r in rows]
        width = max(lengths)
        # A shorter row's padding is written at the row's own next positions, reserved for it (as decode and
        # verify do), where nothing reads it before a real token overwrites it: no mask of real tokens, whose
        # boolean indexing would make the host wait for the device. Only where that room would pass a
        # sequence's length does the prefill mask its padding instead (host-known, rare).
        masked = min(lengths) != width and max(starts) + width > self.slots.max_len
        for slot, row, start in zip(slots, rows, starts, strict=True):
            self.slots.reserve(slot, start + (len(row) if masked else width))
        return Part(
            ids=padded(rows, width),
            starts=starts,
            where=self.slots.where(slots),
            rows=len(seqs),
            width=width,
            select=[b * width + n - 1 for b, n in enumerate(lengths)],
            key_len=max(starts) + width,
            num_new=lengths if masked else None,
            fresh=max(starts) == 0,
        )

    def _continue_part(self, seqs: list[Sequence], rows: list[list[int]]) -> Part:
        """The part continuing each sequence at its first uncached position with its row of tokens, every
        position sampled.

        Rows are right-padded to the widest, and the padding is written into the cache like real tokens:
        at the row's own next positions, which nothing reads before a real token overwrites them (as for
        rejected drafts). Each row reserves room for the padding, so no write needs a mask. In the
        contiguous layout, a batch that fills at least half of its range of slots [lo, hi) runs over the
        whole range (attention then reads the cache as a view); idle slots in it get a dummy row at position
        0 of their own slot, which nothing reads."""
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        starts = [s.num_cached for s in seqs]
        width = max(len(r) for r in rows)
        self.slots.reserve_each(slots, [start + width for start in starts])
        key_len = max(starts) + width
        lo, hi = min(slots), max(slots) + 1
        if not (self.slots.contiguous and len(rows) * 2 >= hi - lo):
            select = [b * width + j for b, row in enumerate(rows) for j in range(len(row))]
            return Part(
                padded(rows, width), starts, self.slots.where(slots), len(rows), width, select, key_len
            )
        packed: list[list[int]] = [[PAD_ID]] * (hi - lo)
        packed_starts = [0] * (hi - lo)
        for slot, row, start in zip(slots, rows, starts, strict=True):
            packed[slot - lo], packed_starts[slot - lo] = row, start
        if width == 1:  # a decode step (the host's hot path)
            select = [slot - lo for slot in slots]
        else:
            select = [
                (slot - lo) * width + j
                for slot, row in zip(slots, rows, strict=True)
                for j in range(len(row))
            ]
        return Part(
            padded(packed, width), packed_starts, [], hi - lo, width, select, key_len, slot_range=(lo, hi)
        )

    def _sample_rows(self, seqs: list[Sequence], rows: list[list[int]], verify: bool) -> dict[str, list[int]]:
        """The sampled rows of sequences continuing with `rows` of tokens: each row's slot and the position
        of the token drawn from it (one per token); a verify's also its draft token (-1 at the end)."""
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        starts = [s.num_cached for s in seqs]
        if all(len(r) == 1 for r in rows):  # a decode step (the host's hot path)
            sample = {"slots": slots, "positions": [start + 1 for start in starts]}
        else:
            sample = {
                "slots": [slot for slot, row in zip(slots, rows, strict=True) for _ in row],
                "positions": [
                    start + j + 1 for start, row in zip(starts, rows, strict=True) for j in range(len(row))
                ],
            }
        if verify:
            sample["drafts"] = [t for row in rows for t in row[1:] + [-1]]
        return sample

    def _continue(self, seqs: list[Sequence], rows: list[list[int]], verify: bool) -> Scored:
        """One forward continuing each sequence with its row of tokens (`_continue_part`): on the static path
        where one fits, else eagerly."""
        slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
        starts = [s.num_cached for s in seqs]
        sample = self._sample_rows(seqs, rows, verify)
        width = max(len(r) for r in rows)
        if self.static is not None and self.static.fits(len(rows), width):
            width = self.static.width_bucket(width)  # a verify's rows padded up to its graph's width
            self.slots.reserve_each(slots, [start + width for start in starts])
            # Which of the forward's [rows x width] outputs each sampled row is (none needed when all are).
            order = [b * width + j for b, row in enumerate(rows) for j in range(len(row))]
            with self.clock.forwards:
                hidden, inputs = self.static.run(rows, starts, slots, {"index": order, **sample})
                flat = hidden.view(-1, hidden.shape[-1])
                picked = flat[: len(rows)] if width == 1 else flat[inputs["index"]]
                logits = self.model.logits(picked).float()
        else:
            logits, inputs = self._run([self._continue_part(seqs, rows)], sample)
        return Scored(logits, inputs["slots"], inputs["positions"], inputs.get("drafts"))

    # ---- running -----------------------------------------------------------------------------------------
    def _run(
        self, parts: list[Part], sample: dict[str, list[int]]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One eager forward over `parts` (one upload of every part's inputs, `sample`'s per-row lists and
        the sampled outputs' indices): the logits of the sampled outputs [S, V], and the uploaded views."""
        select, offset = [], 0
        for part in parts:
            select += [offset + i for i in part.select]
            offset += part.rows * part.width
        everything = offset == len(select) and select == list(range(offset))  # no selection needed
        host: dict[str, list[int]] = {"ids": [t for p in parts for t in p.ids]}
        for i, p in enumerate(parts):
            host |= {f"starts{i}": p.starts, f"where{i}": p.where}
            host |= {f"num_new{i}": p.num_new} if p.num_new is not None else {}
        host |= sample | ({} if everything else {"select": select})
        with self.clock.sampling:  # the upload, then the forward: one clock read between them
            inputs = upload(host, self.device)
            self.clock.switch(FORWARDS)
            batches = [self._batch(p, inputs, i) for i, p in enumerate(parts)]
            if len(parts) == 1:
                ids, batch = inputs["ids"].view(parts[0].rows, parts[0].width), batches[0]
            else:  # one row of every part's tokens
                ids = inputs["ids"].view(1, offset)
                batch = MixedBatch([(b, p.rows, p.width) for b, p in zip(batches, parts, strict=True)])
            logits = self.model.forward_cached(ids, batch, select=None if everything else inputs["select"])
            return logits.view(-1, logits.shape[-1]), inputs

    def _batch(self, part: Part, inputs: dict[str, torch.Tensor], i: int) -> CachedBatch:
        where = inputs[f"where{i}"]
        if part.slot_range is not None:
            where = torch.arange(*part.slot_range, device=self.device)
        elif not self.slots.contiguous:
            where = where.view(part.rows, -1)
        return CachedBatch(
            inputs[f"starts{i}"],
            part.width,
            self.slots.cache,
            where,
            num_new=inputs[f"num_new{i}"] if part.num_new is not None else None,
            contiguous=part.slot_range is not None,
            key_len=part.key_len,
            slot_range=part.slot_range,
            attention=self.own_shape_attention,
            fresh=part.fresh,
        )
