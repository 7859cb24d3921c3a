"""What SortedRL and RhymeRL would buy on an observed server: its request lengths through the simulator.

The lengths come from a request log when the user gives one (`--request-log`, the simulator's length-trace
JSONL: exact lengths, prompt ids, steps), else from the derived trace's finished requests (vLLM's length
histograms, bucket middles; one step per observed phase, each request its own prompt, since a server does
not know an RL step's groups). The same cost model replays every mode, so the modes compare with each
other; the baseline's predicted bubble beside the observed one shows how far the model is from this server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference_trainer.trace.schema import SEQUENCE
from rlbench.simulate.whatif import whatif
from rlbench.simulate.workload import _from_rows, load

MODES = ["baseline", "sorted", "sorted-partial", "rhyme", "sorted+rhyme", "async"]  # async: max_staleness 1


def length_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"step": e["step"], "prompt_id": e["prompt_id"], "sample": 0,
         "prompt_tokens": int(e.get("prompt_tokens") or 0), "response_tokens": int(e["response_tokens"])}
        for e in events
        if e["kind"] == SEQUENCE and e.get("response_tokens")
    ]  # fmt: skip


def predict(
    events: list[dict[str, Any]],
    capacity: int,
    servers: int,
    request_log: Path | None = None,
    gpu: str = "h100",
    model_size: str = "7b",
) -> dict[str, Any]:
    """Per mode: predicted bubble ratio, step time and speed-up against the baseline (`simulate.whatif` on
    `servers` workers of `capacity` slots); or a reason why not."""
    if request_log is not None:
        trace, source = load(request_log), f"request log {request_log}"
    else:
        rows = length_rows(events)
        if not rows:
            return {
                "available": False,
                "reason": "no request lengths: the server exposes no length "
                "histograms (SGLang) and no --request-log was given",
            }
        trace, source = _from_rows(rows, "observed"), "vLLM length histograms (bucket middles)"
    doc = whatif(trace, capacity, [servers], MODES, gpu, model_size)
    return {**doc, "lengths": source, "servers": servers, "capacity_per_server": capacity}
