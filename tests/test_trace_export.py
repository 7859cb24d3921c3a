"""`rlbench trace export RUN --format perfetto`: the JSON validates against the trace-event format (the fields
Perfetto's and chrome://tracing's JSON importers need), and every engine step, request and phase of the run
is there, once, with its duration."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_cli import assert_one_line_error, cli
from test_report import fake_gpu, synthetic_trace

from rlbench.perfetto import perfetto_trace
from rlbench.records import read_jsonl

NUMBER = {"type": "number"}
# The trace-event format (JSON object form): the fields each event type must carry.
SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
        "traceEvents": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ph", "pid", "name"],
                "properties": {
                    "ph": {"enum": ["X", "C", "M", "i"]},
                    "pid": {"type": "integer"},
                    "tid": {"type": "integer"},
                    "name": {"type": "string"},
                },  # fmt: skip
                "allOf": [
                    {
                        "if": {"properties": {"ph": {"const": "X"}}},
                        "then": {
                            "required": ["ts", "dur", "tid"],
                            "properties": {"ts": NUMBER, "dur": {"type": "number", "minimum": 0}},
                        },
                    },
                    {
                        "if": {"properties": {"ph": {"const": "C"}}},
                        "then": {
                            "required": ["ts", "args"],
                            "properties": {
                                "ts": NUMBER,
                                "args": {
                                    "type": "object",
                                    "minProperties": 1,
                                    "additionalProperties": NUMBER,
                                },
                            },
                        },
                    },
                    {
                        "if": {"properties": {"ph": {"const": "M"}}},
                        "then": {
                            "properties": {
                                "name": {
                                    "enum": [
                                        "process_name",
                                        "thread_name",
                                        "process_sort_index",
                                        "thread_sort_index",
                                    ]
                                },
                                "args": {"type": "object", "minProperties": 1},
                            },
                            "required": ["args"],
                        },
                    },
                    {
                        "if": {"properties": {"ph": {"const": "i"}}},
                        "then": {
                            "required": ["ts", "s", "tid"],
                            "properties": {"s": {"enum": ["g", "p", "t"]}},
                        },
                    },
                ],  # fmt: skip
            },
        },
    },
}


@pytest.fixture(scope="module")
def profile_run(tmp_path_factory):
    """A real profile run with HistoSpec (verify events) on the embedded model: about 10 s."""
    tmp = tmp_path_factory.mktemp("perfetto")
    res = cli("profile", "--mode", "rhyme", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
              "--max-tokens", "48", "--out", str(tmp / "run"), tmp=tmp)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return tmp / "run"


def _threads(trace: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }


def test_a_profile_run_exports_every_engine_step_request_and_phase(profile_run):
    trace = perfetto_trace(profile_run)
    jsonschema.validate(trace, SCHEMA)
    events = read_jsonl(profile_run / "trace.jsonl")
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    engine = [e for e in events if e["kind"] in ("prefill", "decode", "verify")]
    steps = [x for x in xs if x["cat"] == "engine"]
    assert len(steps) == len(engine) and {x["name"] for x in steps} >= {"prefill", "decode", "verify"}
    assert sum(x["dur"] for x in steps) == pytest.approx(sum(e["t_end"] - e["t_start"] for e in engine) * 1e6)
    assert all(_threads(trace)[(x["pid"], x["tid"])] == "engine steps" for x in steps)
    sequences = [e for e in events if e["kind"] == "sequence" and e.get("t_admit") is not None]
    requests = [x for x in xs if x["cat"] == "request"]
    assert len(requests) == len(sequences) == 16
    lanes: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in requests:
        lanes.setdefault((r["pid"], r["tid"]), []).append((r["ts"], r["ts"] + r["dur"]))
    for spans in lanes.values():  # no two requests overlap on one slot's lane
        spans.sort()
        assert all(
            a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)
        )
    phases = sorted((x["name"], x["args"]["step"]) for x in xs if x["cat"] == "phase")
    expected = sorted(
        (e["kind"], e["step"]) for e in events if e["kind"] in ("rollout", "reward", "update", "sync")
    )
    assert phases == expected
    assert trace["otherData"]["mode"] == "rhyme"
    assert [x["ts"] for x in trace["traceEvents"] if x["ph"] != "M"] == sorted(
        x["ts"] for x in trace["traceEvents"] if x["ph"] != "M"
    )


def test_nvml_counters_and_migrations(tmp_path):
    events = synthetic_trace()
    events.append(
        {"kind": "migrate", "step": 0, "t_start": 0.1, "t_end": 0.1, "from": 0, "to": 0, "requests": 2}
    )
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "metrics.json").write_text(json.dumps({"run": {"mode": "sorted"}, "gpu": fake_gpu(events)}))
    trace = perfetto_trace(tmp_path)
    jsonschema.validate(trace, SCHEMA)
    util = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "GPU 0 utilisation (%)"]
    assert len(util) == len(fake_gpu(events)["samples"]) and util[1]["args"]["GPU 0 utilisation (%)"] == 80.0
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"] == ["migrate"]


def test_cli_writes_the_file_and_refuses_bad_input_in_one_line(profile_run, tmp_path):
    res = cli("trace", "export", str(profile_run), "--out", str(tmp_path / "t.json"), tmp=tmp_path)
    assert res.returncode == 0 and "ui.perfetto.dev" in res.stdout, res.stderr
    jsonschema.validate(json.loads((tmp_path / "t.json").read_text()), SCHEMA)
    assert_one_line_error(cli("trace", "export", str(tmp_path / "nowhere"), tmp=tmp_path), "no run directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("trace", "export", str(tmp_path / "empty"), tmp=tmp_path), "has no trace.jsonl")
    bad = cli("trace", "export", str(profile_run), "--format", "speedscope", tmp=tmp_path)
    assert_one_line_error(bad, "--format 'speedscope' is not supported")
