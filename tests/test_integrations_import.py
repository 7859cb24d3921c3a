"""`rlbench import lengths` and `rlbench import verl`: logs written here in the documented formats (verl's
file logger and rollout_data_dir dumps; the length log of docs/integrations.md) become rlbench runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

from reference_trainer.trace import metrics
from reference_trainer.trace.records import read_json
from reference_trainer.trace.schema import read_trace
from rlbench.integrations.lengthlog import Group, rebuild, variance_split


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
    ],
)
def test_a_bad_length_log_is_one_line(tmp_path, line, why):
    log = tmp_path / "bad.jsonl"
    log.write_text(line + "\n")
    assert_one_line_error(cli("import", "lengths", str(log), "--out", str(tmp_path / "o")), why)


def test_a_what_if_too_large_to_replay_is_one_line(tmp_path):
    log = _jsonl(tmp_path / "lengths.jsonl", [{"step": 0, "group": "a", "response_tokens": [5, 9, 2, 7]}])
    res = cli("import", "lengths", str(log), "--workers", "1,1048576", "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "give smaller --workers")


def test_a_missing_file_is_one_line(tmp_path):
    assert_one_line_error(cli("import", "lengths", str(tmp_path / "no.jsonl")), "no such file")
    assert_one_line_error(cli("import", "verl", str(tmp_path / "no.jsonl")), "no such file")


def _verl_step(step: int, gen: float) -> dict:
    """One line of verl's file logger, with the keys verl 0.9 logs (values invented for the test)."""
    return {
        "step": step,
        "data": {
            "timing_s/gen": gen,
            "timing_s/reward": 1.0,
            "timing_s/update_actor": 5.0,
            "timing_s/step": 20.0,
            "response_length/mean": 250.0,
            "response_length/max": 1000.0,
            "response_length/min": 10.0,
            "response_length/clip_ratio": 0.1,
            "agent_loop/generate_sequences/min": 0.5,
            "agent_loop/generate_sequences/mean": 3.0,
            "agent_loop/generate_sequences/max": 12.0,
            "fully_async/rollouter/idle_ratio": 0.25,
            "dynamic_resource/rollout_resource_utilization": 0.6,
            "actor/pg_loss": 0.01,
        },
    }


def _verl_log(tmp_path: Path) -> Path:
    validation = {"step": 0, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.2}}
    return _jsonl(tmp_path / "exp.jsonl", [validation, _verl_step(1, 12.0), _verl_step(2, 10.0)])


def test_import_verl_log_only_gives_phases_and_a_stated_estimate(tmp_path):
    out = tmp_path / "run"
    res = cli("import", "verl", str(_verl_log(tmp_path)), "--workers", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = read_json(out / "metrics.json")
    first = doc["steps"][0]
    assert first["step_time_s"] == pytest.approx(20.0)  # recomputed from the phases: verl's timing_s/step
    assert first["timing_s/gen"] == pytest.approx(12.0)
    assert first["timing_s/update"] == pytest.approx(5.0)
    assert first["bubble_ratio"] is None  # no per-sample data: no measured bubble
    row = doc["integration"]["per_step"][0]
    assert row["rollout share"] == pytest.approx(0.6)
    assert row["bubble_if_concurrent (lengths)"] == pytest.approx(0.75)
    assert row["bubble_if_concurrent (sample times)"] == pytest.approx(0.75)
    assert row["fully_async/rollouter/idle_ratio"] == 0.25
    assert doc["whatif"]["available"] is False
    assert "1 line(s) without timing_s/gen" in " ".join(doc["integration"]["method"])
    assert "rollout share: 55.0%" in res.stdout  # (12/20 + 10/20) / 2


def _word_tokenizer(path: Path) -> Path:
    """A whitespace word-level tokenizer saved as transformers saves one: one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "what", "is", "one", "plus", "two", "three", "the", "answer", "it"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(path)
    return path


def test_import_verl_with_rollout_dumps_rebuilds_the_bubble(tmp_path):
    dumps = tmp_path / "rollouts"
    dumps.mkdir()
    samples = [("what is one plus two", "three"), ("what is one plus two", "the answer is three"),
               ("what is two plus one", "it is three"), ("what is two plus one", "three")]  # fmt: skip
    for step in (1, 2):  # verl's _dump_generations: input, output, gts, score, step per sample
        rows = [{"input": i, "output": o, "gts": "3", "score": 1.0, "step": step} for i, o in samples]
        _jsonl(dumps / f"{step}.jsonl", rows)
    out = tmp_path / "run"
    args = ["import", "verl", str(_verl_log(tmp_path)), "--rollout-dir", str(dumps), "--workers", "1"]
    res = cli(*args, "--tokenizer", str(_word_tokenizer(tmp_path / "tok")), "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = read_json(out / "metrics.json")
    # lengths 1, 4, 3, 1 with a slot each: busy 9 of 4 x 4 decode steps
    assert doc["steps"][0]["bubble_ratio"] == pytest.approx(1 - 9 / 16)
    assert doc["steps"][0]["timing_s/gen"] == pytest.approx(12.0)  # spread over verl's measured rollout
    assert doc["integration"]["per_step"][0]["rlbench bubble_ratio"] == pytest.approx(1 - 9 / 16)
    assert doc["integration"]["length_variance"]["group_sizes"] == [2]
    assert doc["whatif"]["available"] is True
    assert (out / "lengths.jsonl").read_text().count("\n") == 4  # two groups in each of two steps
    assert_one_line_error(cli("import", "verl", str(tmp_path / "exp.jsonl"), "--rollout-dir", str(dumps)),
                          "--rollout-dir needs --tokenizer")  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([{"step": 1, "data": [1, 2]}], "data is not an object"),
        ([{"step": "one", "data": {}}], "step is 'one'"),
        ([{"step": 0, "data": {"val-core/acc": 0.3}}], "no training step in this verl log"),
        ([_verl_step(1, -3.0)], "negative timing_s/gen"),
    ],
)
def test_a_malformed_verl_log_is_one_line(tmp_path, rows, why):
    log = _jsonl(tmp_path / "bad.jsonl", rows)
    assert_one_line_error(cli("import", "verl", str(log), "--out", str(tmp_path / "o")), why)


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
