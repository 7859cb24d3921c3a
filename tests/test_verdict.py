"""The comparison's verdict lines and the ledger's legend (rlbench/report/verdict.py, ledger_legend.py), on
fixed inputs: which mode is faster, by how much, why, at what cost to what is trained, and on a GPU replay;
each ledger number's meaning and the threshold that marks it worrying."""

from __future__ import annotations

from pathlib import Path

from rlbench.report.compare_report import render_compare
from rlbench.report.compare_summary import compare_doc, summary_lines
from rlbench.report.ledger_legend import BY_KEY, FIELDS, flags, legend_lines
from rlbench.report.verdict import fitted, span, verdict_block, verdict_lines


def _summary(step: float, gen: float, update: float, length: float, bubble: float, **ledger: float) -> dict:
    return {"step_time_s": step, "timing_s/gen": gen, "timing_s/update": update, "timing_s/reward": 0.0,
            "bubble_ratio": bubble, "rollout_tokens": 3000, "trained_tokens": 1000,
            "response_len_mean": length, "response_len_max": 2 * length, **ledger}  # fmt: skip


def _runs(*modes: tuple[str, dict, list[float]]) -> list[dict]:
    return [
        {"mode": m, "summary": s, "steps": [{"step": i, "step_time_s": t} for i, t in enumerate(times)]}
        for m, s, times in modes
    ]


BASE = _summary(9.0, 2.0, 7.0, 40.0, 0.5, long_decile_trained_share=1.0, trained_vs_generated_ks=0.0)
SORTED = _summary(5.0, 1.95, 3.05, 20.0, 0.04, long_decile_trained_share=0.29, trained_vs_generated_ks=0.41)
REPLAY = {
    "baseline": "baseline",
    "calibration": {"device": "NVIDIA H200"},
    "speedup": {"sorted": [{"step": 0.52}, {"step": 0.71}, {"step": 0.88}]},
}


def test_precision_fits_the_spread() -> None:
    assert fitted(1.6912, 1.6, 1.9) == "1.7"  # a spread of 0.3: one decimal
    assert fitted(1.6912, 1.68, 1.70) == "1.69"  # of 0.02: two
    assert fitted(12.3, 10.0, 14.0) == "12"  # of 4: none
    assert fitted(1.6912) == "1.69"  # one round: no spread known, two decimals
    assert span(0.52, 0.88) == "0.5-0.9x" and span(1.0, 1.0) == "1.00x"


def test_one_verdict_line_per_mode_says_how_much_why_at_what_cost_and_on_a_gpu() -> None:
    runs = _runs(("baseline", BASE, [9.0, 9.0]), ("sorted", SORTED, [6.0, 4.3]))
    lines = verdict_lines(compare_doc(runs, "baseline"), REPLAY)
    reference = "baseline: the reference, 9 s per step (rollout 2 s, update 7 s); its slots idle 50%"
    assert lines[0] == f"{reference} of the rollout"
    assert lines[1] == (
        "sorted: 1.8x faster steps (rounds 1.5-2.1x; update -4 s: it trains on shorter responses, 20 vs 40 "
        "tokens; rollout unchanged (±0.05 s)) · trains 29% of the longest tenth · length KS, trained vs "
        "generated 0.41: strong length bias · replayed on NVIDIA H200 (a model): 0.5-0.9x"
    )  # fmt: skip


def test_compare_prints_the_verdict_from_its_document_alone() -> None:
    runs = _runs(("baseline", BASE, [9.0, 9.0]), ("sorted", SORTED, [6.0, 4.3]))
    block = verdict_block({"baseline": "baseline", "runs": runs, "gpu_replay": REPLAY})
    assert block[0] == "verdict:" and len(block) == 3
    assert block[2].startswith("  sorted: 1.8x faster steps (rounds 1.5-2.1x; update -4 s")
    assert block[2].endswith("· replayed on NVIDIA H200 (a model): 0.5-0.9x")


def test_a_slower_mode_and_a_missing_baseline_are_said_as_such() -> None:
    slow = _summary(12.0, 2.0, 10.0, 40.0, 0.5, run_ahead=True)
    runs = _runs(("baseline", BASE, [9.0]), ("async", slow, [12.0]))
    line = verdict_lines(compare_doc(runs, "baseline"))[1]
    assert line.startswith("async: 1.33x slower steps (update +3 s: its update runs beside the rollout")
    only = _runs(("sorted", SORTED, [5.0]))
    assert verdict_lines(compare_doc(only, "baseline")) == [
        "no 'baseline' run in this comparison: no speed-ups to state"
    ]


