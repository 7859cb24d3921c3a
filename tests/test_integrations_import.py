"""`rlbench import lengths`, `import verl`, `import trl`: the length log (rlbench's own format, written here),
the rebuilt batches, and bad input. The importers' reading of what verl and TRL write is tested on the
upstream writers' own output in test_integrations_upstream.py."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

from reference_trainer.errors import UserError
from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_json, read_jsonl
from reference_trainer.trace.schema import read_trace
from rlbench.integrations import lengthlog
from rlbench.integrations.lengthlog import Group, rebuild, variance_split

UPSTREAM = Path(__file__).parent / "fixtures" / "upstream"


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rebuild_is_continuous_batching_in_decode_steps():
    # slots 2: samples 4 and 2 start; at 2 the third (2) takes the free slot; at 4 both end and 8 runs
    # alone to 12. Busy 16 of 2 x 12 slot-steps: bubble 1/3. One slot per sample: 16 of 4 x 8, bubble 1/2.
    groups = [Group(0, "a", (4, 2)), Group(0, "b", (2, 8))]
    two = metrics.compute(rebuild(groups, slots=2))["steps"][0]
    assert two["bubble_ratio"] == pytest.approx(1 / 3)
    assert two["timing_s/gen"] == pytest.approx(12)
    assert two["rollout_tokens"] == 16
    assert metrics.compute(rebuild(groups, slots=4))["steps"][0]["bubble_ratio"] == pytest.approx(0.5)
    # a measured window keeps the decode-step shares and spreads them over its time
    timed = metrics.compute(rebuild(groups, slots=2, windows={0: (10.0, 16.0)}))["steps"][0]
    assert (timed["rollout_start"], timed["rollout_end"]) == (10.0, 16.0)
    assert timed["bubble_ratio"] == pytest.approx(1 / 3)


def test_an_idle_worker_counts_as_idle_slots():
    # worker 1 runs one 4-token sample while worker 0 runs 8: worker 1 idles half the step
    groups = [Group(0, "a", (8,), worker=0), Group(0, "b", (4,), worker=1)]
    step = metrics.compute(rebuild(groups, slots=1))["steps"][0]
    assert step["bubble_ratio"] == pytest.approx(1 - 12 / 16)
    assert step["worker_idle_share"] == {"0": 0.0, "1": 0.5}


def test_slot_maps_match_the_running_counts_and_ids_are_unique():
    groups = [Group(s, f"q{q % 3}", (1 + (7 * q + s) % 11, 1 + (5 * q) % 13), worker=q % 2)
              for s in range(2) for q in range(6)]  # fmt: skip
    events = rebuild(groups, slots=3)
    decodes = [e for e in events if e["kind"] == "decode" and e["t_end"] > e["t_start"]]
    assert all(len(e["slots"]) == e["active_slots"] <= 3 for e in decodes)
    ids = [e["id"] for e in events if e["kind"] == "sequence"]
    assert len(ids) == len(set(ids)) == 24  # group names repeat within a step; ids do not
    assert {i for e in decodes for i in e["slots"].values()} == set(ids)


def test_variance_split_within_and_between_groups():
    # step mean 4: within (1 + 1) + (1 + 1) = 4, between 2 x 4 + 2 x 4 = 16
    split = variance_split([Group(0, "a", (1, 3)), Group(0, "b", (5, 7))])
    assert split["within_share"] == pytest.approx(0.2)
    assert split["between_share"] == pytest.approx(0.8)


def test_import_lengths_writes_a_run_that_report_re_renders(tmp_path):
    log = _jsonl(
        tmp_path / "lengths.jsonl",
        [
            {"step": 0, "group": "q1", "prompt_tokens": 10, "response_tokens": [4, 2]},
            {"step": 0, "group": "q2", "prompt_tokens": 12, "response_tokens": [2, 8]},
            {"step": 1, "group": "q1", "response_tokens": [3, 3], "worker": 0},
            {"step": 1, "group": "q2", "response_tokens": [6, 1]},
        ],
    )
    out = tmp_path / "run"
    res = cli("import", "lengths", str(log), "--slots", "2", "--workers", "1,2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = read_json(out / "metrics.json")
    recomputed = metrics.compute(read_trace(out / "trace.jsonl"))
    assert doc["summary"]["bubble_ratio"] == recomputed["summary"]["bubble_ratio"]
    assert doc["steps"][0]["bubble_ratio"] == pytest.approx(1 / 3)
    assert doc["run"]["time_unit"] == "decode step"
    modes = {(r["workers"], r["mode"]) for r in doc["whatif"]["results"]}
    synchronous = {(w, m) for w in (1, 2) for m in ("baseline", "sorted", "sorted-partial", "histopipe")}
    assert modes == synchronous | {(2, "async")}  # async's two pools need two devices
    assert [(n["mode"], n["workers"]) for n in doc["whatif"]["not_modelled"]] == [("async", 1)]
    assert "not a measurement" in doc["whatif"]["label"]
    assert 0 <= doc["integration"]["length_variance"]["within_share"] <= 1
    assert "predicted W=    2 sorted" in res.stdout
    (out / "report.html").unlink()
    assert cli("report", str(out)).returncode == 0
    page = (out / "report.html").read_text()
    assert "What each mode would buy here (predicted)" in page and "within prompt groups" in page


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"step": 0, "group": "a", "response_tokens": []}', "response_tokens is not a non-empty list"),
        ('{"step": -1, "group": "a", "response_tokens": [3]}', "step is -1"),
        ('{"step": 0, "response_tokens": [3]}', "lacks field(s) group"),
        ('{"step": 0, "group": "a", "response_tokens": [2], "worker": "x"}', "worker is 'x'"),
        ('{"step": 0, "group": "a", "response_tokens": [99999999]}', "more than 16,777,216 tokens"),
        ("not json", "malformed JSON"),
        # values past any run (they overflowed numpy's int64 deep in the what-if, with no FILE:LINE)
        ('{"step": 0, "group": "a", "response_tokens": [3], "prompt_tokens": 9223372036854775808}',
         "bad.jsonl:1: prompt_tokens is 9223372036854775808, not an integer in 0..16,777,216"),
        ('{"step": 0, "group": "a", "response_tokens": [3], "prompt_tokens": 1' + "0" * 400 + "}",
         "bad.jsonl:1: prompt_tokens is 1000000000000000000000000000000000000..."),
        ('{"step": 9223372036854775808, "group": "a", "response_tokens": [3]}', "bad.jsonl:1: step is"),
        ('{"step": 1' + "0" * 400 + ', "group": "a", "response_tokens": [3]}', "bad.jsonl:1: step is"),
        ('{"step": 0, "group": "a", "response_tokens": [3], "worker": 4294967296}', "bad.jsonl:1: worker is"),
    ],
)  # fmt: skip
def test_a_bad_length_log_is_one_line(tmp_path, line, why):
    log = tmp_path / "bad.jsonl"
    log.write_text(line + "\n")
    assert_one_line_error(cli("import", "lengths", str(log), "--out", str(tmp_path / "o")), why)


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        # 20,000 workers in one step became 20,000 batches and a 5.5 GB trace; refused at the line past 4,096
        ([{"step": 0, "group": "a", "response_tokens": [1], "worker": w} for w in range(4097)],
         "bad.jsonl:4097: 4,097 workers so far: a length log names at most 4,096"),
        ([{"step": s, "group": "a", "response_tokens": [1], "worker": s % 16} for s in range(65537)],
         "bad.jsonl:65537: 16 workers x 65,537 steps: at most 1,048,576"),
    ],
)  # fmt: skip
def test_a_length_log_past_its_counts_is_refused_at_the_line(tmp_path, rows, why):
    log = _jsonl(tmp_path / "bad.jsonl", rows)
    assert_one_line_error(cli("import", "lengths", str(log), "--out", str(tmp_path / "o")), why)


def test_a_huge_slot_count_allocates_only_the_slots_in_use():
    import tracemalloc

    from rlbench.integrations.lengthlog import _batch

    tracemalloc.start()
    placed, stretches = _batch([3, 5, 2], 2**31 - 1)  # --slots' own maximum: a 2^31 free list before
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert placed == [(0, 3, 0), (0, 5, 1), (0, 2, 2)] and stretches[-1][1] == 5
    assert peak < 1 << 20


def test_an_import_holds_one_step_of_events_at_a_time(tmp_path, monkeypatch):
    """The rebuilt trace is written step by step: when step k is made, steps before k - 1 are gone (a
    million-line log held 4-5 GB of events at once)."""
    import gc
    import weakref

    from rlbench.integrations import imports, lengthlog

    class Part(list):  # a step's events, weakly referable
        pass

    made: list[weakref.ref] = []
    rebuild_steps = lengthlog.rebuild_steps

    def watched(*args, **kwargs):
        for step in rebuild_steps(*args, **kwargs):
            gc.collect()
            assert all(ref() is None for ref in made[:-1]), "an earlier step's events are still held"
            part = Part(step)
            made.append(weakref.ref(part))
            yield part

    monkeypatch.setattr(lengthlog, "rebuild_steps", watched)
    rows = [{"step": s, "group": f"q{g}", "response_tokens": [1 + (s * g) % 7, 3]} for s in range(6)
            for g in range(3)]  # fmt: skip
    doc = imports.import_lengths(_jsonl(tmp_path / "l.jsonl", rows), imports.ImportConfig(tmp_path / "o"))
    assert len(made) == 6 and len(doc["steps"]) == 6
    # the streamed metrics are the trace's own
    assert doc["summary"] == {**metrics.compute(read_trace(tmp_path / "o" / "trace.jsonl"))["summary"]}


def test_a_fifo_or_device_as_a_log_is_refused_at_once(tmp_path):
    import os

    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        for kind in ("lengths", "verl"):  # `import lengths FIFO` never returned
            res = cli("import", kind, str(path), "--out", str(tmp_path / "o"))
            assert_one_line_error(res, "not a regular file")


def test_a_what_if_too_large_to_replay_is_one_line(tmp_path):
    log = _jsonl(tmp_path / "lengths.jsonl", [{"step": 0, "group": "a", "response_tokens": [5, 9, 2, 7]}])
    res = cli("import", "lengths", str(log), "--workers", "1,1048576", "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "give smaller --workers")


def test_a_missing_file_is_one_line(tmp_path):
    assert_one_line_error(cli("import", "lengths", str(tmp_path / "no.jsonl")), "no such file")
    assert_one_line_error(cli("import", "verl", str(tmp_path / "no.jsonl")), "no such file")


def _verl_step(step: int, gen: float) -> dict:
    """A training line of verl's own file log (tests/fixtures/upstream), its timing_s/gen set to `gen`."""
    line = next(r for r in read_jsonl(UPSTREAM / "verl_sync_1dda039b.jsonl") if "timing_s/gen" in r["data"])
    return {"step": step, "data": {**line["data"], "timing_s/gen": gen}}


