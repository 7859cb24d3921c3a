"""Observing hostile servers on 127.0.0.1: a body sent a byte at a time, an endless body, histogram buckets
without a numeric `le` and gauges that are not numbers. The observation still ends, the healthy server
beside them is sampled as often as alone, and what was wrong is said once per server. (How soon it ends is
timed by the fault drill, faults/fault_drill.py's servers group: timings are not asserted here.)"""

from __future__ import annotations

import json

from conftest import assert_one_line_error, cli
from fake_prometheus import PAGE_REQUESTS, FakeServer, HostileServer

from reference_trainer.trace.records import read_jsonl
from rlbench.observe.scrape import MAX_BYTES, ScrapeError, fetch
from rlbench.profiling.observe import ObserveOptions, observe


def test_a_scrape_has_a_deadline_and_a_size_cap():
    with HostileServer("slow") as slow, HostileServer("endless") as endless:
        try:  # the page takes minutes a byte at a time: only the deadline (not a per-read timeout) ends it
            fetch(slow.url, timeout_s=0.5)
            raise AssertionError("a page sent a byte every 0.2 s cannot arrive in 0.5 s")
        except ScrapeError as err:
            assert "no complete answer within 0.5 s" in str(err)
        try:
            fetch(endless.url, timeout_s=30)
            raise AssertionError("an endless body has no end")
        except ScrapeError as err:
            assert f"passed {MAX_BYTES >> 20} MiB" in str(err)


def test_hostile_servers_neither_stop_nor_slow_an_observation(tmp_path):
    said: list[str] = []
    duration, interval = 2.0, 0.05
    with (
        FakeServer(PAGE_REQUESTS) as healthy,
        HostileServer("slow") as slow,
        HostileServer("endless") as endless,
        HostileServer("bad_le") as bad_le,
    ):
        urls = [healthy.url, slow.url, endless.url, bad_le.url]
        doc = observe(
            ObserveOptions(urls=urls, interval_s=interval, capacity=[4]), tmp_path, duration, said.append
        )
    rows = read_jsonl(tmp_path / "samples.jsonl")
    by_server = {i: [r for r in rows if r["server"] == i] for i in range(4)}
    good = [r for r in by_server[0] if "error" not in r]
    # not held back by the slow one: sampled again and again while each slow scrape waited for its deadline
    # (one thread for all servers would give both the same count)
    assert len(good) > 3 * len(by_server[1]), (len(good), len(by_server[1]))
    assert all("error" in r for r in by_server[1] + by_server[2]) and by_server[1] and by_server[2]
    assert any("no complete answer within" in line for line in said if slow.url in line)
    assert any("MiB: not a metrics page" in line for line in said if endless.url in line)
    parsed = [r for r in by_server[3] if "error" not in r]
    assert parsed and all(r["waiting"] is None for r in parsed)
    assert any("without a numeric le label, skipped" in line for line in said if bad_le.url in line)
    assert any("waiting is nan: left null" in line for line in said if bad_le.url in line)
    assert doc["engine_metrics"]["unreadable"] == [slow.url, endless.url]
    assert len(said) == len(set(said))  # each trouble said once


def test_observe_cli_ends_and_writes_its_run_against_a_stuck_server(tmp_path):
    with HostileServer("slow") as slow:
        res = cli("observe", slow.url, "--duration", "1", "--interval", "0.1", "--out", "obs", tmp=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr  # nothing observed: exit 2
    assert (tmp_path / "obs" / "samples.jsonl").is_file() and (tmp_path / "obs" / "report.html").is_file()


def test_a_rebuild_from_wrongly_typed_samples_is_one_line(tmp_path):
    run = tmp_path / "obs"
    run.mkdir()
    good = {"t": 0.5, "server": 0, "running": 1, "waiting": 0}
    for bad, why in (
        ({"t": "soon", "server": 0}, "t is 'soon', not seconds into an observation"),
        ({"t": 1e308, "server": 0}, "t is 1e+308, not seconds into an observation"),
        ({"t": 1.0, "server": -1}, "server is -1, not a server index"),
        ({"t": 1.0, "server": 10**9}, "server is 1000000000, not a server index (0..4095)"),
        ({**good, "running": [3]}, "running is [3], not a number a server reports"),
        ({**good, "finished": 1e300}, "finished is 1e+300, not a number a server reports"),
        ({**good, "response_hist": {"many": 1}}, "response_hist is not a {le: count} histogram"),
    ):
        (run / "samples.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        assert_one_line_error(
            cli("observe", "--from-samples", str(run), tmp=tmp_path), f"samples.jsonl:2: {why}"
        )
    assert_one_line_error(cli("observe", "127.0.0.1:1", "--interval", "nan", tmp=tmp_path), "'--interval'")
    assert_one_line_error(
        cli("observe", "127.0.0.1:1", "--duration", "inf", tmp=tmp_path), "--duration must be"
    )


def test_a_rebuild_from_an_empty_samples_file_says_why(tmp_path):
    """It exited 2 with nothing on stderr (an observation stopped before its first scrape)."""
    run = tmp_path / "obs"
    run.mkdir()
    (run / "samples.jsonl").write_text("")
    assert_one_line_error(cli("observe", "--from-samples", str(run), tmp=tmp_path), "no samples to rebuild")


def test_a_servers_page_reaches_the_terminal_without_its_control_bytes(tmp_path):
    with HostileServer("control") as server:
        res = cli("observe", server.url, "--duration", "0.5", "--out", "obs", tmp=tmp_path)
    assert "pwned" in res.stderr, res.stderr  # what the page said is shown ...
    assert "\x1b" not in res.stderr + res.stdout and "\x07" not in res.stderr  # ... but not acted on


def test_a_url_given_many_times_is_one_server():
    from rlbench.profiling.observe import server_urls

    assert server_urls(",".join(["127.0.0.1:9"] * 300 + ["h:1", "http://127.0.0.1:9/metrics"])) == [
        "http://127.0.0.1:9/metrics",
        "http://h:1/metrics",
    ]
