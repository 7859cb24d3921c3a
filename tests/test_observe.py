"""Observing rollout servers through their Prometheus metrics: parsing, the derived trace and its bubble
against known timelines, the report, and bad input (unreachable, not Prometheus, restarts, missing gauges,
a failing command) as one line with the run still written."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from conftest import assert_one_line_error, cli
from fake_prometheus import FakeServer, exact_bubble, exposition, sampled

from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_json, read_jsonl, write_jsonl
from reference_trainer.trace.schema import FORWARD_KINDS
from rlbench.observe.derive import to_trace
from rlbench.observe.scrape import ScrapeError, parse
from rlbench.profiling.observe import ObserveOptions, from_samples, observe

# Two phases on 4 slots with a heavy tail, 0.8 s apart: what the observer must find.
PHASE_A = [(0.3, 0.6, 30), (0.3, 0.8, 50), (0.3, 1.1, 80), (0.3, 1.5, 300), (0.6, 0.9, 30), (0.8, 1.0, 20)]
PHASE_B = [(2.3, 2.5, 20), (2.3, 2.6, 30), (2.3, 2.9, 60), (2.3, 3.3, 400)]


def test_vllm_and_sglang_expositions_parse_to_the_same_quantities():
    v = parse(exposition(PHASE_A, 0.7))
    assert v.server == "vllm" and v.values["running"] == 4 and v.values["finished"] == 1
    assert v.values["capacity"] is None and v.histograms["response_hist"][50.0] == 1
    assert v.missing == [] and v.histograms["prompt_hist"][5.0] == 1
    s = parse(exposition(PHASE_A, 0.7, flavor="sglang"))
    assert s.server == "sglang" and s.values["running"] == 4 and s.values["capacity"] == 4
    assert s.histograms == {} and s.values["generation_tokens"] == v.values["generation_tokens"]
    with pytest.raises(ScrapeError, match="no vLLM or SGLang request gauges"):
        parse("# TYPE up gauge\nup 1\n")
    with pytest.raises(ScrapeError):
        parse("<html><body>Not metrics</body></html>")


def test_the_trace_by_hand():
    """Scrapes at 0..4 s with 0, 2, 2, 1, 0 running on 2 slots: the phase runs from the first midpoint
    (0.5) to the last (3.5); slot-time is 2 x 2 + 1 x 1 = 5 of 2 x 3 = 6, so the bubble is 1/6."""
    counts, tokens = [0, 2, 2, 1, 0], [0, 10, 30, 45, 50]
    rows = [{"t": float(t), "server": 0, "running": n, "waiting": 0, "generation_tokens": g, "finished": 0}
            for t, (n, g) in enumerate(zip(counts, tokens, strict=True))]  # fmt: skip
    events, notes = to_trace(rows, capacity=[2])
    phases = [e for e in events if e["kind"] == "rollout"]
    assert [(p["t_start"], p["t_end"]) for p in phases] == [(0.5, 3.5)] and notes == []
    summary = metrics.compute(events)["summary"]
    assert summary["bubble_ratio"] == pytest.approx(1 / 6)
    assert summary["rollout_tokens"] == 50  # every generated token lands in the phase
    # the capacity defaults to the peak running count, said in a note
    _, notes = to_trace(rows)
    assert "capacity not exposed; using the peak running count 2" in notes[0]
    # an idle gap shorter than idle_gap_s stays inside one phase; a longer one splits it
    gap = [
        *rows,
        *({**r, "t": r["t"] + 5.0, "generation_tokens": 50 + r["generation_tokens"]} for r in rows[1:]),
    ]
    assert sum(e["kind"] == "rollout" for e in to_trace(gap, [2], idle_gap_s=1.0)[0]) == 2
    assert sum(e["kind"] == "rollout" for e in to_trace(gap, [2], idle_gap_s=3.0)[0]) == 1


def replayed(tmp_path, timelines, duration: float, capacity: list[int]) -> dict:
    """The observation of `timelines` scraped every 0.02 s at exact times (`sampled`), rebuilt from its
    samples.jsonl as `observe --from-samples` rebuilds a killed one."""
    write_jsonl(tmp_path / "samples.jsonl", sampled(timelines, 0.02, duration))
    opts = ObserveOptions(urls=[], interval_s=0.02, capacity=capacity, idle_gap_s=0.5)
    return from_samples(opts, tmp_path, say=lambda line: pytest.fail(line))


def test_the_observed_bubble_is_the_timelines(tmp_path):
    doc = replayed(tmp_path, [PHASE_A + PHASE_B], 3.6, [4])
    exact = [exact_bubble(PHASE_A, 4), exact_bubble(PHASE_B, 4)]
    assert [s["bubble_ratio"] for s in doc["steps"]] == pytest.approx(exact)
    assert doc["summary"]["rollout_tokens"] == sum(n for *_, n in PHASE_A + PHASE_B)


def test_an_observation_of_a_live_server(tmp_path):
    """The timeline scraped live: scrapes wait on the machine's scheduler, so the bubble is the replay's
    to check (above); here, what does not depend on when the scrapes ran."""
    said: list[str] = []
    with FakeServer(PHASE_A + PHASE_B) as server:
        opts = ObserveOptions(urls=[server.url], interval_s=0.02, capacity=[4], idle_gap_s=0.5)
        doc = observe(opts, tmp_path, duration_s=3.6, say=said.append)
    assert said == []
    steps = doc["steps"]
    assert len(steps) == 2
    assert doc["summary"]["rollout_tokens"] == sum(n for *_, n in PHASE_A + PHASE_B)
    stats = doc["engine_metrics"]["servers"]["all"]
    assert stats["finished_requests"] == 10 and stats["phases"] == 2
    assert stats["longest_response_tokens"] == 500  # 400 tokens, reported as its bucket's upper edge
    rows = read_jsonl(tmp_path / "samples.jsonl")
    assert max(r["running"] for r in rows) <= 4
    # metrics.json is what reference_trainer.trace.metrics computes from the written trace
    again = metrics.compute(read_jsonl(tmp_path / "trace.jsonl"))["summary"]
    assert again["bubble_ratio"] == pytest.approx(doc["summary"]["bubble_ratio"])
    whatif = doc["engine_metrics"]["whatif"]
    assert whatif["available"] and [r["mode"] for r in whatif["results"]][:2] == ["baseline", "sorted"]
    assert whatif["results"][1]["bubble_ratio"] < whatif["results"][0]["bubble_ratio"]
    page = (tmp_path / "report.html").read_text()
    assert "Rollout servers (observed)" in page and server.url in page and "What would SortedRL" in page
    rebuilt = cli("observe", "--from-samples", str(tmp_path), tmp=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert read_json(tmp_path / "metrics.json")["summary"]["bubble_ratio"] == pytest.approx(
        doc["summary"]["bubble_ratio"]
    )


def test_a_restart_and_missing_gauges_are_one_line_each_and_the_run_is_kept(tmp_path):
    said: list[str] = []
    with FakeServer(PHASE_A, restart_at=1.2) as server:
        doc = observe(
            ObserveOptions(urls=[server.url], interval_s=0.02, capacity=[4]), tmp_path, 1.6, said.append
        )
    assert len(said) == 1 and "server restarted" in said[0]
    forwards = [e for e in read_jsonl(tmp_path / "trace.jsonl") if e["kind"] in FORWARD_KINDS]
    assert forwards and all(e["tokens"] >= 0 for e in forwards)  # a restart never makes tokens negative
    assert doc["steps"] and (tmp_path / "report.html").is_file()
    said.clear()
    with FakeServer(PHASE_A, drop=("kv_usage", "response_hist")) as server:
        doc = observe(
            ObserveOptions(urls=[server.url], interval_s=0.05, capacity=[4]), tmp_path, 1.2, said.append
        )
    assert len(said) == 1 and "no kv_usage, response_hist, prompt_hist" in said[0], said
    assert doc["steps"] and not doc["engine_metrics"]["whatif"]["available"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_or_non_prometheus_servers_are_one_line_and_the_run_is_written(tmp_path):
    url = f"127.0.0.1:{_closed_port()}"
    res = cli("observe", url, "--duration", "0.5", "--out", str(tmp_path / "a"), tmp=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "cannot read" in res.stderr, res.stderr
    assert (tmp_path / "a" / "metrics.json").is_file() and (tmp_path / "a" / "report.html").is_file()
    with FakeServer([], body="<html><body>hello</body></html>") as server:
        res = cli("observe", server.url, "--duration", "0.5", "--out", str(tmp_path / "b"), tmp=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "b" / "report.html").is_file()


def test_profile_engine_metrics_around_a_failing_command(tmp_path):
    with FakeServer([(0.2, 0.9, 40), (0.2, 1.2, 90)]) as server:
        res = cli("profile", "--engine-metrics", server.url, "--capacity", "2", "--sample-hz", "50",
                  "--out", str(tmp_path / "run"), "--", sys.executable, "-c",
                  "import sys, time; time.sleep(2.0); sys.exit(3)", tmp=tmp_path)  # fmt: skip
    assert res.returncode == 3 and res.stderr.strip() == "command exited with 3", res.stderr
    doc = read_json(tmp_path / "run" / "metrics.json")
    assert doc["summary"]["exit_code"] == 3 and len(doc["steps"]) == 1
    assert doc["steps"][0]["rollout_tokens"] == 40 + 90 and doc["steps"][0]["bubble_ratio"] is not None
    assert "bubble" in res.stdout


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("observe",), "give the servers' metrics URLs"),
        (("observe", "ftp://x/metrics"), "engine metrics URL must be http(s)"),
        (("observe", "127.0.0.1:1", "--capacity", "0"), "--capacity: give one positive value"),
        (("observe", "a:1", "b:2", "--capacity", "1,2,3"), "one per server (2)"),
        (("observe", "--from-samples", "nowhere"), "no samples.jsonl to rebuild from"),
        (("profile", "--engine-metrics", "127.0.0.1:1"), "observes the servers of a command given after --"),
    ],
)
def test_bad_input_is_one_line(args, text, tmp_path):
    assert_one_line_error(cli(*args, tmp=tmp_path), text)


LIGHT = [(0.3, 0.5, 20), (0.3, 0.6, 30)]  # an almost idle server beside PHASE_A's


def test_two_servers_share_one_phase_and_each_has_its_own_numbers(tmp_path):
    """A busy and an almost idle server: one phase (their union), the overall bubble over both servers'
    slots, per-server bubbles, and the idle one's worker idle share."""
    doc = replayed(tmp_path, [PHASE_A, LIGHT], 1.9, [4, 4])
    wall = 1.5 - 0.3
    slot_time = sum(e - s for s, e, _ in PHASE_A + LIGHT)
    assert len(doc["steps"]) == 1
    assert doc["summary"]["bubble_ratio"] == pytest.approx(1 - slot_time / (8 * wall))
    servers = doc["engine_metrics"]["servers"]
    assert servers["server 0"]["bubble_ratio"] == pytest.approx(exact_bubble(PHASE_A, 4))
    assert servers["server 1"]["bubble_ratio"] == pytest.approx(1 - 0.5 / (4 * wall))
    idle_share = doc["summary"]["worker_idle_share"]
    assert idle_share["0"] == 0.0 and idle_share["1"] == pytest.approx(1 - 0.3 / wall)


