"""The importers, `rlbench audit` and the open rollout trace on files the upstream writers made themselves
(tests/fixtures/upstream, README.md there names each commit): verl's FileLogger lines and
_write_generations dumps, two generations of verl's fully-async idle names, a real TRL 1.16 GRPOTrainer
output_dir, slime's save_debug_rollout_data .pt; and a length log at a real run's scale."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli

from reference_trainer.trace import metrics, rollout_trace
from reference_trainer.trace.records import read_json, read_jsonl
from reference_trainer.trace.steps import IDLE_HIGH
from rlbench.integrations import verl

UP = Path(__file__).parent / "fixtures" / "upstream"
SYNC = UP / "verl_sync_1dda039b.jsonl"
ASYNC_NEW, ASYNC_OLD = UP / "verl_fully_async_266fdced.jsonl", UP / "verl_fully_async_b178a3cd.jsonl"


def _log(path: Path) -> dict[int, dict]:
    return {r["step"]: r["data"] for r in read_jsonl(path)}


def test_import_verl_reads_the_timing_s_keys_verl_writes(tmp_path):
    out = tmp_path / "run"
    res = cli("import", "verl", str(SYNC), "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc, logged = read_json(out / "metrics.json"), _log(SYNC)
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3]  # verl's global_steps, as its dashboards say
    for row, step in zip(doc["integration"]["per_step"], doc["steps"], strict=True):
        data = logged[row["step"]]
        # the per-sample generation times are under timing_s/ (compute_timing_metrics prefixes every timer)
        mean, top = (data[f"timing_s/agent_loop/generate_sequences/{k}"] for k in ("mean", "max"))
        assert row["bubble_if_concurrent (sample times)"] == pytest.approx(1 - mean / top)
        # the phases account for the whole step: verl's timers, and the rest as 'other'
        assert step["step_time_s"] == pytest.approx(data["timing_s/step"])
        work = sum(data[f"timing_s/{k}"] for k in ("old_log_prob", "ref", "adv", "update_actor"))
        assert step["timing_s/update"] == pytest.approx(work)
        assert step["timing_s/sync"] == pytest.approx(data["timing_s/update_weights"])
        assert step["reward_mean"] == pytest.approx(data["critic/score/mean"])  # not n/a
        assert step["rollout_tokens"] is None and step["trained_tokens"] is None  # unknown, not 0
    summary = doc["summary"]
    assert summary["rollout_tokens_per_s"] is None and summary["trained_tokens"] is None
    page = (out / "report.html").read_text()
    assert '"name":"other"' in page.replace(" ", "")  # the phase bars' 'other' segment
    assert 'rollout tokens/s</div><div class="v">0' not in page
    assert "bubble_if_concurrent (sample times): " in res.stdout


def _word_tokenizer(path: Path) -> Path:
    """One token per whitespace-separated word, saved as transformers saves a tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "word": 2}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(path)
    return path


def test_verl_dumps_agree_with_verls_own_length_figures(tmp_path):
    out, tok = tmp_path / "run", _word_tokenizer(tmp_path / "tok")
    args = ["import", "verl", str(SYNC), "--rollout-dir", str(UP / "verl_rollouts"), "--tokenizer", str(tok)]
    res = cli(*args, "--slots", "16", "--out", str(out))
    assert res.returncode == 0, res.stderr
    logged = _log(SYNC)
    for step in metrics.step_metrics(read_jsonl(out / "trace.jsonl")):
        data = logged[step["step"]]  # verl computed these from the same batch it dumped
        assert step["response_len_mean"] == pytest.approx(data["response_length/mean"])
        assert step["response_len_max"] == data["response_length/max"]
        assert step["trained_tokens"] > 0 and step["rollout_tokens"] > 0


