"""The ledger read on the spot: what each of its numbers means and where it starts to worry, for the terminal
and the pages (the definitions: docs/metrics.md, "The ledger"; the numbers: reference_trainer/trace/).

Keyed by the names the numbers carry in a run's summary (`trained_vs_generated_ks`, ...; the comparison adds
`length_ks_vs_baseline`). A threshold marks what deserves a look, not a proof of harm: a KS distance of 0.1
is about where two samples of a few hundred lengths stop looking alike (the two-sample test's 5% critical
value is 1.36 * sqrt((n + m) / (n m)): 0.12 at n = m = 250), 0.3 a gap no sample size explains away.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from reference_trainer.trace.steps import IDLE_HIGH


@dataclass(frozen=True)
class LedgerField:
    """One ledger number: its summary key, a short name, what it means, and its two thresholds (`some`:
    worth a look, `strong`: the speed is bought with it), crossed upwards, or downwards when `low_worries`."""

    key: str
    name: str
    meaning: str
    some: float
    strong: float
    concern: str  # what a crossed threshold says, after "some" or "strong"
    low_worries: bool = False

    def level(self, value: float | None) -> int:
        """0: fine, 1: some, 2: strong (None: not measured, fine)."""
        if value is None:
            return 0
        sign = -1.0 if self.low_worries else 1.0
        return 2 if sign * value >= sign * self.strong else 1 if sign * value >= sign * self.some else 0

    def worry(self, value: float | None) -> str | None:
        level = self.level(value)
        return None if not level else f"{('some', 'strong')[level - 1]} {self.concern}"

    def when(self) -> str:
        side = "at or below" if self.low_worries else "at or above"
        some, strong = _shown(self.key, self.some), _shown(self.key, self.strong)
        return f"some {self.concern} {side} {some}, strong {side} {strong}"


FIELDS = (
    LedgerField("trained_vs_generated_ks", "length KS, trained vs generated",
                "how far the trained responses' lengths are from every generated one's (KS distance, 0-1; "
                "0: the update sees what the engine generated)", 0.1, 0.3, "length bias"),
    LedgerField("length_ks_vs_baseline", "length KS vs baseline",
                "the same distance against the baseline's trained lengths, on the prompts both trained",
                0.1, 0.3, "length bias against the baseline"),
    LedgerField("long_decile_trained_share", "longest 10% trained",
                "of the longest tenth of the generations, the share an update trained (1: all of them)",
                0.9, 0.5, "starving of long samples", low_worries=True),
    LedgerField("oldest_waiting_age_max", "oldest waiting prompt",
                "the most policy versions a prompt waited between admission and an update (0: none waited)",
                2, 4, "deferral"),
    LedgerField("staleness_mean", "staleness mean",
                "policy versions the trained tokens lag the update, on average (0: on-policy)",
                0.5, 1.5, "off-policy training"),
    LedgerField("reward_gap", "reward, completed vs all",
                "how much higher the mean reward over completed generations is than over all of them, as a "
                "share of the first (what training on completed samples only hides)",
                0.1, 0.3, "reward inflation"),
    LedgerField("trainer_wait_share", "trainer waits",
                "share of the run the trainer waited for samples", IDLE_HIGH, 0.5, "trainer idling"),
    LedgerField("rollout_wait_share", "rollout waits",
                "share of the run the rollout waited for the update", IDLE_HIGH, 0.5, "rollout idling"),
)  # fmt: skip
BY_KEY = {f.key: f for f in FIELDS}

# What each side-bound label says (metrics.bound_label: a wait share at or above IDLE_HIGH is high).
BOUNDS = {
    "rollout-bound": "the trainer waits for samples, the rollout does not wait",
    "trainer-bound": "the rollout waits for the update, the trainer does not wait",
    "sync-overhead": "both sides wait: a synchronous hand-over, weight sync or data loading between them",
    "balanced": "neither side waits much",
}


def reward_gap(summary: dict[str, Any]) -> float | None:
    """(reward over completed - over all) / |over completed|: the share of the completed samples' reward
    that the unfinished ones, left out of training, would take back."""
    done, every = summary.get("reward_completed"), summary.get("reward_all")
    return None if done is None or every is None or not done else (done - every) / abs(done)


def values(summary: dict[str, Any], versus_baseline: float | None = None) -> dict[str, float | None]:
    """The ledger's numbers of a summary, by key (reward_gap derived, the comparison's KS added)."""
    out = {k: summary.get(k) for k in BY_KEY}
    out["reward_gap"], out["length_ks_vs_baseline"] = reward_gap(summary), versus_baseline
    return out


def _shown(key: str, value: float) -> str:
    if key in ("long_decile_trained_share", "reward_gap", "trainer_wait_share", "rollout_wait_share"):
        return f"{100 * value:.0f}%"
    if key == "oldest_waiting_age_max":
        return f"{value:g} version{'s' * (value != 1)}"
    return f"{value:.2f}"


# The numbers about what is trained (the rest, the wait shares, are about where time goes).
TRAINING_KEYS = ("trained_vs_generated_ks", "length_ks_vs_baseline", "long_decile_trained_share",
                 "oldest_waiting_age_max", "staleness_mean", "reward_gap")  # fmt: skip


def flags(
    summary: dict[str, Any], versus_baseline: float | None = None, keys: tuple[str, ...] | None = None
) -> list[str]:
    """What is worrying in a run's ledger (of `keys`, default all), worst first, each with its number:
    "length KS, trained vs generated 0.41: strong length bias"."""
    found = [
        (f.level(round(v, 2)), f"{f.name} {_shown(f.key, v)}: {f.worry(round(v, 2))}")
        for f in FIELDS
        if (keys is None or f.key in keys)
        and (v := values(summary, versus_baseline)[f.key]) is not None
        and f.level(round(v, 2))  # judged as shown: "0.30" is not "some" for being 0.298
    ]
    return [text for _, text in sorted(found, key=lambda lv: -lv[0])]


def legend_lines() -> list[str]:
    """The terminal's legend: one line per number, its meaning and thresholds, then the bound labels."""
    lines = [f"  {f.name}: {f.meaning}; {f.when()}" for f in FIELDS]
    return lines + ["  bound: " + "; ".join(f"{k} = {v}" for k, v in BOUNDS.items())]


