"""`rlbench trace export RUN --format perfetto`: the JSON validates against a JSON Schema of the trace-event
format (the fields Perfetto's and chrome://tracing's JSON importers need), and it is faithful to the run:
every engine step, request and phase appears once with its times, requests sit on their KV slots' lanes
without overlapping, and the counters carry the trace's and NVML's values. The runs are real (the trainer
in-process at tiny shapes, the observer's trace derivation) plus a synthetic two-worker trace for what
tiny runs lack (migrations, unfinished requests, a NaN loss); bad input is one line and exit code 2."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

import pytest
from conftest import assert_one_line_error, cli
from test_report import synthetic_trace
from test_trainer import tiny_config

from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.schema import dispatch_event, engine_lost_event
from reference_trainer.train.trainer import Trainer
from rlbench.observe.derive import to_trace
from rlbench.perfetto import perfetto_trace

ENGINE = ("prefill", "decode", "verify")
PHASES = ("rollout", "reward", "update", "sync")
NUMBER = {"type": "number"}
TIME = {"type": "number", "minimum": 0}


def _when(ph: str, then: dict) -> dict:
    return {"if": {"properties": {"ph": {"const": ph}}, "required": ["ph"]}, "then": then}


# The trace-event format, JSON object form: what each event type must carry. `tid` is optional only for
# process-scoped metadata and counters (the format keys counters by process and name).
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
                    "pid": {"type": "integer", "minimum": 1},  # 0 is Perfetto's idle process
                    "tid": {"type": "integer", "minimum": 1},
                    "name": {"type": "string", "minLength": 1},
                    "cat": {"type": "string"},
                    "args": {"type": "object"},
                },
                "allOf": [
                    _when("X", {"required": ["tid", "ts", "dur"], "properties": {"ts": TIME, "dur": TIME}}),
                    _when("C", {
                        "required": ["ts", "args"],
                        "properties": {
                            "ts": TIME,
                            "args": {"type": "object", "minProperties": 1, "additionalProperties": NUMBER},
                        },
                    }),
                    _when("M", {
                        "required": ["args"],
                        "properties": {
                            "name": {"enum": ["process_name", "thread_name", "process_sort_index",
                                              "thread_sort_index"]},
                        },
                        "oneOf": [
                            {"properties": {"name": {"pattern": "_name$"},
                                            "args": {"required": ["name"],
                                                     "properties": {"name": {"type": "string"}}}}},
                            {"properties": {"name": {"pattern": "_sort_index$"},
                                            "args": {"required": ["sort_index"],
                                                     "properties": {"sort_index": {"type": "integer"}}}}},
                        ],
                    }),
                    _when("M", {"if": {"properties": {"name": {"pattern": "^thread_"}}},
                                "then": {"required": ["tid"]}}),
                    _when("i", {"required": ["ts", "s", "tid"],
                                "properties": {"ts": TIME, "s": {"enum": ["g", "p", "t"]}}}),
                ],
            },
        },
    },
}  # fmt: skip


def pid_of(worker: int) -> int:
    return worker + 2  # the run is process 1, rollout worker w process w + 2 (0 is Perfetto's idle process)


def _write(run, events: list[dict], doc: dict | None = None):
    run.mkdir(parents=True, exist_ok=True)
    (run / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if doc is not None:
        (run / "metrics.json").write_text(json.dumps(doc))
    return run


def _nvml(events: list[dict]) -> dict:
    """Fake NVML samples every 20 ms over the run on two GPUs; the second GPU reports no power (null)."""
    end = max(e["t_end"] for e in events if "t_end" in e)
    samples = [
        {"t": i * 0.02, "gpu": g, "util": 90.0 - g * 50, "mem_util": 10.0, "mem_used_mib": 1000 + i,
         "power_w": None if g else 200.0, "sm_clock_mhz": None, "mem_clock_mhz": None}
        for i in range(int(end / 0.02) + 1) for g in (0, 1)
    ]  # fmt: skip
    return {"available": True, "reason": None, "devices": [], "samples": samples}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict:
    """Real trainer runs (sorted-partial on 4 slots: queueing, cached partials re-admitted in a later step;
    rhyme: verify events) with fake NVML samples, an observed two-server run, and a synthetic two-worker
    trace with migrations, unfinished requests and a NaN loss."""
    tmp = tmp_path_factory.mktemp("perfetto")
    out = {}
    for mode, options in (("sorted-partial", {"oversubscription": 3}), ("rhyme", {})):
        config = tiny_config(tiny_model_dir, 3, mode=mode, mode_options=options)
        config.max_tokens = 32
        Trainer(config, tmp / mode).run()
        events = read_jsonl(tmp / mode / "trace.jsonl")
        _write(tmp / mode, events, {"run": {"mode": mode, "steps": 3}, "gpu": _nvml(events)})
        out[mode] = tmp / mode
    rows = [
        {"t": t * 0.1, "server": s, "running": n, "waiting": max(0, n - 2), "kv_usage": n / 8,
         "generation_tokens": 10 * t * (n > 0), "finished": t // 3}
        for s, counts in enumerate([[0, 2, 4, 4, 3, 1, 0], [0, 1, 1, 0, 0, 0, 0]])
        for t, n in enumerate(counts)
    ]  # fmt: skip
    events, _ = to_trace(rows, capacity=[4, 4], idle_gap_s=1.0)
    servers = ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"]
    out["observed"] = _write(tmp / "observed", events, {"run": {"kind": "observe", "servers": servers}})
    events = synthetic_trace(n_prompts=3, group=2, workers=2, cap=3, steps=2)
    worker = {sid: e["worker"] for e in events for sid in (e.get("slots") or {}).values()}
    for e in events:
        if e["kind"] == "sequence":
            e["worker"] = worker[e["id"]]  # the contract's field in multi-worker rollout
    for e in events[-6:]:
        if e["kind"] == "sequence":
            e["t_finish"] = None  # aborted without a time: ends at its last engine step
    events += [
        {"kind": "migrate", "step": 1, "t_start": 0.05, "t_end": 0.05, "from": 1, "to": 0, "requests": 2},
        dispatch_event(0.01, 1, "least-tokens", [0, 1, 1], [4.0, 8.5]),
        engine_lost_event(0.07, 1, 1, 2),
        {"kind": "rollout", "step": 0, "t_start": 0.0, "t_end": 0.3},  # a second worker's rollout overlaps
        {"kind": "update", "step": 1, "t_start": 9.0, "t_end": 9.5, "loss": math.nan},
    ]
    twice = next(e for e in events if e["kind"] == "sequence" and e["t_finish"] is not None)
    events.append({**twice, "step": 1})  # a buffered sample, listed again by the step that consumes it
    out["synthetic"] = _write(tmp / "synthetic", events, {"run": {"mode": "x"}, "gpu": {"available": False}})
    return out


def _lanes(trace: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }


@pytest.mark.parametrize("name", ["sorted-partial", "rhyme", "observed", "synthetic"])
def test_the_export_is_valid_trace_event_json(runs, name, tmp_path):
    trace = perfetto_trace(runs[name])
    pytest.importorskip("jsonschema").validate(trace, SCHEMA)  # a GPU machine may lack it
    json.loads(json.dumps(trace, allow_nan=False))  # strict JSON: a NaN loss became null
    timed = [e["ts"] for e in trace["traceEvents"] if e["ph"] != "M"]
    assert timed == sorted(timed)
    processes = {e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    sort_keys = {(e["pid"], e.get("tid")) for e in trace["traceEvents"] if e["name"].endswith("sort_index")}
    threads = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            threads[(e["pid"], e["tid"])].append((e["ts"], -e["dur"]))
    for spans in threads.values():  # spans on one thread nest or follow each other: Perfetto draws a stack
        ends: list[float] = []
        for ts, neg_dur in sorted(spans):
            while ends and ends[-1] <= ts:
                ends.pop()
            assert not ends or ts - neg_dur <= ends[-1]
            ends.append(ts - neg_dur)
    for e in trace["traceEvents"]:  # every process and thread is named and ordered
        assert e["pid"] in processes and (e["pid"], None) in sort_keys
        if e["ph"] in "Xi":
            assert (e["pid"], e["tid"]) in _lanes(trace) and (e["pid"], e["tid"]) in sort_keys


@pytest.mark.parametrize("name", ["sorted-partial", "rhyme", "observed", "synthetic"])
def test_every_engine_step_request_and_phase_appears_once_with_its_times(runs, name):
    trace, events = perfetto_trace(runs[name]), read_jsonl(runs[name] / "trace.jsonl")
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    lanes = _lanes(trace)
    for w in {e.get("worker", 0) for e in events if e["kind"] in ENGINE}:
        mine = [e for e in events if e["kind"] in ENGINE and e.get("worker", 0) == w]
        spans = [x for x in xs if lanes[(x["pid"], x["tid"])] == "engine steps" and x["pid"] == pid_of(w)]
        assert Counter(x["name"] for x in spans) == Counter(e["kind"] for e in mine)
        assert sum(x["dur"] for x in spans) == pytest.approx(
            sum(e["t_end"] - e["t_start"] for e in mine) * 1e6, abs=1e-3 * len(mine)
        )
    seqs = [e for e in events if e["kind"] == "sequence" and e.get("t_admit") is not None]
    reqs = [x for x in xs if x["cat"] == "request"]
    assert Counter((x["args"]["id"], x["args"]["step"]) for x in reqs) == Counter(
        (s["id"], s["step"]) for s in seqs
    )
    by_key = {(s["id"], s["step"]): s for s in seqs}
    occupied = defaultdict(set)  # (worker, sequence id) -> slots the engine says it held
    for e in events:
        for slot, sid in (e.get("slots") or {}).items():
            occupied[(e.get("worker", 0), sid)].add(int(slot))
    per_lane = defaultdict(list)
    for x in reqs:
        s = by_key[(x["args"]["id"], x["args"]["step"])]
        assert x["pid"] == pid_of(s.get("worker", 0)) and x["ts"] >= s["t_admit"] * 1e6 - 1e-3
        assert x["args"]["queued_ms"] == pytest.approx((x["ts"] / 1e6 - s["t_admit"]) * 1e3, abs=1e-3)
        if s["t_finish"] is not None:
            assert x["ts"] + x["dur"] == pytest.approx(s["t_finish"] * 1e6, abs=1e-2)
        if occupied:  # from its first engine step, on the lane of the slot the engine put it in
            held = [e for e in events if e["kind"] in ENGINE and e.get("worker", 0) == s.get("worker", 0)
                    and s["id"] in (e.get("slots") or {}).values() and e["t_end"] >= s["t_admit"]
                    and (s["t_finish"] is None or e["t_start"] <= s["t_finish"])]  # fmt: skip
            assert x["ts"] == round(min(e["t_start"] for e in held) * 1e6, 3)
            assert s["id"] in {e["slots"].get(str(x["args"]["slot"])) for e in held}
            lane = lanes[(x["pid"], x["tid"])]
            assert lane == f"slot {x['args']['slot']}" or (name == "synthetic" and lane == "extra lane 0")
        per_lane[(x["pid"], x["tid"])].append((x["ts"], x["ts"] + x["dur"]))
    for spans in per_lane.values():  # never two requests at once on one lane
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    phases = [x for x in xs if x["cat"] == "phase"]
    got = sorted((x["name"], x["args"].get("step"), x["dur"]) for x in phases)
    want = sorted(
        (e["kind"], e["step"], (e["t_end"] - e["t_start"]) * 1e6) for e in events if e["kind"] in PHASES
    )
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == pytest.approx([w[2] for w in want], abs=1e-2)
    assert all(lanes[(1, x["tid"])].startswith("RL phases") for x in phases)


def _counters(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == name]


def test_counters_slots_queue_nvml(runs):
    trace, events = perfetto_trace(runs["sorted-partial"]), read_jsonl(runs["sorted-partial"] / "trace.jsonl")
    engine = [e for e in events if e["kind"] in ENGINE]
    slots = _counters(trace, "active slots")
    assert {e["args"]["value"] for e in slots} - {0} == {e["active_slots"] for e in engine} - {0}
    assert slots[-1]["args"]["value"] == 0  # idle after the run's last forward
    queued = [e["args"]["value"] for e in _counters(trace, "queued requests")]
    assert min(queued) == 0 == queued[-1] and max(queued) > 0  # 4 slots, more requests: some waited
    assert any(s["status"] == "cached" for s in events if s["kind"] == "sequence")  # re-admitted later
    samples = json.loads((runs["sorted-partial"] / "metrics.json").read_text())["gpu"]["samples"]
    util, mem, power = "GPU {} utilisation (%)", "GPU {} memory used (MiB)", "GPU {} power (W)"
    for gpu, key, name in (
        (0, "util", util),
        (1, "mem_used_mib", mem),
        (0, "power_w", power),
        (1, "power_w", power),
    ):
        got = [(e["ts"], e["args"]["value"]) for e in _counters(trace, name.format(gpu))]
        want = [(round(s["t"] * 1e6, 3), s[key]) for s in samples if s["gpu"] == gpu and s[key] is not None]
        assert got == want and (len(got) > 0) == (gpu == 0 or key != "power_w")
    assert trace["otherData"]["mode"] == "sorted-partial"


def test_observed_servers_are_named_by_url_with_their_gauges(runs):
    trace, events = perfetto_trace(runs["observed"]), read_jsonl(runs["observed"] / "trace.jsonl")
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {
        1: "run",
        2: "server 0: http://10.0.0.1:8000/metrics",
        3: "server 1: http://10.0.0.2:8000/metrics",
    }
    for field, name in (("waiting", "waiting requests"), ("kv_usage", "KV cache use (0-1)")):
        want = sorted((pid_of(e["worker"]), e[field]) for e in events if e.get(field) is not None)
        assert want and sorted((c["pid"], c["args"]["value"]) for c in _counters(trace, name)) == want
    assert not [x for x in trace["traceEvents"] if x.get("cat") == "request"]  # no admission times


def test_migrations_unfinished_requests_and_overlapping_phases(runs):
    trace, events = perfetto_trace(runs["synthetic"]), read_jsonl(runs["synthetic"] / "trace.jsonl")
    (mig,) = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "migrate"]
    assert (mig["name"], mig["pid"], mig["ts"], mig["args"]["to"]) == ("migrate", pid_of(1), 5e4, 0)
    assert _lanes(trace)[(mig["pid"], mig["tid"])] == "engine steps"  # the worker the requests left
    (lost,) = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "engine lost"]
    assert (lost["pid"], lost["ts"], lost["args"]) == (pid_of(1), 7e4, {"step": 1, "requests": 2})
    assert _lanes(trace)[(lost["pid"], lost["tid"])] == "engine steps"  # on the lost engine's own track
    (sent,) = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "dispatch"]
    assert _lanes(trace)[(sent["pid"], sent["tid"])] == "RL phases" and sent["ts"] == 1e4  # the run's track
    assert sent["args"] == {
        "policy": "least-tokens",
        "requests per engine": "1, 2",
        "tokens outstanding": "4, 8.5",
    }
    last = {}
    for e in events:
        for sid in (e.get("slots") or {}).values():
            last[sid] = max(last.get(sid, 0), e["t_end"])
    unfinished = [x for x in trace["traceEvents"] if x.get("cat") == "request" and x["args"]["id"] in
                  {s["id"] for s in events if s["kind"] == "sequence" and s["t_finish"] is None}]  # fmt: skip
    assert unfinished and all(
        x["ts"] + x["dur"] == pytest.approx(last[x["args"]["id"]] * 1e6) for x in unfinished
    )
    assert {v for k, v in _lanes(trace).items() if k[0] == 1} == {"RL phases", "RL phases 1"}
    (sid,) = [k for k, n in Counter(e["id"] for e in events if e["kind"] == "sequence").items() if n == 2]
    twice = [x for x in trace["traceEvents"] if x.get("cat") == "request" and x["args"]["id"] == sid]
    assert [_lanes(trace)[(x["pid"], x["tid"])] for x in twice] == ["slot 0", "extra lane 0"]
    (update,) = [x for x in trace["traceEvents"] if x["name"] == "update" and x["ts"] == 9e6]
    assert update["args"]["loss"] is None  # NaN in the trace, null in strict JSON


def test_cli_writes_the_file_and_refuses_bad_input_in_one_line(runs, tmp_path):
    run = runs["rhyme"]
    res = cli("trace", "export", str(run), tmp=tmp_path)
    assert res.returncode == 0 and str(run / "trace.perfetto.json") in res.stdout, res.stderr
    pytest.importorskip("jsonschema").validate(json.loads((run / "trace.perfetto.json").read_text()), SCHEMA)
    res = cli(
        "trace", "export", str(run), "--format", "perfetto", "--out", str(tmp_path / "t.json"), tmp=tmp_path
    )
    assert res.returncode == 0 and (tmp_path / "t.json").is_file() and "spans" in res.stdout, res.stderr
    assert_one_line_error(cli("trace", "export", str(tmp_path / "nowhere"), tmp=tmp_path), "no run directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("trace", "export", str(tmp_path / "empty"), tmp=tmp_path), "has no trace.jsonl")
    bad = cli("trace", "export", str(run), "--format", "speedscope", tmp=tmp_path)
    assert_one_line_error(bad, "--format 'speedscope' is not supported; the only format is perfetto")
    _write(tmp_path / "bad", [{"kind": "decode", "step": 0, "t_start": "soon", "t_end": 1.0}])
    assert_one_line_error(
        cli("trace", "export", str(tmp_path / "bad"), tmp=tmp_path), "event 1 (decode): t_start"
    )
    (tmp_path / "bad" / "trace.jsonl").write_text('{"kind": "decode"\n{}\n')
    assert_one_line_error(cli("trace", "export", str(tmp_path / "bad"), tmp=tmp_path), "trace.jsonl:1")
    nowhere = cli("trace", "export", str(run), "--out", str(tmp_path / "no" / "t.json"), tmp=tmp_path)
    assert_one_line_error(nowhere, "cannot write")