@pytest.mark.parametrize(
    ("log", "trainer_key", "rollouter_key", "generation"),
    [
        (ASYNC_NEW, "fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio", "from 9aaa5761"),
        (ASYNC_OLD, "trainer/idle_ratio", "rollouter/idle_ratio", "before 9aaa5761"),
    ],
)
def test_both_generations_of_fully_async_idle_names_are_read(
    tmp_path, log, trainer_key, rollouter_key, generation
):
    steps, notes = verl.read_log(log)
    assert all(trainer_key in data and rollouter_key in data for data in steps.values())  # the lines merged
    assert any("merged" in n for n in notes)
    assert generation in verl.key_generations(steps)[trainer_key]
    res = cli("import", "verl", str(log), "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    doc = read_json(tmp_path / "run" / "metrics.json")
    assert all(f"verl {rollouter_key}" in row for row in doc["integration"]["per_step"])
    assert any(generation in m for m in doc["integration"]["method"])


def test_audit_says_a_verl_6693_log_is_trainer_bound_though_it_declares_no_idle():
    for log in (ASYNC_NEW, ASYNC_OLD):
        res = cli("audit", str(log), "--slots", "16")
        assert res.returncode == 0, res.stderr
        rollout = next(line for line in res.stdout.splitlines() if line.startswith("rollout idle"))
        assert "0.0% declared" in rollout and "DISAGREES" in rollout
        assert "label: trainer-bound" in res.stdout
        assert "verl#6693" in res.stdout
    # without the slots the rollout's idle share cannot be rebuilt: said, and no label invented from it
    res = cli("audit", str(ASYNC_NEW))
    assert "needs --slots" in res.stdout and "DISAGREES" not in res.stdout


def test_audit_label_follows_the_evidence_and_says_when_it_could_not_check(tmp_path):
    # 16 slots (the fixture's): the rebuilt rollout idle makes the run trainer-bound where the log's own
    # figures (0.5% / 0.0% idle) would call it balanced; the label follows the evidence and says so
    res = cli("audit", str(ASYNC_NEW), "--slots", "16", "--out", str(tmp_path / "a.json"))
    doc = read_json(tmp_path / "a.json")
    assert doc["label"] == "trainer-bound" and doc["label_from"] == "rebuilt"
    assert "follows the evidence" in doc["label_check"] and "say balanced" in doc["label_check"]
    label = next(line for line in res.stdout.splitlines() if line.startswith("label:"))
    assert "follows the evidence" in label
    # 8 slots: the evidence still disagrees with the declared 0.0%, and the label (from it) says so
    res = cli("audit", str(ASYNC_NEW), "--slots", "8", "--out", str(tmp_path / "b.json"))
    doc = read_json(tmp_path / "b.json")
    rollout = doc["figures"][1]
    assert rollout["flagged"] and doc["label_from"] == "rebuilt"
    assert doc["label"] == metrics.bound_label(doc["figures"][0]["rebuilt"], rollout["rebuilt"])
    assert "16.2% rebuilt against 0.0% declared" in doc["label_check"]
    # no slots: the rollout idle cannot be rebuilt, so the declared label is marked unchecked
    res = cli("audit", str(ASYNC_NEW), "--out", str(tmp_path / "c.json"))
    doc = read_json(tmp_path / "c.json")
    assert doc["label_from"] == "rebuilt and declared"
    assert doc["label_check"].startswith("unchecked: the log's rollout idle could not be rebuilt")
    label = next(line for line in res.stdout.splitlines() if line.startswith("label:"))
    assert "unchecked" in label and "needs --slots" in label


def test_audit_of_a_verl_sync_log_and_of_a_run_folder(tmp_path):
    res = cli("audit", str(SYNC), "--slots", "16", "--out", str(tmp_path / "audit.json"))
    assert res.returncode == 0, res.stderr
    doc = read_json(tmp_path / "audit.json")
    trainer = doc["figures"][0]
    assert trainer["declared"] is None  # verl's synchronous trainer declares no idle ratio
    data = _log(SYNC)
    work = sum(d[f"timing_s/{k}"] for d in data.values() if "timing_s/step" in d
               for k in ("reward", "old_log_prob", "ref", "adv", "update_actor"))  # fmt: skip
    total = sum(d["timing_s/step"] for d in data.values() if "timing_s/step" in d)
    assert trainer["rebuilt"] == pytest.approx(1 - work / total)
    assert doc["label"] == metrics.bound_label(trainer["rebuilt"], doc["figures"][1]["rebuilt"])
    assert cli("import", "verl", str(ASYNC_NEW), "--out", str(tmp_path / "run")).returncode == 0
    res = cli("audit", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert "declared by fully_async/trainer/idle_ratio" in res.stdout


def test_import_lengths_of_a_real_scale_log_works_with_its_defaults(tmp_path):
    # one DAPO-style step: 96 groups of 8, responses up to 8,948 tokens (the log that used to be refused)
    rng = random.Random(54)
    rows = []
    for g in range(96):
        base = rng.lognormvariate(7.3, 0.6)
        lengths = [max(1, min(8948, int(rng.lognormvariate(0, 0.5) * base))) for _ in range(8)]
        rows.append({"step": 0, "group": f"q{g}", "prompt_tokens": 200, "response_tokens": lengths})
    rows[0]["response_tokens"][0] = 8948
    log = tmp_path / "dapo.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli("import", "lengths", str(log), "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    # the default counts whose one step fits the replay's budget together (1 + 8 + 64: about 4 s)
    assert "what-if: worker counts 1, 8, 64 (the default counts" in res.stdout
    doc = read_json(tmp_path / "run" / "metrics.json")
    assert {r["workers"] for r in doc["whatif"]["results"]} == {1, 8, 64}
    # a count past the budget is still refused in one line, naming the way out
    res = cli("import", "lengths", str(log), "--workers", "4096", "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "give smaller --workers")


def test_import_trl_of_a_real_output_dir(tmp_path):
    out = tmp_path / "run"
    res = cli("import", "trl", str(UP / "trl_1.16.0"), "--workers", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = read_json(out / "metrics.json")
    state = {
        e["step"]: e
        for e in read_json(UP / "trl_1.16.0" / "trainer_state.json")["log_history"]
        if "step_time" in e
    }
    assert [s["step"] for s in doc["steps"]] == sorted(state) == [1, 2, 3]  # TRL's global_step
    for step in doc["steps"]:
        assert step["reward_mean"] == pytest.approx(state[step["step"]]["reward"])  # TRL's reward, not n/a
    bubble = doc["integration"]["bubble_decode_steps"]
    assert bubble == pytest.approx(doc["summary"]["bubble_ratio"])  # no clock: decode steps either way
    assert f"bubble {bubble:.1%} (over decode steps" in res.stdout


def test_bound_label_is_one_rule():
    high, low = IDLE_HIGH + 0.1, IDLE_HIGH - 0.1
    assert metrics.bound_label(high, low) == "rollout-bound"
    assert metrics.bound_label(low, high) == "trainer-bound"
    assert metrics.bound_label(high, high) == "sync-overhead"
    assert metrics.bound_label(low, low) == "balanced"
    assert metrics.bound_label(None, low) is None


def test_idle_shares_of_a_trace():
    # a 10 s step: rollout 0-6 on 2 slots (one busy 0-6, one 0-3), update 6-10
    events = [
        {"kind": "rollout", "step": 0, "t_start": 0.0, "t_end": 6.0},
        {
            "kind": "decode",
            "step": 0,
            "t_start": 0.0,
            "t_end": 3.0,
            "active_slots": 2,
            "capacity": 2,
            "tokens": 6,
        },
        {
            "kind": "decode",
            "step": 0,
            "t_start": 3.0,
            "t_end": 6.0,
            "active_slots": 1,
            "capacity": 2,
            "tokens": 3,
        },
        {"kind": "update", "step": 0, "t_start": 6.0, "t_end": 10.0},
    ]
    s = metrics.compute(events)["summary"]
    assert s["trainer_idle_share"] == pytest.approx(0.6)
    assert s["rollout_idle_share"] == pytest.approx(1 - 9 / 20)
    assert s["bound"] == "sync-overhead"


def test_convert_each_source_to_the_open_rollout_trace_and_validate(tmp_path):
    tok = _word_tokenizer(tmp_path / "tok")
    sources = {"slime": [str(UP / "slime_rollout_3.pt")], "trl": [str(UP / "trl_1.16.0")],
               "verl": [str(UP / "verl_rollouts"), "--tokenizer", str(tok)]}  # fmt: skip
    lengths = tmp_path / "length_log.jsonl"  # not lengths.jsonl, which is where its conversion goes
    lengths.write_text('{"step": 0, "group": "a", "response_tokens": [3, 5]}\n')
    sources["lengths"] = [str(lengths)]
    assert (
        cli("import", "lengths", str(lengths), "--workers", "1", "--out", str(tmp_path / "r")).returncode == 0
    )
    sources["rlbench"] = [str(tmp_path / "r")]
    for name, args in sources.items():
        out = tmp_path / f"{name}.jsonl"
        res = cli("trace", "convert", *args, "--out", str(out))
        assert res.returncode == 0, (name, res.stderr)
        res = cli("trace", "validate", str(out))
        assert res.returncode == 0 and "match rlbench-rollout-trace/1" in res.stdout, (name, res.stderr)
    slime = rollout_trace.read(tmp_path / "slime.jsonl")
    dump = __import__("torch").load(UP / "slime_rollout_3.pt", weights_only=True)
    assert [r["response_tokens"] for r in slime] == [s["response_length"] for s in dump["samples"]]
    assert all(r["step"] == 3 and r["time_source"] == "measured" for r in slime)  # the sglang_generate spans
    rlbench = rollout_trace.read(tmp_path / "rlbench.jsonl")
    assert sorted(r["response_tokens"] for r in rlbench) == [3, 5] and rlbench[0]["time_source"] == "rebuilt"


def test_a_pickle_that_needs_trust_is_refused_in_one_line(tmp_path):
    pickled = str(UP / "slime_pickled_3.pt")
    res = cli("trace", "convert", pickled, "--out", str(tmp_path / "t.jsonl"))
    assert_one_line_error(res, "can run any code the file holds; pass --trust-pickle")
    res = cli("trace", "convert", pickled, "--trust-pickle", "--out", str(tmp_path / "t.jsonl"))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"status": "done"}, "status: 'done' is not one of"),
        ({"response_tokens": -1}, "response_tokens: -1 is less than the minimum of 0"),
        ({"t_admit": 5.0, "t_finish": 2.0}, "t_finish 2 is before t_admit 5"),
        ({"schema": "other/1"}, "schema: 'rlbench-rollout-trace/1' was expected"),
        # the readers' bounds, which JSON and the schema let through
        ({"t_admit": float("nan")}, "t_admit is nan, not a finite time"),
        ({"t_admit": 0.0, "t_finish": float("inf")}, "t_finish is inf, not a finite time"),
        ({"response_tokens": 10**400}, "response_tokens is 1000"),
        ({"step": 2**63}, "step is 9223372036854775808, past"),
    ],
)
def test_validate_names_the_first_bad_record(tmp_path, change, why):
    good = rollout_trace.record(source="test", step=0, request_id="r0", prompt_hash="0" * 12, group="g",
                                response_tokens=4, status="finished", time_source="none")  # fmt: skip
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    assert_one_line_error(cli("trace", "validate", str(path)), f"record 2: {why}".split(": ", 1)[0])
    assert_one_line_error(cli("trace", "validate", str(path)), why)