def _with(row: dict, key: str, value) -> dict:
    return {**row, "data": {**row["data"], key: value}}


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([{"step": 1, "data": [1, 2]}], "data is not an object"),
        ([{"step": "one", "data": {}}], "step is 'one'"),
        ([{"step": 0, "data": {"val-core/acc": 0.3}}], "no training step in this verl log"),
        ([_verl_step(1, -3.0)], "negative timing_s/gen"),
        # past any run: the refusal came from the rebuilt trace, naming no line of the log
        ([_verl_step(1, 1e308)], "bad.jsonl:1: timing_s/gen is 1e+308, not a time"),
        ([{**_verl_step(1, 3.0), "step": 10**400}], "bad.jsonl:1: step is 1000"),
        # every value the import believes is checked at the reader, naming the line and the key
        (
            [_verl_step(1, 3.0), _with(_verl_step(2, 3.0), "timing_s/reward", -1.0)],
            "bad.jsonl:2: negative timing_s/reward",
        ),
        ([_with(_verl_step(1, 3.0), "timing_s/reward", float("nan"))], "bad.jsonl:1: timing_s/reward is nan"),
        ([_with(_verl_step(1, 3.0), "timing_s/update_actor", 10**400)], "timing_s/update_actor is 1000"),
        ([_with(_verl_step(1, 3.0), "critic/score/mean", float("inf"))], "critic/score/mean is inf"),
        ([_with(_verl_step(1, 3.0), "trainer/idle_ratio", 3.0)], "trainer/idle_ratio is 3, not a share"),
        ([_with(_verl_step(1, 3.0), "timing_s/gen", "12")], "timing_s/gen is str, not a number"),
    ],
)
def test_a_malformed_verl_log_is_one_line(tmp_path, rows, why):
    log = _jsonl(tmp_path / "bad.jsonl", rows)
    assert_one_line_error(cli("import", "verl", str(log), "--out", str(tmp_path / "o")), why)


