"""rhymerl-length-stability and rhymerl-reuse: rank stability and drafter reuse on hand-made data, the
specs' rules, and both reproductions end to end on a tiny workload sharing one recorded run."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_trainer.trace.records import read_jsonl
from rlbench.reproduce import history
from rlbench.reproduce.base import Context
from rlbench.reproduce.history import Workload, draftable, rank_stability, reuse_counts
from rlbench.reproduce.spec import load_specs

# Room for the embedded model to end its arith answers, which often run past 24 tokens: cut at 24, every
# response of an epoch can have the same length, and a rank correlation of equal lengths is undefined.
TINY = Workload(epochs=2, pool=4, prompts_per_step=4, group_size=2, max_tokens=48)


def test_rank_stability_counts_moves_beyond_ten_percent_of_the_pool():
    base = [float(10 * i) for i in range(10)]
    epoch2 = base[:]  # same order
    epoch3 = base[:]
    epoch3[0], epoch3[9] = epoch3[9], epoch3[0]  # the shortest and the longest swap: both move 9 ranks
    epoch3[4], epoch3[5] = epoch3[5], epoch3[4]  # neighbours swap: 1 rank, not more than 10% of 10
    got = rank_stability([[a, b, c] for a, b, c in zip(base, epoch2, epoch3, strict=True)])
    first, second = got["pairs"]
    assert first == {"epochs": "1→2", "spearman": pytest.approx(1.0), "moved": 0, "moved_share": 0.0}
    # Spearman = 1 - 6 sum d^2 / (n (n^2 - 1)), d^2 summing to 2 x 81 + 2 x 1
    assert second["spearman"] == pytest.approx(1 - 6 * 164 / (10 * 99))
    assert second["moved"] == 2 and second["moved_share"] == pytest.approx(0.2)
    assert got["moved_share"] == pytest.approx(2 / 20)
    assert got["ranks"][2][0] == 10.0 and got["ranks"][2][9] == 1.0


def test_rank_stability_averages_ties():
    got = rank_stability([[5.0, 5.0], [5.0, 9.0], [1.0, 1.0]])
    assert got["ranks"] == [[2.5, 2.5, 1.0], [2.0, 3.0, 1.0]]
    assert got["pairs"][0]["moved"] == 2  # 0.5 ranks > 10% of 3 prompts


def test_draftable_asks_the_histospec_drafter_token_by_token():
    hist = [[1, 2, 3, 4]]
    # The first token: from an empty prefix the drafter proposes the history's most frequent token (1),
    # which holds only 1/5 of the root's continuations: under the default confidence cut 0.5 no draft.
    assert draftable(hist, [[1, 2, 3, 4]]) == [[False, True, True, True]]
    assert draftable(hist, [[1, 2, 3, 4]], min_confidence=0.0) == [[True, True, True, True]]
    # 9 is not in the history: it is not drafted, nor is the token after it (no match left); after 3, 4 is.
    assert draftable(hist, [[1, 2, 9, 3, 4]]) == [[False, True, False, False, True]]
    # After [1, 2] the history continues with 3 twice and 4 once: the drafter proposes 3.
    assert draftable([[1, 2, 3], [1, 2, 4], [1, 2, 3]], [[1, 2, 4], [1, 2, 3]]) == [
        [False, True, False],
        [False, True, True],
    ]
    assert draftable([], [[1, 2]]) == [[False, False]]  # no history, no drafts


def test_reuse_counts_scores_against_own_and_another_prompts_history():
    table = {
        "a": [[[1, 2, 3, 4]], [[1, 2, 3, 4], [1, 2, 9]]],
        "b": [[[5, 6, 7]], [[5, 6, 7]]],
    }
    rows = reuse_counts(table)
    assert rows == [
        {"pair": 0, "prompt_id": "a", "tokens": 7, "hits": 4, "hits_other_prompt": 0},
        {"pair": 0, "prompt_id": "b", "tokens": 3, "hits": 2, "hits_other_prompt": 0},
    ]
    assert history._share(rows) == pytest.approx(6 / 10)


def test_specs_decide_on_the_measured_keys():
    specs = load_specs()
    length, reuse = specs["rhymerl-length-stability"], specs["rhymerl-reuse"]
    good = {"epoch_pairs": 5, "prompts": 48, "spearman_mean": 0.9, "rank_moved_over_10pct_share": 0.05}
    assert length.verdict(good)[0] == "reproduced"
    assert length.verdict({**good, "rank_moved_over_10pct_share": 0.2})[0] == "not reproduced"
    assert length.verdict({**good, "prompts": 8})[0] == "inconclusive"
    assert reuse.verdict({"epoch_pairs": 5, "tokens_scored": 9000, "reuse_share": 0.8})[0] == "reproduced"
    assert reuse.verdict({"epoch_pairs": 5, "tokens_scored": 9000, "reuse_share": 0.6})[0] == "not reproduced"
    assert reuse.verdict({"epoch_pairs": 1, "tokens_scored": 9000, "reuse_share": 0.9})[0] == "inconclusive"


def test_both_reproductions_share_one_recorded_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Workload, "for_context", classmethod(lambda cls, ctx: TINY))
    lines: list[str] = []

    def ctx(name: str) -> Context:
        return Context(device="cpu", quick=True, model=None, work_dir=tmp_path / name / "cpu" / "work",
                       progress=lines.append)  # fmt: skip

    out = history.length_stability(ctx("rhymerl-length-stability"))
    assert out.measured["prompts"] == 4 and out.measured["epoch_pairs"] == 1
    assert -1.0 <= out.measured["spearman_mean"] <= 1.0
    assert 0.0 <= out.measured["rank_moved_over_10pct_share"] <= 1.0
    assert [h for h, _ in out.sections] == ["Rank stability", "Per-prompt lengths"]
    run = tmp_path / "rhymerl-length-stability" / "cpu" / "work" / "run"
    # The recorded token ids are the trace's trained sequences, one for one.
    rows, events = read_jsonl(run / "responses.jsonl"), read_jsonl(run / "trace.jsonl")
    recorded = {(r["step"], r["prompt_id"], r["sample"]): len(r["tokens"]) for r in rows}
    traced = {(e["step"], e["prompt_id"], e["sample"]): e["response_tokens"] for e in events
              if e["kind"] == "sequence" and e["status"] == "finished"}  # fmt: skip
    assert recorded == traced and len(recorded) == TINY.pool * TINY.group_size * TINY.epochs

    got = history.reuse(ctx("rhymerl-reuse"))  # the sibling's finished run: no second training run
    assert any(line.startswith("reusing the finished run") for line in lines)
    assert not (tmp_path / "rhymerl-reuse" / "cpu" / "work" / "run").exists()
    m = got.measured
    assert m["tokens_scored"] == sum(n for (step, _, _), n in recorded.items() if step >= 1)
    assert 0.0 <= m["reuse_share"] <= m["reuse_share_top1"] <= 1.0
    assert m["epoch_pairs"] == 1 and len(got.data["per_prompt"]) == TINY.pool