def test_audit_of_a_native_run_labels_it_from_its_trace(tiny_model_dir, tmp_path):
    small = ("--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-every", "0")
    res = cli("train", "--model", str(tiny_model_dir), *small, "--steps", "2", "--out", "run", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    res = cli("audit", str(tmp_path / "run"), "--out", str(tmp_path / "audit.json"))
    assert res.returncode == 0, res.stderr
    doc = read_json(tmp_path / "audit.json")
    summary = metrics.compute(read_jsonl(tmp_path / "run" / "trace.jsonl"))["summary"]
    trainer, rollout = doc["figures"][0], doc["figures"][1]
    assert trainer["rebuilt"] == pytest.approx(summary["trainer_idle_share"])
    assert rollout["rebuilt"] == pytest.approx(summary["rollout_idle_share"])
    assert doc["label"] == summary["bound"] and doc["label_from"] == "rebuilt"


def test_a_slime_dump_of_0_bytes_or_with_odd_traces_is_one_line_or_converted(tmp_path):
    torch = __import__("torch")
    (tmp_path / "empty.pt").write_bytes(b"")
    res = cli("trace", "convert", str(tmp_path / "empty.pt"), "--out", str(tmp_path / "e.jsonl"))
    assert_one_line_error(res, "not a torch file")
    dump = torch.load(UP / "slime_rollout_3.pt", weights_only=True)
    odd = [None, "x", {"events": "no"}, {"events": [None, {"name": "sglang_generate", "type": "span_start",
                                                           "ts": "3"}]}]  # fmt: skip
    for n, sample in enumerate(dump["samples"]):
        sample["trace"], sample["spec_info"] = odd[n % len(odd)], [1, None, "x"][n % 3]
    torch.save(dump, tmp_path / "odd.pt")
    res = cli("trace", "convert", str(tmp_path / "odd.pt"), "--out", str(tmp_path / "o.jsonl"))
    assert res.returncode == 0 and ", 0 with times" in res.stdout, res.stderr


def test_trace_convert_says_up_front_that_verl_dumps_need_the_tokenizer(tmp_path):
    out = str(tmp_path / "t.jsonl")
    said = " ".join(
        cli("trace", "convert", "--help").stdout.replace("│", " ").split()
    )  # rich's box, unwrapped
    assert "verl's rollout dumps (their folder; needs --tokenizer)" in said
    res = cli("trace", "convert", str(UP / "verl_rollouts"), "--out", out)
    assert_one_line_error(res, "verl's rollout dumps hold texts, not token counts: pass the run's tokenizer")
    # one dump given alone is named as such, with the folder and the tokenizer it needs
    res = cli("trace", "convert", str(UP / "verl_rollouts" / "1.jsonl"), "--out", out)
    assert_one_line_error(res, f"one of verl's rollout dumps: give their folder ({UP / 'verl_rollouts'})")
    assert "--tokenizer DIR" in res.stderr and not (tmp_path / "t.jsonl").exists()
