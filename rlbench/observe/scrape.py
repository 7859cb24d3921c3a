"""One scrape of a rollout server's Prometheus endpoint, reduced to the few series a bubble needs.

Parsing is prometheus_client's text parser. Series with several label sets (vLLM's `engine` label under
data parallelism, `finished_reason` on the success counter) are summed. Names differ by server:

| quantity | vLLM | SGLang |
|---|---|---|
| requests running | `vllm:num_requests_running` | `sglang:num_running_reqs` |
| requests waiting | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` |
| KV cache use (0-1) | `vllm:kv_cache_usage_perc` (or `vllm:gpu_cache_usage_perc`) | `sglang:token_usage` |
| generated tokens (counter) | `vllm:generation_tokens_total` | `sglang:generation_tokens_total` |
| finished requests (counter) | `vllm:request_success_total` | `sglang:num_requests_total` |
| response lengths (histogram) | `vllm:request_generation_tokens` | none |
| prompt lengths (histogram) | `vllm:request_prompt_tokens` | none |
| slot capacity | not exposed (give `--capacity`) | `sglang:max_running_requests` |

A server is not trusted to behave: a scrape reads at most `MAX_BYTES` and ends at its deadline however
slowly the answer trickles in (a watchdog shuts the socket), values that are not finite numbers are left
null, and a histogram bucket without a numeric `le` is skipped; each is said in `Scrape.problems`. The
endpoint is read directly with http.client (no proxy, no redirects), so the socket is ours to shut.
"""

from __future__ import annotations

import http.client
import math
import socket
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from reference_trainer.trace.schema import is_number

MAX_BYTES = 8 << 20  # a vLLM page with every histogram is a few hundred KB
CUT_OFF = "no answer before the observation ended"
_READ = 1 << 16

# quantity -> metric family names, first match wins (prometheus_client strips `_total` from counters)
# Bounds on what a scrape or a samples.jsonl row can hold, so the derivation's arithmetic and memory stay
# bounded: a server index makes a per-server table (an index of 1e9, a billion entries), a counter past
# 2**60 is no server's, and an observation lasts at most --duration's 1e7 s.
MAX_SERVERS = 4096
MAX_COUNTER = 2.0**60
MAX_SECONDS = 1e7

NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "generation_tokens": ("vllm:generation_tokens",),
        "finished": ("vllm:request_success",),
        "capacity": (),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "generation_tokens": ("sglang:generation_tokens",),
        "finished": ("sglang:num_requests",),
        "capacity": ("sglang:max_running_requests",),
    },
}
HISTOGRAMS = {
    "vllm": {"response_hist": "vllm:request_generation_tokens", "prompt_hist": "vllm:request_prompt_tokens"}
}
REQUIRED = ("running",)  # without it there is no occupancy; everything else degrades to null


class ScrapeError(Exception):
    """The endpoint could not be read or is not a Prometheus text exposition of a known server."""


@dataclass
class Scrape:
    server: str  # "vllm" or "sglang"
    values: dict[str, float | None]
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)  # name -> {le: cumulative count}
    missing: list[str] = field(default_factory=list)  # quantities this server does not export
    problems: list[str] = field(default_factory=list)  # what was wrong with the page and left out


