"""Profile and compare reports: slot-bar merging, ratios, CLI re-render, headless-Chromium render check."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import cli

from reference_trainer.trace import metrics
from rlbench.report.compare_report import render_compare
from rlbench.report.compare_summary import ratio_rows
from rlbench.report.profile_report import render_profile
from rlbench.report.timeline import slot_bars

ROOT = Path(__file__).resolve().parents[1]


def synthetic_trace(
    n_prompts: int = 8, group: int = 4, workers: int = 2, cap: int = 6, steps: int = 2
) -> list[dict]:
    """Continuous batching per worker: prefill admits into free slots, decode/verify steps emit tokens.

    Step 1 speculates (verify events with drafts) so acceptance is drawn; lengths are long-tailed as in RL.
    """
    rng = random.Random(0)
    events: list[dict] = []
    t = 0.0
    for step in range(steps):
        seqs = [(f"s{step}-p{p}-{k}", f"p{p}") for p in range(n_prompts) for k in range(group)]
        queues = [seqs[w::workers] for w in range(workers)]
        rollout_start, ends = t, []
        for w, queue in enumerate(queues):
            tw, slots, remaining, admitted, lengths = t, {}, {}, {}, {}
            queue = list(queue)
            while queue or slots:
                free = [s for s in range(cap) if s not in slots]
                new = {}
                while free and queue:
                    sid, pid = queue.pop(0)
                    slot = free.pop(0)
                    slots[slot] = new[slot] = sid
                    remaining[sid] = lengths[sid] = int(rng.lognormvariate(3.0, 0.6)) + 2
                    admitted[sid] = (tw, pid)
                if new:
                    events.append(
                        {
                            "kind": "prefill",
                            "step": step,
                            "t_start": tw,
                            "t_end": tw + 0.004,
                            "active_slots": len(new),
                            "capacity": cap,
                            "tokens": len(new),
                            "worker": w,
                            "slots": {str(k): v for k, v in new.items()},
                        }
                    )
                    tw += 0.004
                    for sid in new.values():
                        remaining[sid] -= 1
                spec = step == 1 and len(events) % 2 == 0
                emitted, drafted, accepted = {}, 0, 0
                for sid in slots.values():
                    if spec:
                        acc = rng.randint(0, 3)
                        drafted, accepted = drafted + 3, accepted + acc
                        emitted[sid] = min(remaining[sid], acc + 1)
                    else:
                        emitted[sid] = min(remaining[sid], 1)
                ev = {
                    "kind": "verify" if spec else "decode",
                    "step": step,
                    "t_start": tw,
                    "t_end": tw + 0.01,
                    "active_slots": len(slots),
                    "capacity": cap,
                    "tokens": sum(emitted.values()),
                    "worker": w,
                    "slots": {str(k): v for k, v in slots.items()},
                }
                if spec:
                    ev.update(drafted=drafted, accepted=accepted, draft_seqs=len(slots))
                events.append(ev)
                tw += 0.01 + 0.001  # scheduler overhead between steps is part of the bubble
                for slot, sid in list(slots.items()):
                    remaining[sid] -= emitted[sid]
                    if remaining[sid] <= 0:
                        del slots[slot]
                        t_admit, pid = admitted[sid]
                        n = lengths[sid]
                        events.append(
                            {
                                "kind": "sequence",
                                "step": step,
                                "id": sid,
                                "prompt_id": pid,
                                "sample": int(sid.rsplit("-", 1)[1]),
                                "prompt_tokens": 12,
                                "response_tokens": n,
                                "t_admit": t_admit,
                                "t_finish": tw,
                                "policy_versions": [step] * n,
                                "drafted": 0,
                                "accepted": 0,
                                "status": "finished",
                            }
                        )
            ends.append(tw)
        t = max(ends) + 0.002
        events.append(
            {"kind": "rollout", "step": step, "t_start": rollout_start, "t_end": t, "policy_version": step}
        )
        events.append(
            {
                "kind": "reward",
                "step": step,
                "t_start": t,
                "t_end": t + 0.05,
                "reward_mean": 0.3 + 0.2 * step,
                "accuracy": 0.25 + 0.25 * step,
            }
        )
        events.append(
            {
                "kind": "update",
                "step": step,
                "t_start": t + 0.05,
                "t_end": t + 0.3,
                "policy_version": step,
                "loss": 0.5 - 0.1 * step,
            }
        )
        t += 0.3
    return events


def fake_gpu(events: list[dict]) -> dict:
    end = max(e["t_end"] for e in events if "t_end" in e)
    samples = [{"t": i * 0.1, "gpu": 0, "util": 80.0 if i % 4 else 20.0} for i in range(int(end / 0.1) + 1)]
    return {
        "available": True,
        "reason": None,
        "devices": [{"index": 0, "name": "Fake GPU"}],
        "samples": samples,
    }


def write_run(run_dir: Path, gpu: dict | None = None) -> dict:
    events = synthetic_trace()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    gpu = (
        gpu
        if gpu is not None
        else {
            "available": False,
            "reason": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
            "samples": [],
        }
    )
    doc = {
        "run": {"mode": "sorted+rhyme", "task": "synthetic", "steps": 2},
        **metrics.compute(events, gpu),
        "gpu": gpu,
        "pyspy": {"available": False, "reason": "py-spy is not installed (pip install py-spy)"},
    }
    (run_dir / "metrics.json").write_text(json.dumps(doc))
    return doc


def test_slot_bars_merge_consecutive_steps():
    ev = [
        {
            "kind": "decode",
            "step": 0,
            "t_start": 0.0,
            "t_end": 1.0,
            "worker": 0,
            "slots": {"0": "a", "1": "b"},
        },
        {
            "kind": "decode",
            "step": 0,
            "t_start": 1.0,
            "t_end": 2.0,
            "worker": 0,
            "slots": {"0": "a", "1": "c"},
        },
        {"kind": "decode", "step": 0, "t_start": 2.0, "t_end": 3.0, "worker": 0, "slots": {"1": "c"}},
        {
            "kind": "decode",
            "step": 0,
            "t_start": 3.0,
            "t_end": 4.0,
            "worker": 0,
            "slots": {"0": "a"},
        },  # a returns
        {"kind": "decode", "step": 1, "t_start": 9.0, "t_end": 10.0, "worker": 0, "slots": {"0": "d"}},
    ]
    bars, msg = slot_bars(ev)
    got = sorted((b["slot"], b["seq"], b["start"], b["end"]) for b in bars)
    assert got == [
        ("0", "a", 0.0, 2.0),
        ("0", "a", 3.0, 4.0),
        ("0", "d", 9.0, 10.0),
        ("1", "b", 0.0, 1.0),
        ("1", "c", 1.0, 3.0),
    ]
    assert msg == ""
    bars, msg = slot_bars(ev, max_bars=3)
    assert len(bars) == 4 and "Showing steps 0–0 of 0–1" in msg  # the first step is always drawn whole


def test_synthetic_trace_is_consistent():
    events = synthetic_trace()
    doc = metrics.compute(events)
    s = doc["summary"]
    assert s["steps"] == 2 and 0.0 < s["bubble_ratio"] < 1.0
    assert s["acceptance_rate"] is not None and doc["steps"][0]["acceptance_rate"] is None
    assert set(s["worker_idle_share"]) == {"0", "1"}


def test_compare_ratios():
    runs = [
        {
            "mode": "baseline",
            "summary": {
                "step_time_s": 2.0,
                "rollout_tokens_per_s": 100.0,
                "bubble_ratio": 0.5,
                "reward_mean": 0.4,
            },
        },
        {
            "mode": "sorted",
            "summary": {
                "step_time_s": 1.0,
                "rollout_tokens_per_s": 150.0,
                "bubble_ratio": 0.1,
                "reward_mean": 0.4,
            },
        },
    ]
    base, fast = ratio_rows(runs, "baseline")
    assert base["speed-up (step time)"] == 1.0
    assert fast["speed-up (step time)"] == 2.0 and fast["generated throughput ×"] == 1.5
    assert fast["reward ×"] == 1.0 and fast["bubble (%)"] == pytest.approx(10.0)
    assert fast["bubble vs baseline (pts)"] == pytest.approx(-40.0)  # percentage points, not a ratio


def test_cli_report_rerenders_profile_and_compare(tmp_path):
    doc = write_run(tmp_path / "run")
    cmp_dir = tmp_path / "cmp"
    cmp_dir.mkdir()
    (cmp_dir / "compare.json").write_text(
        json.dumps({"baseline": "baseline", "runs": [{"mode": "baseline", **doc}, {"mode": "sorted", **doc}]})
    )
    res = cli("report", str(tmp_path / "run"), str(cmp_dir))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "run" / "report.html").read_text()
    assert page.count("<script type='text/javascript'>/**") == 1  # plotly inlined exactly once
    assert "no GPU: NVML unavailable (NVMLError_LibraryNotFound" in page
    assert "rlbench compare" in (cmp_dir / "report.html").read_text()
    res = cli("report", str(tmp_path))
    assert (
        res.returncode == 2
        and res.stderr.count("\n") == 1
        and "no metrics.json or compare.json" in res.stderr
    )


def _report_cli(run_dir: Path) -> subprocess.CompletedProcess:
    return cli("report", str(run_dir))


def _cut_mid_last_line(path: Path) -> None:
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: start + (len(data) - start) // 2])


def test_cli_report_on_a_killed_train_run(tiny_model_dir, tmp_path):
    """A real (tiny) train run whose metrics.jsonl and trace.jsonl end in half a line, as a kill leaves
    them: the report renders (exit 0) with one note per torn file; a bad middle line is file:line."""
    from reference_trainer.train.config import TrainConfig
    from reference_trainer.train.trainer import Trainer

    run_dir = tmp_path / "run"
    config = TrainConfig(
        eval_every=1,
        eval_problems=4,
        eval_samples=2,
        steps=2,
        model=str(tiny_model_dir),
        prompts_per_step=2,
        group_size=2,
        max_tokens=8,
        max_num_seqs=4,
    )
    Trainer(config, run_dir).run()
    assert [p["samples"] for p in json.loads((run_dir / "heldout.json").read_text())["curve"]] == [0, 4, 8]
    assert not (run_dir / "metrics.json").exists()  # a train run: only the JSONL logs
    for name in ("metrics.jsonl", "trace.jsonl"):
        _cut_mid_last_line(run_dir / name)
    res = _report_cli(run_dir)
    assert res.returncode == 0, res.stderr
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: ")]
    assert sorted(notes) == [
        f"note: {run_dir / name}: dropped a torn last line (kill mid-write?)"
        for name in ("metrics.jsonl", "trace.jsonl")
    ]
    page = (run_dir / "report.html").read_text()
    assert "Slot occupancy" in page and "rlbench profile — baseline" in page
    assert "Reward and held-out accuracy against samples consumed" in page
    # every held-out evaluation the run made, the final one too (issue 56: only step 0's was shown)
    held = page[page.index("<h2>Held-out evaluations</h2>") :]
    assert all(
        f"<td>{label}</td>" in held for label in ("before step 0", "before step 1", "after step 1 (final)")
    )

    lines = (run_dir / "trace.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "trace.jsonl").write_text(lines[0] + '{"kind": "decode", "t_start"\n' + "".join(lines[1:]))
    res = _report_cli(run_dir)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"error: {run_dir / 'trace.jsonl'}:2: malformed JSON row")


# --------------------------------------------------------------------------------------------------------
# headless Chromium: every figure drew, no JavaScript error

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
_HOOK = (
    "<script>function __rec(x){var h=document.documentElement;"
    "h.setAttribute('data-js-errors',(h.getAttribute('data-js-errors')||'')+x+';');}"
    "window.onerror=function(m,s,l){__rec(m+' @'+l);};"
    "window.addEventListener('unhandledrejection',function(e){__rec('rejection: '+e.reason);});</script>"
)


# After load: the page's width and the right edge of every table's widest cell (a 1,400-px window).
_WIDTH_HOOK = (
    "<script>window.addEventListener('load',function(){var h=document.documentElement;var t=[].slice.call("
    "document.querySelectorAll('table')).map(function(x){var r=0;[].slice.call(x.querySelectorAll('td,th'))"
    ".forEach(function(c){r=Math.max(r,c.getBoundingClientRect().right);});return Math.round(r);});"
    "h.setAttribute('data-widths',[h.scrollWidth,window.innerWidth].concat(t).join(','));});</script>"
)
WINDOW_PX = 1400


def render_in_chromium(page: Path, tmp_path: Path) -> str:
    """The DOM after scripts ran, from a copy of `page` with an error hook ahead of every other script, in
    a WINDOW_PX-wide window (the page's and its tables' widths are left in the html tag's data-widths)."""
    hooked = tmp_path / f"hooked-{page.parent.name}.html"
    hooked.write_text(page.read_text().replace("<head>", "<head>" + _HOOK + _WIDTH_HOOK, 1))
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW_PX},900",
                "--virtual-time-budget=10000",
                "--dump-dom",
                hooked.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def check_all_figures_drew(page: Path, tmp_path: Path) -> int:
    """Every figure drew, no JavaScript error, and the page and each table fit a WINDOW_PX-wide window."""
    html_text = page.read_text()
    n_figs = len(re.findall(r'<div id="fig\d+" class="plotly-graph-div"', html_text))
    dom = render_in_chromium(page, tmp_path)
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert "data-js-errors" not in html_tag, html_tag
    page_width, window, *tables = map(int, re.search(r'data-widths="([^"]*)"', html_tag).group(1).split(","))
    assert page_width <= window and all(right <= window for right in tables), (page_width, window, tables)
    assert dom.count('class="plot-container plotly"') == n_figs
    # every figure div got its SVG layers: the plotly-graph-div is followed by a main-svg before the next div
    for i in range(1, n_figs + 1):
        start = dom.index(f'id="fig{i}"')
        nxt = dom.find('class="plotly-graph-div"', start + 10)
        assert "main-svg" in dom[start : nxt if nxt > 0 else len(dom)], f"fig{i} drew nothing"
    return n_figs