def test_the_ledger_flags_what_is_worrying_judged_as_shown() -> None:
    said = flags({"trained_vs_generated_ks": 0.41, "long_decile_trained_share": 0.95, "staleness_mean": 0.0})
    assert said == ["length KS, trained vs generated 0.41: strong length bias"]  # 95% of the tenth: fine
    assert flags({"trained_vs_generated_ks": 0.298}) == [
        "length KS, trained vs generated 0.30: strong length bias"  # shown as 0.30, judged as 0.30
    ]
    starving = flags({"long_decile_trained_share": 0.4, "reward_completed": 0.1, "reward_all": 0.08})
    assert starving == [
        "longest 10% trained 40%: strong starving of long samples",
        "reward, completed vs all 20%: some reward inflation",
    ]
    assert flags({}) == [] and flags({"reward_completed": 0.0, "reward_all": 0.0}) == []


def test_every_ledger_number_has_its_meaning_and_thresholds_in_the_terminal() -> None:
    lines = legend_lines()
    for field in FIELDS:
        assert any(line.startswith(f"  {field.name}: {field.meaning}; some ") for line in lines)
    assert "strong at or below 50%" in BY_KEY["long_decile_trained_share"].when()
    assert "sync-overhead = both sides wait" in lines[-1]
    runs = _runs(("baseline", BASE, [9.0]), ("sorted", SORTED, [5.0]))
    printed = summary_lines({"baseline": "baseline", "runs": runs})
    worrying = [line.strip() for line in printed if line.strip().startswith("worrying:")]
    assert worrying == [
        "worrying: nothing",
        "worrying: length KS, trained vs generated 0.41: strong length bias; "
        "longest 10% trained 29%: strong starving of long samples",
    ]


def test_the_compare_page_opens_with_the_verdict_and_the_ledger_legend(tmp_path: Path) -> None:
    runs = _runs(("baseline", BASE, [9.0, 9.0]), ("sorted", SORTED, [6.0, 4.3]))
    page = render_compare(tmp_path, {"baseline": "baseline", "runs": runs}).read_text()
    verdict = page.index("<h2>The verdict</h2>")
    assert verdict < page.index("<b>sorted</b>: 1.8x faster steps") < page.index("<h2>The bubble</h2>")
    ledger = page.index("<h2>What each mode trades for its speed</h2>")
    assert verdict < ledger < page.index('<table class="legend">') < page.index("<h2>The bubble</h2>")
    assert "<td>sync-overhead</td>" in page and "<td>1.80x</td>" in page  # labels explained, ratios in x
    assert "<td>sorted</td><td>4.0</td><td>-46.0</td>" in page  # shares to a tenth of a point, not 4.000


def test_the_profile_page_says_what_the_speed_costs_and_names_its_shading_above_the_timeline(
    tmp_path,
) -> None:
    from test_report import fake_gpu, synthetic_trace, write_run

    from rlbench.report.ledger_legend import cost_lines
    from rlbench.report.profile_report import render_profile

    run_dir = tmp_path / "run"
    write_run(run_dir, gpu=fake_gpu(synthetic_trace()))
    page = render_profile(run_dir).read_text()
    cost = page.index("<h2>What the speed costs in training</h2>")
    assert page.index("<h2>Summary</h2>") < cost < page.index("<h2>Slot occupancy</h2>")
    assert "<th>worrying when</th>" in page[cost:]
    timeline = page.index("<h2>Slot occupancy</h2>")
    assert timeline < page.index("Shaded: ", timeline) < page.index('<div id="fig1"', timeline)
    lines = cost_lines(
        {"trained_vs_generated_ks": 0.41, "long_decile_trained_share": 1.0, "bound": "balanced"}
    )
    assert lines[1].startswith("  length KS, trained vs generated: 0.41 (strong length bias): how far")
    assert lines[2].startswith("  longest 10% trained: 100% (fine): of the longest tenth")
    assert lines[3] == "  bound: balanced: neither side waits much"


def test_the_compare_page_names_the_baseline_the_reference_not_a_saving(tmp_path: Path) -> None:
    runs = _runs(("baseline", BASE, [9.0, 9.0]), ("sorted", SORTED, [6.0, 4.3]))
    page = render_compare(tmp_path, {"baseline": "baseline", "runs": runs}).read_text()
    base_row = page[page.index("<td>baseline</td>", page.index("produced by")) :]
    base_row = base_row[: base_row.index("</tr>")]
    assert "<td>reference</td>" in base_row and "saved" not in base_row
    sorted_row = page[page.index("<td>sorted</td>", page.index("produced by")) :]
    assert "update saved 3.95 s (99%)" in sorted_row[: sorted_row.index("</tr>")]
