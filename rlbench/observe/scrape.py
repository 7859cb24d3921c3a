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
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# quantity -> metric family names, first match wins (prometheus_client strips `_total` from counters)
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


def fetch(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (a user-given http URL)
            return resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise ScrapeError(f"cannot read ({reason})") from None


def parse(text: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except (ValueError, TypeError, IndexError) as err:
        raise ScrapeError(f"not a Prometheus text exposition ({err})") from None
    server = next((s for s, names in NAMES.items() if any(n in families for n in names["running"])), None)
    if server is None:
        raise ScrapeError(
            "no vLLM or SGLang request gauges (vllm:num_requests_running, sglang:num_running_reqs)"
        )
    values: dict[str, float | None] = {}
    missing = []
    for quantity, names in NAMES[server].items():
        family = next((families[n] for n in names if n in families), None)
        samples = [s for s in family.samples if not s.name.endswith("_created")] if family else []
        values[quantity] = sum(s.value for s in samples) if samples else None
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
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
        histograms[key] = buckets
    return Scrape(server, values, histograms, missing)


def scrape(url: str, timeout_s: float = 2.0) -> Scrape:
    return parse(fetch(url, timeout_s))


def as_row(t: float, index: int, result: Scrape | ScrapeError) -> dict[str, Any]:
    """A samples.jsonl row: the raw numbers of one scrape (or its error) at time t on the run's clock."""
    if isinstance(result, ScrapeError):
        return {"t": t, "server": index, "error": str(result)}
    hist = {k: {str(le): n for le, n in sorted(v.items())} for k, v in result.histograms.items()}
    return {"t": t, "server": index, "flavor": result.server, **result.values, **hist}