def test_two_live_servers_are_sampled_each_in_its_turn(tmp_path):
    with FakeServer(PHASE_A) as busy, FakeServer(LIGHT) as idle:
        opts = ObserveOptions(urls=[busy.url, idle.url], interval_s=0.02, capacity=[4, 4], idle_gap_s=0.5)
        doc = observe(opts, tmp_path, duration_s=1.9, say=lambda line: None)
    assert len(doc["steps"]) == 1 and set(doc["engine_metrics"]["servers"]) == {"all", "server 0", "server 1"}
    forwards = [e for e in read_jsonl(tmp_path / "trace.jsonl") if e["kind"] in FORWARD_KINDS]
    tokens = [sum(e["tokens"] for e in forwards if e["worker"] == w) for w in (0, 1)]
    assert tokens == [sum(n for *_, n in PHASE_A), sum(n for *_, n in LIGHT)]  # each server's, every one


def test_a_request_log_gives_the_what_if_exact_lengths_and_groups(tmp_path):
    log = tmp_path / "requests.jsonl"
    rows = [{"step": s, "prompt_id": f"q{p}", "sample": k, "prompt_tokens": 20,
             "response_tokens": 40 + 300 * (p == 0)}
            for s in range(2) for p in range(4) for k in range(4)]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with FakeServer(PHASE_A) as server:
        opts = ObserveOptions(urls=[server.url], interval_s=0.05, capacity=[4], request_log=log)
        doc = observe(opts, tmp_path / "run", duration_s=1.7, say=lambda line: None)
    whatif = doc["engine_metrics"]["whatif"]
    assert whatif["lengths"] == f"request log {log}"
    assert whatif["workload"]["sequences"] == 32 and whatif["workload"]["groups"] == 8
    assert whatif["workload"]["response_tokens_max"] == 340
    res = cli("observe", "127.0.0.1:1", "--request-log", str(tmp_path / "none.jsonl"), tmp=tmp_path)
    assert_one_line_error(res, f"--request-log: {tmp_path / 'none.jsonl'}: no such file")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # read when the observation ends: refused before it starts
    res = cli("observe", "127.0.0.1:1", "--request-log", str(fifo), "--duration", "60", tmp=tmp_path)
    assert_one_line_error(res, "not a regular file")
