"""The speculator: the reference engine's `Speculation` hook (engine/protocol.py), which keeps the choices.

Before each decode step the engine asks it for drafts (`propose`); it asks its drafter for each running
sequence's draft and picks the verify width that pays (cost.py `verify_width`, from the engine's timed cost
table, corrected online by observed step times, and the running acceptance). Width 0 is a plain decode step.
The engine then runs the forward itself, a plain decode or its exact `Engine.verify` (a draft token is
accepted iff it equals the token plain decoding draws at that position from the same keyed uniform, so a
seeded request emits the same tokens with or without drafts: speculation changes speed only), and reports
what it did (`observe`). A verify costing within `margin` of a decode step is taken whenever it is expected
to emit any extra token, so drafting is never switched off where verifying is free.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reference_trainer.engine.protocol import DecodeReport
from reference_trainer.engine.sequence import Sequence
from reference_trainer.option import Options, option
from reference_trainer.speculation.cost import ForwardCosts, measure_cost_model, verify_width
from reference_trainer.speculation.protocol import Drafter
from reference_trainer.trace.schema import DECODE, VERIFY

if TYPE_CHECKING:  # the engine and its sampler import torch; the options are read without it
    from reference_trainer.engine.engine import Engine
    from reference_trainer.engine.sampler import AcceptRule


@dataclass(frozen=True)
class SpeculatorOptions(Options):
    """The Speculator's options (`spec.*`), taken with any drafter."""

    cost_model: list[list[float]] | None = option(None, "[[batch, q, seconds], ...]; none = measure")
    margin: float = option(0.05, "verify must beat decode by this share or cost within it", minimum=0)
    prior_acceptance: float = option(0.7, "acceptance assumed before any is seen", minimum=0)
    prior_weight: float = option(8.0, "weight of that prior, in draft positions", minimum=0)
    decay: float = option(0.98, "per-step decay of the acceptance counts", minimum=0)
    cost_batches: tuple[int, ...] = option((1, 4, 16, 64), "batch sizes the cost table times")
    cost_qs: tuple[int, ...] = option((1, 2, 4, 8, 16), "verify widths the cost table times")
    cost_repeats: int = option(3, "timing repeats per cost-table cell", minimum=1)


class Speculator:
    """Drafting and the verify-width choice, attached to one Engine as its decode-step hook."""

    def __init__(
        self,
        drafter: Drafter,
        options: SpeculatorOptions | None = None,
        accept_rule: AcceptRule | None = None,
        cost_model: ForwardCosts | None = None,
    ) -> None:
        """`cost_model`: a table already at hand (else `options.cost_model`'s rows, else timed on attach)."""
        from reference_trainer.engine.sampler import coupled_accept

        self.options = o = options or SpeculatorOptions()
        if cost_model is None and o.cost_model is not None:
            cost_model = ForwardCosts.from_rows(o.cost_model)
        self.drafter, self.cost_model, self.margin = drafter, cost_model, o.margin
        self.prior_acceptance, self.prior_weight, self.decay = o.prior_acceptance, o.prior_weight, o.decay
        self.cost_args = {"batches": o.cost_batches, "qs": o.cost_qs, "repeats": o.cost_repeats}
        self.accept_rule = accept_rule or coupled_accept
        # Decayed counts of verified draft positions: each is accepted with probability ~alpha. Decaying
        # towards the prior lets a speculator that stopped verifying (low alpha) try again later.
        self._tried, self._accepted = 0.0, 0.0
        # Observed / predicted step time, per kind: what the table misses (sampling, Python, context).
        # Verify takes decode's correction until it has been observed itself.
        self.correction: dict[str, float | None] = {"decode": 1.0, "verify": None}
        self.engine: Engine | None = None

    def attach(self, engine: Engine) -> Speculator:
        """Become `engine`'s speculation hook; the cost table is timed now, before any request runs."""
        if self.cost_model is None:
            self.cost_model = measure_cost_model(engine, **self.cost_args)
        self.engine = engine
        engine.speculation = self
        return self

    # ---- the chooser -------------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self._accepted + w * self.prior_acceptance) / (self._tried + w)

    def choose_width(self, draft_lens: Seq[int]) -> int:
        """Draft tokens per row to verify this step (0 = plain decode): `verify_width` on the cost table
        corrected by the observed step times (verify takes decode's correction until it has been seen)."""
        assert self.cost_model is not None
        decode_corr = self.correction["decode"] or 1.0
        corrections = (decode_corr, self.correction["verify"] or decode_corr)
        return verify_width(self.cost_model, draft_lens, self.alpha, self.margin, *corrections)

    def free_rows(self, batch: int, want: int) -> int:
        """The cost gate of lookahead (rollout/base.py BubbleFill): how many of `want` more rows may join
        decode steps of `batch` rows while a step costs at most `margin` more, from the cost table. Filling
        the bubble pays only where its slots are free: on a GPU, whose decode is memory-bound, most of them;
        on a CPU, whose decode time grows with the batch, few or none, so there lookahead leaves the rollout
        as fast as plain decoding."""
        assert self.cost_model is not None
        limit = (1.0 + self.margin) * self.cost_model.cost(max(batch, 1), 1)
        n = max(0, want)
        while n > 0 and self.cost_model.cost(batch + n, 1) > limit:
            n -= 1
        return n

    def add_history(self, prompt_ids: list[int], response_ids: list[int], epoch: int) -> None:
        """A response another worker generated, as history for this one's drafter (HistoPipe moves prompts
        between workers)."""
        self.drafter.add_response(prompt_ids, response_ids, epoch)

    # ---- the engine's hook -------------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]] | None:
        """Each sequence's draft (at most its room), cut to the width that pays; None: a plain decode."""
        drafts = [
            self.drafter.draft(s, room) if room > 0 else [] for s, room in zip(seqs, rooms, strict=True)
        ]
        q = self.choose_width([len(d) for d in drafts])
        self._tried *= self.decay
        self._accepted *= self.decay
        return [d[:q] for d in drafts] if q > 0 else None

    def observe(self, report: DecodeReport) -> None:
        """The step's time corrects its kind's cost; a verify's acceptances feed the drafter and alpha."""
        assert self.cost_model is not None
        if report.seconds is not None:
            kind = DECODE if report.drafts is None else VERIFY
            predicted = self.cost_model.cost(len(report.seqs), report.width)
            ratio = min(max(report.seconds / predicted, 0.05), 20.0)
            old = self.correction[kind]
            self.correction[kind] = ratio if old is None else 0.9 * old + 0.1 * ratio
        if report.drafts is None or report.accepted is None:
            return
        for seq, d, n_acc in zip(report.seqs, report.drafts, report.accepted, strict=True):
            self.drafter.observe(seq, len(d), n_acc)
            if d:  # positions actually tested: the accepted ones plus the first rejected one
                self._tried += min(n_acc + 1, len(d))
                self._accepted += n_acc

    def released(self, seq: Sequence) -> None:
        """A finished response becomes history under the policy version that wrote it."""
        assert self.engine is not None
        self.drafter.on_done(seq, self.engine.policy_version)
