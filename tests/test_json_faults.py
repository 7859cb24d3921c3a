"""JSON the interpreter itself refuses (nesting past the recursion limit, integers past 4,300 digits) and
files of the wrong shape, in every file the commands read back: one line naming the file, never a
RecursionError or ValueError traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import assert_one_line_error, cli

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000
EVENT = {"kind": "rollout", "step": 0, "t_start": 0.0, "t_end": 1.0}


@pytest.mark.parametrize(("name", "text", "message"), [
    ("deep", DEEP, "JSON nested too deeply to read"),
    ("huge integer", '{"a": ' + HUGE + "}", "an integer of more than 4,300 digits"),
])  # fmt: skip
def test_json_the_interpreter_refuses_is_one_line_in_every_reader(
    tiny_model_dir, tmp_path, name, text, message
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trace.jsonl").write_text(json.dumps(EVENT) + "\n" + text + "\n")
    assert_one_line_error(cli("trace", "export", str(run), tmp=tmp_path), f"trace.jsonl:2: {message}")
    assert_one_line_error(cli("report", str(run), tmp=tmp_path), message)
    for file in ("metrics.json", "results.json", "compare.json"):
        saved = tmp_path / file.split(".")[0]
        saved.mkdir()
        (saved / file).write_text(text)
        assert_one_line_error(cli("report", str(saved), tmp=tmp_path), f"{saved / file}: {message}")
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "config.json").write_text(text)
    res = cli("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2", tmp=tmp_path)
    assert_one_line_error(res, f"{model / 'config.json'}: {message}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text(text + "\n")
    res = cli("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(tiny_model_dir), "--out",
              "ev", tmp=tmp_path)  # fmt: skip
    assert_one_line_error(res, f"amc23.jsonl:1: {message}")
    res = cli(
        "train", "--model", str(tiny_model_dir), "--mode-option", f"x={text}", "--out", "t", tmp=tmp_path
    )
    assert_one_line_error(res, "takes no option x")  # a value that is not JSON is a string, never a traceback


@pytest.mark.parametrize(("doc", "message"), [
    ([1, 2], "char_tokenizer.json: not a JSON object"),
    ({"type": "char"}, "char_tokenizer.json: vocab is not a list of strings"),
    ({"type": "char", "vocab": ["a", "b"]}, "char_tokenizer.json: vocab must start with"),
    ('{"type": "ch', "char_tokenizer.json:1: malformed JSON"),
])  # fmt: skip
def test_a_char_tokenizer_of_the_wrong_shape_is_one_line_naming_it(tiny_model_dir, tmp_path, doc, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "char_tokenizer.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    res = cli("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2", tmp=tmp_path)
    assert_one_line_error(res, message)
    assert str(model) in res.stderr


@pytest.mark.parametrize(("value", "message"), [
    ("abc", "task 'arith': option max_ops must be int, got 'abc'"),
    ("2.5", "task 'arith': option max_ops must be int, got 2.5"),
    ("true", "task 'arith': option max_ops must be int, got True"),
])  # fmt: skip
def test_a_task_option_of_the_wrong_type_says_so(tmp_path, value, message):
    res = cli("train", "--task-option", f"max_ops={value}", "--out", "run", tmp=tmp_path)
    assert_one_line_error(res, message)
    assert not (tmp_path / "run").exists()