def test_verl_lines_left_out_are_counted_in_the_output(tmp_path):
    rows = [_verl_step(1, 3.0), {"step": 1, "data": {}}, {"step": 7, "data": {"timing_s/param_sync": 1.0}}]
    log = _jsonl(tmp_path / "log.jsonl", rows)
    res = cli("import", "verl", str(log), "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    notes = json.dumps(read_json(tmp_path / "o" / "metrics.json"))
    assert "1 step(s) with lines but no training line" in notes and "1 line(s) with an empty data" in notes


def test_a_trl_parquet_holding_two_steps_keeps_both_and_bad_figures_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    completions = tmp_path / "trl" / "completions"
    completions.mkdir(parents=True)
    table = pa.table(
        {"step": [1, 1, 2, 2], "prompt": ["a", "a", "a", "a"], "completion_tokens": [3, 5, 7, 9]}
    )
    pq.write_table(table, completions / "completions_00002.parquet")
    args = ("import", "trl", str(tmp_path / "trl"), "--out", str(tmp_path / "o"))
    assert cli(*args).returncode == 0
    steps = {e["step"] for e in read_jsonl(tmp_path / "o" / "trace.jsonl") if e["kind"] == "sequence"}
    assert steps == {1, 2}
    clipped = "completions/clipped_ratio"
    for key, value, why in (("step_time", float("nan"), "step_time is nan"),
                            ("step_time", -2.0, "step_time is -2, and cannot be negative"),
                            (clipped, 1.5, f"{clipped} is 1.5, not a share")):  # fmt: skip
        entry = {"step": 1, "step_time": 1.0, "reward": 0.5, key: value}
        (tmp_path / "trl" / "trainer_state.json").write_text(json.dumps({"log_history": [entry]}))
        res = cli(*args, "--overwrite")
        assert_one_line_error(res, f"trainer_state.json: log_history[0] (step 1): {why}")


def test_a_trl_output_dir_without_lengths_or_with_a_bad_file_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    completions = tmp_path / "trl" / "completions"
    completions.mkdir(parents=True)
    args = ("import", "trl", str(tmp_path / "trl"), "--out", str(tmp_path / "o"))
    assert_one_line_error(cli(*args), "no completions_*.parquet")
    # TRL's table without the length probe's column, and no tokenizer to count the texts
    table = pa.table(
        {"step": [1, 1], "prompt": ["abc", "abc"], "completion": ["x y", "z"], "advantage": [0.1, -0.1]}
    )
    pq.write_table(table, completions / "completions_00001.parquet")
    assert_one_line_error(cli(*args), "no completion_tokens column")
    (completions / "completions_00002.parquet").write_bytes(b"PAR1 not really")
    table = table.append_column("completion_tokens", pa.array([2, 1]))
    pq.write_table(table, completions / "completions_00001.parquet")
    assert_one_line_error(cli(*args), "completions_00002.parquet: not a readable parquet table")
    (completions / "completions_00002.parquet").unlink()
    res = cli(*args, "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert read_json(tmp_path / "o" / "metrics.json")["steps"][0]["bubble_ratio"] == pytest.approx(1 - 3 / 4)
    assert_one_line_error(cli("import", "trl", str(tmp_path / "nope")), "not a directory")


def test_a_parquet_claiming_more_rows_than_a_run_is_refused_from_its_footer(tmp_path, monkeypatch):
    """A 233 kB parquet of 20M rows took `import trl` to 4.9 GB: the count in its footer is checked before
    a row is read (a small bound here stands for MAX_ROWS)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlbench.integrations import trl_logs

    completions = tmp_path / "trl" / "completions"
    completions.mkdir(parents=True)
    rows = 300
    table = pa.table({"step": [1] * rows, "prompt": ["p"] * rows, "completion_tokens": [5] * rows})
    for n in (1, 2):
        pq.write_table(table, completions / f"completions_{n:05d}.parquet")
    monkeypatch.setattr(trl_logs, "MAX_ROWS", 500)  # the second file passes the bound over both
    read: list[int] = []
    batches = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        for batch in batches(self, *args, **kwargs):
            read.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    res = cli("import", "trl", str(tmp_path / "trl"), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "completions_00002.parquet: 300 rows; the completions files hold at most 500")
    assert sum(read) == rows  # the first file only


@pytest.mark.parametrize("value", ["12", [1], {"a": 1}])
def test_audit_refuses_a_length_that_is_not_a_number(tmp_path, value):
    log = _jsonl(tmp_path / "log.jsonl", [_with(_verl_step(1, 3.0), "prompt_length/mean", value)])
    assert_one_line_error(cli("audit", str(log), "--slots", "8"), "prompt_length/mean is")


def test_audit_never_prints_a_share_outside_0_1(tmp_path):
    """Timers summing past the step: the trainer's idle would be negative; it is left out with a note."""
    row = _with(_verl_step(1, 3.0), "timing_s/update_actor", 1e6)
    log = _jsonl(tmp_path / "log.jsonl", [row])
    res = cli("audit", str(log), "--slots", "8", "--out", str(tmp_path / "a.json"))
    assert res.returncode == 0, res.stderr
    doc = read_json(tmp_path / "a.json")
    shares = [f["rebuilt"] for f in doc["figures"] if "idle" in f["quantity"] and f["rebuilt"] is not None]
    assert all(0 <= s <= 1 for s in shares) and not re.search(r"-\d[\d.,]*%", res.stdout)
    assert any("trainer idle not rebuilt" in n for n in doc["notes"])


def test_one_line_cannot_size_the_import_past_its_bound(tmp_path):
    """A group of 70,000 samples (one line) is refused at the line, before anything is built from it."""
    log = _jsonl(tmp_path / "big.jsonl", [{"step": 0, "group": "a", "response_tokens": [1] * 70_000}])
    res = cli("import", "lengths", str(log), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "big.jsonl:1: response_tokens holds 70,000 samples: one group holds at most")


def test_a_line_past_the_length_logs_bound_is_refused_before_it_is_parsed(tmp_path):
    """One line of 1,000,000 samples (2 MB) is refused at 1 MiB read: parsed, it was a list of 8 MB (a 1 GiB
    line of them, 4 GB), before its sample count was checked."""
    log = tmp_path / "wide.jsonl"
    log.write_text('{"step": 0, "group": "a", "response_tokens": [' + ",".join(["1"] * 1_000_000) + "]}\n")
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"wide.jsonl:1: a line longer than 1,048,576 bytes"):
            lengthlog.read(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * lengthlog.MAX_LINE_BYTES, peak