def fetch(url: str, timeout_s: float, cancel: threading.Event | None = None) -> str:
    """The body at `url`, read in at most `timeout_s` in all (connect, headers, body) and at most MAX_BYTES.
    A set `cancel` event ends the read at once (the observation is over)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError("not an http(s) URL")
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = connection(parts.hostname, parts.port, timeout=timeout_s)
    except ValueError as err:  # a port that is not a number
        raise ScrapeError(f"cannot read ({err})") from None
    deadline = time.monotonic() + timeout_s
    done = threading.Event()
    try:
        conn.connect()  # bounded by the socket timeout; the watchdog bounds everything after it
        watchdog = threading.Thread(target=_watch, args=(conn.sock, deadline, done, cancel), daemon=True)
        watchdog.start()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ScrapeError(f"cannot read (HTTP {resp.status} {resp.reason})")
        body, size = [], 0
        while chunk := resp.read1(_READ):
            size += len(chunk)
            if size > MAX_BYTES:
                raise ScrapeError(f"the answer passed {MAX_BYTES >> 20} MiB: not a metrics page")
            body.append(chunk)
        if cancel is not None and cancel.is_set():  # the watchdog cut it short
            raise ScrapeError(CUT_OFF)
        if time.monotonic() >= deadline:
            raise ScrapeError(f"no complete answer within {timeout_s:g} s")
    except (OSError, http.client.HTTPException, ValueError) as err:
        if cancel is not None and cancel.is_set():
            raise ScrapeError(CUT_OFF) from None
        if time.monotonic() >= deadline:
            raise ScrapeError(f"no complete answer within {timeout_s:g} s") from None
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ScrapeError(f"cannot read ({reason})") from None
    finally:
        done.set()
        conn.close()
    return b"".join(body).decode("utf-8", errors="replace")


def _watch(
    sock: socket.socket | None, deadline: float, done: threading.Event, cancel: threading.Event | None
) -> None:
    """Shut the socket at the deadline (or on `cancel`): a blocked read then returns at once, where a
    per-read timeout never fires against a server that sends a byte now and then. (The socket is taken
    right after connecting: http.client hands it to the response and forgets it.)"""
    while not done.wait(0.02):
        if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
            if sock is not None:
                with suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)
            return


def parse(text: str) -> Scrape:
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as err:  # hostile text: whatever the parser trips on, the sampler must go on
        raise ScrapeError(f"not a Prometheus text exposition ({type(err).__name__}: {err})") from None
    server = next((s for s, names in NAMES.items() if any(n in families for n in names["running"])), None)
    if server is None:
        raise ScrapeError(
            "no vLLM or SGLang request gauges (vllm:num_requests_running, sglang:num_running_reqs)"
        )
    values: dict[str, float | None] = {}
    missing, problems = [], []
    for quantity, names in NAMES[server].items():
        family = next((families[n] for n in names if n in families), None)
        samples = [s for s in family.samples if not s.name.endswith("_created")] if family else []
        total = sum(s.value for s in samples) if samples else None
        if total is not None and not (math.isfinite(total) and abs(total) <= MAX_COUNTER):
            past = ", past 2**60" if math.isfinite(total) else ""
            problems.append(f"{quantity} is {total}{past}: left null")
            total = None
        values[quantity] = total
        if family is None and names:
            missing.append(quantity)
    histograms = {}
    for key, name in HISTOGRAMS.get(server, {}).items():
        if name not in families:
            missing.append(key)
            continue
        buckets: dict[float, float] = {}
        for s in families[name].samples:
            if s.name.endswith("_bucket"):
                try:
                    le = float(s.labels["le"])
                except (KeyError, ValueError):
                    problems.append(f"{name}: a bucket without a numeric le label, skipped")
                    continue
                if math.isnan(le) or not (math.isfinite(s.value) and 0 <= s.value <= MAX_COUNTER):
                    problems.append(f"{name}: a bucket with le {le} and count {s.value}, skipped")
                    continue
                buckets[le] = buckets.get(le, 0.0) + s.value
        histograms[key] = buckets
    return Scrape(server, values, histograms, missing, list(dict.fromkeys(problems)))


def scrape(url: str, timeout_s: float = 2.0, cancel: threading.Event | None = None) -> Scrape:
    return parse(fetch(url, timeout_s, cancel))


def as_row(t: float, index: int, result: Scrape | ScrapeError) -> dict[str, Any]:
    """A samples.jsonl row: the raw numbers of one scrape (or its error) at time t on the run's clock."""
    if isinstance(result, ScrapeError):
        return {"t": t, "server": index, "error": str(result)}
    hist = {k: {str(le): n for le, n in sorted(v.items())} for k, v in result.histograms.items()}
    return {"t": t, "server": index, "flavor": result.server, **result.values, **hist}


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a samples.jsonl row read back (`observe --from-samples`), or None."""
    if not is_number(row.get("t")) or not 0 <= row["t"] <= MAX_SECONDS:
        return f"t is {row.get('t')!r}, not seconds into an observation"
    if type(row.get("server")) is not int or not 0 <= row["server"] < MAX_SERVERS:
        return f"server is {row.get('server')!r}, not a server index (0..{MAX_SERVERS - 1})"
    if "error" in row:
        return None
    for quantity in NAMES["vllm"]:
        value = row.get(quantity)
        if value is not None and not (is_number(value) and abs(value) <= MAX_COUNTER):
            return f"{quantity} is {value!r}, not a number a server reports"
    for key in HISTOGRAMS["vllm"]:
        hist = row.get(key)
        if hist is None:
            continue
        if not isinstance(hist, dict) or not all(_is_edge(le) and is_number(n) for le, n in hist.items()):
            return f"{key} is not a {{le: count}} histogram"
    return None


def _is_edge(text: str) -> bool:
    try:
        return not math.isnan(float(text))
    except ValueError:
        return False
