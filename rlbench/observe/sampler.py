"""Scrape every rollout server at a fixed rate on the profile's clock, appending each scrape to samples.jsonl.

The clock is the caller's (`now`), the one the NVML sampler uses, so server gauges and GPU samples line up.
Each server has a thread of its own, so a slow or stuck server costs only its own samples; every scrape has
a deadline and a size cap (scrape.py), and `stop` ends the scrapes in flight at once, so an observation
ends at its duration with what it has. A server that cannot be read, that stops being a Prometheus
endpoint, that restarts (a counter going backwards), that lacks gauges or sends values that are not numbers
is reported once per kind of trouble in one line through `say`, and sampling goes on: the profile around it
is still written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_trainer.trace.records import extend_jsonl
from rlbench.observe.scrape import CUT_OFF, REQUIRED, Scrape, ScrapeError, as_row, scrape

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
        self._lock = threading.Lock()  # rows, notes and the file are shared by the servers' threads
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(i, url), name=f"rlbench-observe-{i}", daemon=True)
            for i, url in enumerate(urls)
        ]

    def start(self) -> ServerSampler:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        """End sampling now (scrapes in flight are cut off, as errors) and return the rows, in time order."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        with self._lock:
            return sorted(self.rows, key=lambda row: (row["t"], row["server"]))

    def _note(self, server: int, key: str, text: str) -> None:
        """Say `text` once per server and kind of trouble; keep it for the report."""
        with self._lock:
            if (server, key) in self._said:
                return
            self._said.add((server, key))
            line = f"{self.urls[server]}: {text}"
            self.notes.append(line)
        self.say(line)

    def _loop(self, index: int, url: str) -> None:
        # A loaded server answers /metrics late; a short deadline would turn every busy moment into a gap.
        timeout = min(5.0, max(1.0, 2 * self.interval_s))
        while not self._stop.is_set():
            t_scrape = time.perf_counter()
            try:
                row = self._sample(index, url, timeout)
            except Exception as err:  # hostile input must never end a server's sampling
                kind = type(err).__name__
                self._note(index, f"failed:{kind}", f"a sample was lost ({kind}: {err}); sampling goes on")
                row = None
            if row is not None:
                with self._lock:
                    self.rows.append(row)
                    if self.path is not None:
                        extend_jsonl(self.path, [row])
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - t_scrape)))

    def _sample(self, index: int, url: str, timeout: float) -> dict[str, Any] | None:
        sent = self.now()
        try:
            result: Scrape | ScrapeError = scrape(url, timeout, cancel=self._stop)
        except ScrapeError as err:
            result = err
        t = (sent + self.now()) / 2  # the server read its gauges somewhere between request and reply
        row = as_row(t, index, result)
        if isinstance(result, ScrapeError) and str(result) == CUT_OFF:
            # The observation ended during this scrape: not a sample, unless the server gave none at all,
            # where it is what there is to say about it.
            with self._lock:
                if any(r["server"] == index for r in self.rows):
                    return None
        if isinstance(result, ScrapeError):
            self._note(index, "error", f"{result}; sampling goes on")
            return row
        for problem in result.problems:
            self._note(index, f"problem:{problem}", f"{problem} (sampling goes on)")
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
