"""Scrape every rollout server at a fixed rate on the profile's clock, appending each round to samples.jsonl.

The clock is the caller's (`now`), the one the NVML sampler uses, so server gauges and GPU samples line up.
A server that cannot be read, that stops being a Prometheus endpoint, that restarts (a counter going
backwards) or that lacks gauges is reported once in one line through `say`, and sampling goes on: the
profile around it is still written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlbench.observe.scrape import REQUIRED, Scrape, ScrapeError, as_row, scrape

COUNTERS = ("generation_tokens", "finished")


class ServerSampler:
    def __init__(
        self,
        urls: list[str],
        now: Callable[[], float],
        interval_s: float = 0.1,
        path: Path | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.urls = urls
        self.now = now
        self.interval_s = interval_s
        self.path = path  # samples.jsonl, appended durably every round
        self.say = say
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self._said: set[tuple[int, str]] = set()
        self._last: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlbench-observe", daemon=True)

    def start(self) -> ServerSampler:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        return self.rows

    def _note(self, server: int, key: str, text: str) -> None:
        """Say `text` once per server and kind of trouble; keep it for the report."""
        if (server, key) not in self._said:
            self._said.add((server, key))
            line = f"{self.urls[server]}: {text}"
            self.notes.append(line)
            self.say(line)

    def _loop(self) -> None:
        from rlbench.records import extend_jsonl

        # A loaded server answers /metrics late; a short timeout would turn every busy moment into a gap.
        timeout = min(5.0, max(1.0, 2 * self.interval_s))
        while not self._stop.is_set():
            t_round = time.perf_counter()
            rows = [self._sample(i, url, timeout) for i, url in enumerate(self.urls)]
            self.rows.extend(rows)
            if self.path is not None:
                extend_jsonl(self.path, rows)
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - t_round)))

    def _sample(self, index: int, url: str, timeout: float) -> dict[str, Any]:
        sent = self.now()
        try:
            result: Scrape | ScrapeError = scrape(url, timeout)
        except ScrapeError as err:
            result = err
        t = (sent + self.now()) / 2  # the server read its gauges somewhere between request and reply
        row = as_row(t, index, result)
        if isinstance(result, ScrapeError):
            self._note(index, "error", f"{result}; sampling goes on")
            return row
        if missing := [q for q in result.missing if q not in REQUIRED]:
            self._note(index, "missing", f"no {', '.join(missing)} (an older {result.server}?): left null")
        last = self._last.get(index)
        if last is not None and any(
            row.get(c) is not None and last.get(c) is not None and row[c] < last[c] for c in COUNTERS
        ):
            row["restarted"] = True
            self._note(index, f"restart@{t:.1f}", f"counters went backwards at {t:.1f} s: server restarted")
        self._last[index] = row
        return row
