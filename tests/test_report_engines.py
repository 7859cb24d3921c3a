"""An engine lost mid-step on the profile and compare pages: the engines section's tables and the slot
timeline's mark name the engine, the step, the time and the requests dispatched again; a run that lost no
engine shows none of it."""

from __future__ import annotations

import json

from test_report import synthetic_trace

from reference_trainer.trace import metrics
from reference_trainer.trace.schema import engine_lost_event
from rlbench.report.compare_report import render_compare
from rlbench.report.profile_report import render_profile

NO_GPU = {"available": False, "reason": "no GPU here", "samples": []}
SAID = "engine 1 lost in step 1 at"


def _run(tmp_path, name: str, lost: bool) -> tuple[dict, list[dict]]:
    events = synthetic_trace(workers=2)
    if lost:  # engine 1 dies a quarter into step 1's rollout, holding 3 requests
        start = min(e["t_start"] for e in events if e["kind"] == "rollout" and e["step"] == 1)
        end = max(e["t_end"] for e in events if e.get("worker") == 1 and e["step"] == 1 and "slots" in e)
        events.append(engine_lost_event(start + (end - start) / 4, 1, 1, 3))
    run = tmp_path / name
    run.mkdir()
    (run / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    doc = {"run": {"mode": "baseline"}, **metrics.compute(events, NO_GPU)}
    return doc, events


def _crosses(page: str) -> list[dict]:
    """The slot timeline's (the page's first figure's) traces of crosses."""
    data = page.split("Plotly.newPlot(")[1].split(",", 1)[1].lstrip()
    figure = json.JSONDecoder().raw_decode(data)[0]
    assert any(d.get("type") == "bar" for d in figure)  # the slot timeline indeed
    return [d for d in figure if d.get("mode") == "markers" and d["marker"].get("symbol") == "x"]


def test_the_summary_names_each_lost_engine_with_its_step_time_and_requests(tmp_path):
    doc, events = _run(tmp_path, "lost", lost=True)
    (loss,) = doc["summary"]["engines_lost"]
    t = next(e["t_start"] for e in events if e["kind"] == "engine_lost")
    start = doc["steps"][1]["rollout_start"]
    assert loss == {"engine": 1, "step": 1, "t": t, "into_rollout_s": t - start, "requests": 3}
    assert _run(tmp_path, "kept", lost=False)[0]["summary"]["engines_lost"] == []


def test_the_profile_page_marks_the_lost_engine_on_its_timeline_and_in_its_table(tmp_path):
    doc, events = _run(tmp_path, "lost", lost=True)
    text = render_profile(tmp_path / "lost", doc, events).read_text()
    # the engines section: the run's row, step 1's row and the table of losses
    assert text.count(SAID) >= 3 and "3 requests dispatched again" in text
    assert "requests dispatched again</th>" in text and "into the rollout (s)" in text
    # the timeline: a cross on each of engine 1's slot tracks (and only its), its annotation and caption
    crosses = _crosses(text)
    assert len(crosses) == 1 and crosses[0]["y"] == [f"w1 slot {s}" for s in range(6)]
    assert "engine 1 lost" in text and "Red crosses and dashed lines" in text
    assert "&#x27;engine&#x27;" not in text  # the summary table says it in words, not as a Python list


def test_a_run_that_lost_no_engine_shows_no_mark(tmp_path):
    doc, events = _run(tmp_path, "kept", lost=False)
    text = render_profile(tmp_path / "kept", doc, events).read_text()
    assert "Engines: bubble" in text  # the section is there, the mark is not
    for mark in (" lost in step ", "engine 1 lost", "Red crosses", "requests dispatched again"):
        assert mark not in text, mark
    assert _crosses(text) == []
    assert "<td>engines_lost</td><td>none</td>" in text


def test_the_compare_page_names_the_lost_engine_in_its_bubble_table(tmp_path):
    lost, _ = _run(tmp_path, "lost", lost=True)
    kept, _ = _run(tmp_path, "kept", lost=False)
    runs = [{"mode": "baseline", **kept}, {"mode": "sorted", **lost}]
    text = render_compare(tmp_path, {"baseline": "baseline", "runs": runs}).read_text()
    assert "engines lost" in text and SAID in text
    only_kept = render_compare(tmp_path, {"baseline": "baseline", "runs": runs[:1]}).read_text()
    assert "engines lost" not in only_kept and SAID not in only_kept