def legend_html() -> str:
    """The pages' legend: a table of the numbers (meaning, when it worries) and the bound labels."""
    rows = "".join(
        f"<tr><td>{html.escape(f.name)}</td><td>{html.escape(f.meaning)}</td>"
        f"<td>{html.escape(f.when())}</td></tr>"
        for f in FIELDS
    )
    bounds = "".join(
        f"<tr><td>{html.escape(k)}</td><td colspan=2>{html.escape(v)}</td></tr>" for k, v in BOUNDS.items()
    )
    return (
        '<table class="legend"><tr><th>number</th><th>what it means</th><th>worrying when</th></tr>'
        f"{rows}{bounds}</table>"
    )


def reading(field: LedgerField, value: float | None) -> str:
    """A number as shown, with its reading: "0.41 (strong length bias)", "100% (fine)", "n/a"."""
    if value is None:
        return "n/a"
    return f"{_shown(field.key, value)} ({field.worry(round(value, 2)) or 'fine'})"


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """`profile`'s lines: what the run's speed costs in training, one number a line with its reading and
    meaning (the numbers of one run: no baseline to set its lengths against)."""
    found = values(summary)
    lines = ["what the speed costs in training (the ledger: each number, its reading, what it means):"]
    for field in FIELDS:
        if field.key != "length_ks_vs_baseline" and found[field.key] is not None:
            lines.append(f"  {field.name}: {reading(field, found[field.key])}: {field.meaning}")
    if bound := summary.get("bound"):
        lines.append(f"  bound: {bound}: {BOUNDS.get(bound, '')}")
    return lines


def cost_html(summary: dict[str, Any]) -> str:
    """The profile page's section: the run's ledger numbers, each with its reading, meaning and thresholds."""
    found, rows = values(summary), []
    for f in FIELDS:
        if f.key != "length_ks_vs_baseline" and found[f.key] is not None:
            cells = (f.name, reading(f, found[f.key]), f.meaning, f.when())
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return '<p class="sub">No ledger in this run (it needs the trace\'s sequence events).</p>'
    if bound := summary.get("bound"):
        rows.append(
            f"<tr><td>bound</td><td>{html.escape(bound)}</td><td colspan=2>"
            f"{html.escape(BOUNDS.get(bound, ''))}</td></tr>"
        )
    head = "<tr><th>number</th><th>this run</th><th>what it means</th><th>worrying when</th></tr>"
    return f'<table class="legend">{head}{"".join(rows)}</table>'