def test_the_engines_section_appears_only_where_a_run_had_several_engines(tmp_path):
    two = write_run(tmp_path / "two")
    text = render_profile(tmp_path / "two").read_text()
    assert "Engines: bubble, cross-engine idle, dispatch" in text and "straggler" in text
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    events = synthetic_trace(workers=1)
    (one_dir / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    one = {"run": {"mode": "baseline"}, **metrics.compute(events, {"available": False, "samples": []})}
    assert "Engines: bubble" not in render_profile(one_dir, one, events).read_text()
    page = render_compare(tmp_path, {"baseline": "baseline", "runs": [{"mode": "baseline", **two}]})
    assert "cross-engine idle" in page.read_text()
    assert (
        "cross-engine idle"
        not in render_compare(
            tmp_path, {"baseline": "baseline", "runs": [{"mode": "baseline", **one}]}
        ).read_text()
    )


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_error_hook_catches_a_broken_page(tmp_path):
    (tmp_path / "bad").mkdir()
    page = tmp_path / "bad" / "report.html"
    page.write_text(
        "<!DOCTYPE html><html><head></head><body><script>notDefinedAnywhere()</script></body></html>"
    )
    dom = render_in_chromium(page, tmp_path)
    assert "notDefinedAnywhere" in re.search(r"<html[^>]*>", dom).group(0)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_profile_report_renders_in_chromium(tmp_path):
    run_dir = tmp_path / "run"
    doc = write_run(run_dir, gpu=fake_gpu(synthetic_trace()))
    page = render_profile(run_dir)
    n = check_all_figures_drew(page, tmp_path)
    # slots, bubbles, time split, throughput, acceptance, learning, lengths, GPU, workers
    assert n == 9
    assert doc["summary"]["bubble_ratio_gpu"] is not None


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_compare_report_renders_in_chromium(tmp_path):
    doc = write_run(tmp_path / "run")
    slow = json.loads(json.dumps(doc))
    for s in slow["steps"]:
        s["step_time_s"] *= 1.5
    slow["summary"]["step_time_s"] *= 1.5
    cmp_doc = {
        "baseline": "baseline",
        "runs": [{"mode": "baseline", **slow}, {"mode": "sorted+rhyme", **doc}],
    }
    page = render_compare(tmp_path / "run", cmp_doc)
    assert check_all_figures_drew(page, tmp_path) >= 6
    assert "1.5" in page.read_text()  # the speed-up of the faster mode appears in the table


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_an_import_page_with_a_wide_per_step_table_fits_the_window(tmp_path):
    """Issue 56: the TRL and verl pages' per-step tables were wider than a 1,400-px window (verl logs dozens
    of keys: "fully_async/rollouter/idle_ratio" has no space to wrap at)."""
    keys = [f"actor/{name}_{i}" for i in range(6) for name in ("pg_loss", "entropy")] + [
        "fully_async/rollouter/idle_ratio", "dynamic_resource/rollout_resource_utilization",
        "timing_s/gen", "timing_s/step", "timing_s/update_actor", "response_length/mean",
        "response_length/max",
    ]  # fmt: skip
    # the idle ratio and utilisation are shares: a reader refuses one outside [0, 1]
    shares = {"fully_async/rollouter/idle_ratio": 0.1, "dynamic_resource/rollout_resource_utilization": 0.8}
    times = {"timing_s/gen": 6.0, "timing_s/step": 11.0}
    rows = [{"step": s, "data": {k: 10.0 + s for k in keys} | shares | times} for s in range(1, 5)]
    log = tmp_path / "exp.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli("import", "verl", str(log), "--workers", "1", "--out", str(tmp_path / "verl"))
    assert res.returncode == 0, res.stderr
    check_all_figures_drew(tmp_path / "verl" / "report.html", tmp_path)


def test_a_table_wider_than_the_page_is_split_and_keeps_its_first_column() -> None:
    from rlbench.report.page import MAX_TABLE_COLUMNS, table

    row = {"step": 1, **{f"c{i}": i for i in range(25)}}
    html = table([row])
    heads = [re.findall(r"<th>(.*?)</th>", part) for part in html.split("<table>")[1:]]
    assert len(heads) == 3 and all(h[0] == "step" and len(h) <= MAX_TABLE_COLUMNS for h in heads)
    assert [c for h in heads for c in h[1:]] == [f"c{i}" for i in range(25)]  # every column, in order, once
    assert "columns 2-10 of 26" in html


def test_every_shading_is_named_in_a_legend(tmp_path):
    """Issue 56: the slot timeline's grey (held-out) and green (update) shading had no legend."""
    run_dir = tmp_path / "run"
    write_run(run_dir, gpu=fake_gpu(synthetic_trace()))
    page = render_profile(run_dir).read_text()
    for name in ("shaded: reward phase", "shaded: update phase", "shaded: rollout phase"):
        assert f'"name":"{name}"' in page, name


def test_throughputs_are_named_trained_or_generated_with_the_trained_first(tmp_path):
    """Issue 56: the compare page's "throughput ×" counted generated tokens while trained tokens per
    rollout-second fell, and did not say which."""
    from rlbench.report.compare_summary import summary_lines

    def run(mode: str, generated: float, trained: float) -> dict:
        summary = {"step_time_s": 1.0, "rollout_tokens_per_s": generated,
                   "trained_tokens_per_rollout_s": trained,
                   "rollout_tokens": 100, "trained_tokens": 60}  # fmt: skip
        return {"mode": mode, "summary": summary, "steps": [{"step": 0, "step_time_s": 1.0}]}

    runs = [run("baseline", 100.0, 100.0), run("sorted", 169.0, 75.0)]
    _, fast = ratio_rows(runs, "baseline")
    assert "throughput ×" not in fast
    assert fast["trained throughput ×"] == pytest.approx(0.75)
    assert fast["generated throughput ×"] == pytest.approx(1.69)
    keys = list(fast)
    assert keys.index("trained tokens/rollout-s") < keys.index("generated tokens/rollout-s")
    assert keys.index("trained throughput ×") < keys.index("generated throughput ×")
    lines = summary_lines({"baseline": "baseline", "runs": runs})
    assert "sorted: 75 / 169 tok/s" in " ".join(lines)
    assert any(line.startswith("rollout: trained / generated tokens per rollout-second") for line in lines)
    page = render_compare(tmp_path, {"baseline": "baseline", "runs": runs}).read_text()
    assert page.index("trained throughput ×") < page.index("generated throughput ×")


def test_table_cells_never_show_e_notation() -> None:
    from rlbench.report.page import table

    html = table([{"tiny": 1.149e-05, "neg": -2e-5, "zero": 0.0, "ratio": 0.8986, "big": 123456.7, "n": 3}])
    cells = html.split("<td>")[1:]
    assert [c.split("</td>")[0] for c in cells] == ["&lt;0.001", "-&lt;0.001", "0", "0.8986", "123,457", "3"]


def test_the_eval_page_names_a_model_not_its_cache_path(tmp_path, monkeypatch):
    from reference_trainer.model.embedded import shipped_dir
    from rlbench.models import model_label

    monkeypatch.setenv("RLBENCH_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    assert model_label(tmp_path / "models" / "smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert model_label(shipped_dir()).startswith("embedded")
    assert model_label("/some/dir") == "/some/dir"
