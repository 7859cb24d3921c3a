"""Every writer holds its run directory's lock and refuses a folder that holds another command's run: a
train run is not replaced by an eval's or an observation's files, a finished comparison or observation is
not replaced without --overwrite, and two simulations or reproductions never write one folder at once."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, cli


def tiny_run(model) -> tuple[str, ...]:
    return ("--model", str(model), "--prompts-per-step", "1", "--group-size", "2", "--max-tokens", "4",
            "--eval-every", "0")  # fmt: skip


def suite(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(
        json.dumps({"id": "p0", "problem": "What is 1 + 1?", "answer": "2"}) + "\n"
    )
    return data


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".rlbench.lock"}


def test_a_command_refuses_a_folder_that_holds_another_commands_run(tiny_model_dir, tmp_path):
    runs = {
        "train": {"train_config.json": "{}", "metrics.jsonl": "", "report.html": "train's"},
        "eval": {"run_config.json": "{}", "problems.jsonl": "", "report.html": "eval's"},
        "observe": {"samples.jsonl": "", "metrics.json": "{}", "report.html": "observe's"},
        "simulate": {"simulate.json": "{}", "report.html": "simulate's"},
    }
    for kind, files in runs.items():
        (tmp_path / kind).mkdir()
        for name, text in files.items():
            (tmp_path / kind / name).write_text(text)
    before = {kind: snapshot(tmp_path / kind) for kind in runs}
    data = suite(tmp_path)
    commands = {
        "eval": ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir)),
        "profile": ("profile", *tiny_run(tiny_model_dir)),
        "observe": ("observe", "127.0.0.1:9", "--duration", "1"),
        "simulate": ("simulate", "--synthetic", "--workers", "1", "--steps", "1", "--prompts", "2"),
        "train": ("train", *tiny_run(tiny_model_dir), "--overwrite"),
    }
    for command, args in commands.items():
        for kind in runs:
            if kind == command or (command == "profile" and kind == "train"):
                continue  # its own kind (a profile also replaces a trainer run, with --overwrite)
            res = cli(*args, "--out", str(tmp_path / kind), tmp=tmp_path)
            assert_one_line_error(res, f"{tmp_path / kind} holds ")
            assert f"not {command}'s run: use another --out" in res.stderr
    assert before == {kind: snapshot(tmp_path / kind) for kind in runs}


def test_observe_keeps_the_samples_of_an_earlier_observation(tmp_path):
    obs = tmp_path / "obs"
    obs.mkdir()
    row = {"t": 0.0, "server": 0, "running": 1, "waiting": 0, "generation_tokens": 10}
    (obs / "samples.jsonl").write_text(json.dumps(row) + "\n")
    res = cli("observe", "127.0.0.1:9", "--duration", "1", "--out", str(obs), tmp=tmp_path)
    assert_one_line_error(res, f"rlbench observe --from-samples {obs}` rebuilds its report")
    assert (obs / "samples.jsonl").read_text() == json.dumps(row) + "\n"
    gone = tmp_path / "nowhere"
    assert_one_line_error(cli("observe", "--from-samples", str(gone), tmp=tmp_path), "no samples.jsonl")
    assert not gone.exists()  # nothing created for a rebuild that has nothing to rebuild


def test_a_finished_comparison_is_replaced_only_with_overwrite_and_leaves_no_orphans(tmp_path):
    from reference_trainer.errors import UserError
    from rlbench.rundirs import check_new_comparison

    out = tmp_path / "cmp"
    for mode in ("baseline", "rhyme"):
        (out / mode).mkdir(parents=True)
        (out / mode / "train_config.json").write_text("{}")
    (out / "notes").mkdir()  # not a mode's run: kept
    (out / "compare.json").write_text("{}")
    with pytest.raises(UserError, match="already holds a comparison: pass --overwrite"):
        check_new_comparison(out, ["baseline", "sorted"], overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == ["baseline", "compare.json", "notes", "rhyme"]
    check_new_comparison(out, ["baseline", "sorted"], overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["baseline", "compare.json", "notes"]


def test_compare_refuses_a_finished_comparison_before_any_mode_runs(tiny_model_dir, tmp_path):
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "compare.json").write_text('{"runs": []}')
    res = cli("compare", "--modes", "sorted", *tiny_run(tiny_model_dir), "--out", "cmp", tmp=tmp_path)
    assert_one_line_error(res, "cmp already holds a comparison: pass --overwrite")
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == [".rlbench.lock", "compare.json"]


def test_observe_simulate_and_reproduce_are_refused_beside_a_running_writer(held, tmp_path):
    run, pid = held
    for args in (
        ("observe", "127.0.0.1:9", "--duration", "1"),
        ("simulate", "--synthetic", "--workers", "1", "--steps", "1", "--prompts", "2"),
        ("reproduce", "histopipe-balance", "--quick"),
    ):
        assert_one_line_error(
            cli(*args, "--out", str(run), tmp=tmp_path),
            f"{run} is in use by another rlbench process (pid {pid})",
        )
    assert [p.name for p in run.iterdir()] == [".rlbench.lock"]


# ---- the one rule for what a command writes: never its input, another run, or a file it did not make ------


def lengths_log(tmp_path):
    log = tmp_path / "lengths.jsonl"
    rows = [
        {"step": s, "group": g, "prompt_tokens": 10, "response_tokens": [4, 2 + s]}
        for s in (0, 1)
        for g in "ab"
    ]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return log


def test_a_written_file_is_never_the_input_another_run_or_a_file_there(tmp_path):
    log = lengths_log(tmp_path)
    run = tmp_path / "run"
    assert (
        cli("import", "lengths", str(log), "--slots", "2", "--workers", "1", "--out", str(run)).returncode
        == 0
    )
    before = snapshot(run)
    for args in (
        ("trace", "convert", str(run), "--out", str(run / "trace.jsonl")),  # its own input
        ("trace", "convert", str(log), "--out", str(log)),
        ("audit", str(log), "--slots", "8", "--out", str(log)),
        ("audit", str(run), "--out", str(run / "metrics.json")),
    ):
        assert_one_line_error(cli(*args), "input")
    other = tmp_path / "other"
    assert (
        cli("import", "lengths", str(log), "--slots", "2", "--workers", "1", "--out", str(other)).returncode
        == 0
    )
    assert_one_line_error(
        cli("trace", "convert", str(log), "--out", str(other / "trace.jsonl")), "--overwrite"
    )
    (tmp_path / "mine.jsonl").write_text("keep\n")
    assert_one_line_error(cli("trace", "convert", str(log), "--out", str(tmp_path / "mine.jsonl")), "exists")
    assert (tmp_path / "mine.jsonl").read_text() == "keep\n" and snapshot(run) == before
    res = cli("trace", "convert", str(log), "--out", str(tmp_path / "mine.jsonl"), "--overwrite")
    assert res.returncode == 0 and (tmp_path / "mine.jsonl").read_text() != "keep\n"


def test_import_and_simulate_replace_a_finished_run_only_with_overwrite(tmp_path):
    log, out = lengths_log(tmp_path), tmp_path / "imp"
    args = ("import", "lengths", str(log), "--slots", "2", "--workers", "1", "--out", str(out))
    assert cli(*args).returncode == 0
    before = snapshot(out)
    assert_one_line_error(cli(*args), "--overwrite")
    assert snapshot(out) == before
    assert cli(*args, "--overwrite").returncode == 0
    assert_one_line_error(cli("import", "lengths", str(log), "--out", str(tmp_path)), "holds the input")
    sim = ("simulate", "--synthetic", "--prompts", "4", "--group-size", "2", "--mean-tokens", "20",
           "--max-tokens", "40", "--steps", "1", "--workers", "1", "--modes", "baseline",
           "--out", str(tmp_path / "s"))  # fmt: skip
    assert cli(*sim).returncode == 0
    assert_one_line_error(cli(*sim), "--overwrite")
    assert cli(*sim, "--overwrite").returncode == 0


def test_two_suites_on_one_data_file_are_refused_before_anything_is_written(tmp_path):
    for name in ("sa", "sb"):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\ntitle: {name}\nprompt: math\ngrader: math\ndata:\n  file: shared.jsonl\n"
        )
    (tmp_path / "shared.jsonl").write_text(json.dumps({"id": "p0", "problem": "1+1?", "answer": "2"}) + "\n")
    res = cli("suites", "download", "sa", "sb", "--include-path", str(tmp_path), "--to", str(tmp_path / "d"))
    assert_one_line_error(res, "both write data.file")
    assert not (tmp_path / "d").exists()
    res = cli("suites", "download", "sa", "--include-path", str(tmp_path), "--to", "/dev/null")
    assert_one_line_error(res, "not a folder")
