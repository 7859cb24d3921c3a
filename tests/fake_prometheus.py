"""A scripted rollout server for observer tests: a /metrics endpoint whose gauges follow a known request
timeline, so the bubble the observer derives can be checked against the timeline's exact one (on scrapes at
exact times, `sampled`: a live observation's scrapes wait on a loaded machine's scheduler).

Requests are (start, end, tokens) in seconds after the server starts. At scrape time t the server reports
the requests running at t, tokens generated so far (linear in each request's lifetime), finished requests
and a length histogram of the finished ones, in vLLM's names (or SGLang's). `restart_at` resets every
counter once, as a restarted server does; `drop` leaves out quantities, as older servers do.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Request = tuple[float, float, int]
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def exact_bubble(requests: list[Request], capacity: int) -> float:
    """1 - slot-time / (capacity x rollout wall time), for a timeline that is one phase."""
    start, end = min(r[0] for r in requests), max(r[1] for r in requests)
    return 1.0 - sum(e - s for s, e, _ in requests) / (capacity * (end - start))


def exposition(requests: list[Request], t: float, flavor: str = "vllm", drop: tuple[str, ...] = ()) -> str:
    running = sum(1 for s, e, _ in requests if s <= t < e)
    done = [r for r in requests if r[1] <= t]
    generated = sum(n * min(1.0, max(0.0, (t - s) / (e - s))) for s, e, n in requests)
    label = '{model_name="fake"}'
    if flavor == "sglang":
        lines = [
            "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{label} {running}",
            "# TYPE sglang:num_queue_reqs gauge", f"sglang:num_queue_reqs{label} 0",
            "# TYPE sglang:token_usage gauge", f"sglang:token_usage{label} {0.01 * running}",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{label} {int(generated)}",
            "# TYPE sglang:num_requests_total counter", f"sglang:num_requests_total{label} {len(done)}",
            "# TYPE sglang:max_running_requests gauge", f"sglang:max_running_requests{label} 4",
        ]  # fmt: skip
        return "\n".join(lines) + "\n"
    lines = [
        "# TYPE vllm:num_requests_running gauge", f'vllm:num_requests_running{{engine="0"}} {running}',
        "# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{engine="0"} 0',
        "# TYPE vllm:generation_tokens_total counter",
        f'vllm:generation_tokens_total{{engine="0"}} {int(generated)}',
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0",finished_reason="length"}} {len(done)}',
        'vllm:request_success_total{engine="0",finished_reason="stop"} 0',
    ]  # fmt: skip
    if "kv_usage" not in drop:
        lines += [
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{engine="0"}} {0.01 * running}',
        ]
    if "response_hist" not in drop:  # (dropping it drops the prompt histogram too)
        lines.append("# TYPE vllm:request_generation_tokens histogram")
        for le in (*BUCKETS, "+Inf"):
            count = sum(1 for r in done if le == "+Inf" or r[2] <= le)
            lines.append(f'vllm:request_generation_tokens_bucket{{engine="0",le="{le}"}} {count}')
        lines.append(f'vllm:request_generation_tokens_count{{engine="0"}} {len(done)}')
        lines.append(f'vllm:request_generation_tokens_sum{{engine="0"}} {sum(r[2] for r in done)}')
        lines.append("# TYPE vllm:request_prompt_tokens histogram")  # every prompt is 4 tokens
        for le in (*BUCKETS, "+Inf"):
            count = len(done) if le == "+Inf" or le >= 4 else 0
            lines.append(f'vllm:request_prompt_tokens_bucket{{engine="0",le="{le}"}} {count}')
    return "\n".join(lines) + "\n"


def sampled(timelines: list[list[Request]], interval: float, duration: float) -> list[dict]:
    """The samples.jsonl rows of an observer that scraped each timeline's server every `interval` seconds
    for `duration`, each scrape at its exact time: what the derivation makes of a timeline, with no clock,
    no server and no machine load in it."""
    from rlbench.observe.scrape import as_row, parse

    times = [round(k * interval, 9) for k in range(round(duration / interval) + 1)]
    return [as_row(t, i, parse(exposition(tl, t))) for t in times for i, tl in enumerate(timelines)]


class FakeServer:
    """Serve `exposition` on 127.0.0.1 (a free port) in a thread; `url` is its /metrics endpoint. The timeline
    starts at the first scrape, so an observer that is slow to start (a CLI's imports on a loaded runner)
    still sees every request from its beginning."""

    def __init__(self, requests: list[Request], flavor: str = "vllm", drop: tuple[str, ...] = (),
                 restart_at: float | None = None, body: str | None = None) -> None:  # fmt: skip
        self.requests, self.flavor, self.drop, self.restart_at, self.body = (
            requests,
            flavor,
            drop,
            restart_at,
            body,
        )
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with server.lock:
                    if server.t0 is None:
                        server.t0 = time.perf_counter()
                t = time.perf_counter() - server.t0
                if server.body is not None:
                    text = server.body
                elif server.restart_at is not None and t >= server.restart_at:  # counters start again at 0
                    shifted = [
                        (s - server.restart_at, e - server.restart_at, n) for s, e, n in server.requests
                    ]
                    text = exposition([r for r in shifted if r[0] >= 0], t - server.restart_at, server.flavor)
                else:
                    text = exposition(server.requests, t, server.flavor, server.drop)
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.t0: float | None = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HostileServer:
    """A /metrics endpoint that misbehaves on 127.0.0.1: `slow` sends a valid page one byte every 0.2 s,
    `endless` streams an unbounded body as fast as it can, `bad_le` sends a vLLM page whose histogram has a
    bucket with no `le` and one with `le="many"`, and non-finite gauges; `control` a line of terminal control
    sequences."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        page = exposition(PAGE_REQUESTS, 0.7)
        if kind == "control":  # a line that retitles and clears the terminal it is printed on
            page += "\x1b]0;pwned\x07\x1b[2J not a sample\n"
        if kind == "bad_le":
            page = page.replace('le="5"', 'le="many"').replace(',le="10"', "")
            page = page.replace(
                'vllm:num_requests_waiting{engine="0"} 0', 'vllm:num_requests_waiting{engine="0"} NaN'
            )
        body = page.encode()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if hostile.kind != "endless":
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if hostile.kind == "slow":
                        for i in range(len(body)):
                            self.wfile.write(body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(0.2)
                    elif hostile.kind == "endless":
                        filler = b"# " + b"x" * 65_000 + b"\n"
                        while True:
                            self.wfile.write(filler)
                    else:
                        self.wfile.write(body)
                except OSError:  # the observer hung up: what it should do
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


PAGE_REQUESTS = [(0.0, 0.5, 30), (0.0, 2.0, 300)]
