"""Suite files as data: the built-in ones in suites/, a user's own (a path or --include-path), their checks
before any model loads, and the package carrying them (editable and wheel installs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, cli

from reference_trainer.errors import UserError
from reference_trainer.tasks.grading import GradeItem, grade_item
from rlbench.eval.pool import GradingPool
from rlbench.eval.runner import EvalConfig, plan_eval, run_eval
from rlbench.eval.suite_file import Group, Suite, parse_file
from rlbench.eval.suites import (
    BUILTIN_DIR,
    get_suite,
    group_members,
    import_path,
    resolve,
    suite_files,
    validate,
)

GRADER = """def grade(response, gold):
    answer = response.strip().split()[-1]
    return answer, answer == gold
"""


def _user_suite(folder: Path, **overrides: object) -> Path:
    """capitals.yaml, its data beside it and its own grader (capital_grader.grade)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": "capitals",
        "title": "Capital cities",
        "data": {"file": "capitals.jsonl"},
        "prompt": "Name the capital. {problem}\nAnswer:",
        "grader": "python:capital_grader:grade",
        "sampling": {"temperature": 0.0, "max_tokens": 8},
        "metrics": ["avg@k", "pass@k"],
        **overrides,
    }
    (folder / "capitals.yaml").write_text(json.dumps(doc))  # JSON is YAML
    (folder / "capital_grader.py").write_text(GRADER)
    rows = [
        {"id": "fr", "problem": "France?", "answer": "Paris"},
        {"id": "it", "problem": "Italy?", "answer": "Rome"},
    ]
    (folder / "capitals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "capitals.yaml"


class EchoBackend:
    """Answers "Paris" to every prompt, and remembers the prompts."""

    name, model, tokenizer = "echo", "echo", None

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        self.prompts += prompts
        return ["The capital is Paris" for _ in prompts]

    def close(self) -> None:
        pass


def test_builtin_suites_live_in_the_top_level_folder_and_validate() -> None:
    assert BUILTIN_DIR.resolve() == (ROOT / "suites").resolve()
    files = suite_files()
    assert {"math500", "aime24", "amc23", "olympiadbench", "kk", "kk-ood", "math"} <= files.keys()
    for path in files.values():
        assert validate(path, None) == [], path
    assert get_suite("math500").hub["fields"]["id"] == "unique_id"
    assert [s.name for s in group_members(resolve("math"))] == ["math500", "aime24", "amc23", "olympiadbench"]


def test_unknown_keys_and_bad_values_are_refused_with_their_names(tmp_path: Path) -> None:
    path = _user_suite(tmp_path, titel="typo", sampling={"temprature": 0.5}, metrics=["best@k"])
    problems = validate(path, None)
    assert "unknown key 'titel'; allowed: name, title" in problems[0]
    assert any("unknown key 'sampling.temprature'" in p for p in problems)
    assert any("metrics: unknown 'best@k'" in p for p in problems)
    with pytest.raises(UserError, match=r"capitals.yaml: unknown key 'titel'"):
        get_suite(str(path))
    res = cli("suites", "validate", str(path))
    assert (
        res.returncode == 2 and res.stderr.count("\n") == len(problems) + 1 and "Traceback" not in res.stderr
    )


def test_validate_checks_the_grader_imports_and_the_data_resolves(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RLBENCH_DATA_DIR", raising=False)  # the suites' own folder, not a user's data dir
    path = _user_suite(tmp_path, grader="python:capital_grader:nothere")
    assert validate(path, None) == ["grader 'python:capital_grader:nothere': capital_grader has no nothere"]
    (tmp_path / "capitals.jsonl").unlink()
    assert any("names no hub dataset" in p for p in validate(path, None))
    assert_one_line_error(cli("eval", "--suite", str(tmp_path / "none.yaml")), "suite file not found")
    assert_one_line_error(cli("suites", "--data-dir", str(path)), "is a file; pass the folder")
    (tmp_path / "broken.yaml").write_text("name: x\n  bad: [\n")
    res = cli("suites", "validate", str(tmp_path / "broken.yaml"), str(tmp_path / "capitals.yaml"))
    assert res.returncode == 2 and f"{tmp_path / 'broken.yaml'}: not valid YAML: " in res.stderr
    assert f"{tmp_path / 'capitals.yaml'}: suite 'capitals' names no hub dataset" in res.stderr  # checked too


def test_a_users_suite_runs_with_its_prompt_grader_and_sampling(tmp_path: Path) -> None:
    path = _user_suite(tmp_path / "mine")
    cfg = EvalConfig(
        suite=str(path), model="echo", samples=None, temperature=None, top_p=None, max_tokens=None
    )
    backend = EchoBackend()
    with GradingPool(workers=1) as pool:
        res = run_eval(
            plan_eval(get_suite(cfg.suite), cfg), lambda: backend, tmp_path / "out", pool=pool, progress=False
        )
    assert (
        backend.prompts[0]
        == "Question: Name the capital. France?\nAnswer:\nAnswer: Let's think step by step."
    )
    assert res["sampling"]["temperature"] == 0.0 and res["sampling"]["max_tokens"] == 8  # the suite's
    assert res["accuracy"] == 0.5 and [p["extracted"] for p in res["problems"]] == [["Paris"], ["Paris"]]
    assert res["suite_sha256"] == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    assert res["metrics"] == ["avg@k", "pass@k"]


def test_include_path_finds_a_users_suite_by_name(tmp_path: Path) -> None:
    _user_suite(tmp_path)
    (tmp_path / "mine.yaml").write_text("group: mine\nsuites: [capitals, aime24]\n")
    assert get_suite("capitals", [tmp_path]).title == "Capital cities"
    assert [s.name for s in group_members(resolve("mine", [tmp_path]), [tmp_path])] == ["capitals", "aime24"]
    listing = cli("suites", "--include-path", str(tmp_path))
    assert "capitals" in listing.stdout and "group: capitals, aime24" in listing.stdout
    assert_one_line_error(cli("eval", "--suite", "capitals"), "unknown suite 'capitals'")


def test_an_eval_job_reads_each_suite_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's plans carry the suites they read: a group file and each member are read once, before
    any model, and each plan runs its own suite."""
    from rlbench.eval import suite_file
    from rlbench.evaluate import EvalJob

    _user_suite(tmp_path)
    (tmp_path / "mine.yaml").write_text("group: mine\nsuites: [capitals]\n")
    read = suite_file.read_raw
    reads: list[str] = []
    monkeypatch.setattr(suite_file, "read_raw", lambda path: reads.append(Path(path).name) or read(path))
    plans = EvalJob(
        EvalConfig(suite="mine", temperature=None), include=[tmp_path], out=tmp_path / "ev"
    ).check()
    assert reads == ["mine.yaml", "capitals.yaml"]
    assert [(plan.suite.name, out.name, len(plan.problems)) for plan, out in plans] == [
        ("capitals", "capitals", 2)
    ]
    assert plans[0][0].config.model is None and plans[0][0].config.temperature == 0.0  # the suite's sampling


def test_a_user_grader_grades_in_a_pool_worker(tmp_path: Path) -> None:
    suite = get_suite(str(_user_suite(tmp_path)))
    import_path(suite)
    try:
        item = GradeItem(suite.grader, "so it is Rome", "Rome")
        assert grade_item(item).correct
        with GradingPool(workers=1) as pool:
            assert [r.extracted for r in pool.grade([item])] == ["Rome"]
    finally:
        sys.path.remove(str(tmp_path.resolve()))


def test_parse_tells_a_group_from_a_suite() -> None:
    group, _ = parse_file(BUILTIN_DIR / "math.yaml")
    suite, _ = parse_file(BUILTIN_DIR / "kk.yaml")
    assert isinstance(group, Group) and isinstance(suite, Suite) and suite.grader == "kk"


PROBE = "from rlbench.eval.suites import BUILTIN_DIR, suite_files; print(BUILTIN_DIR, sorted(suite_files()))"


def _source_copy(tmp_path: Path) -> Path:
    """The package's sources in tmp_path/src: a build in the checkout would leave build/ behind."""
    src = tmp_path / "src"
    for name in ("rlbench", "reference_trainer", "suites"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    return src


@pytest.mark.e2e
def test_a_wheel_carries_the_suites(tmp_path: Path) -> None:
    """`pip wheel` then an install elsewhere: the suites come from the installed package (and the GPU
    calibrations are in it too: package data read at run time)."""
    src = _source_copy(tmp_path)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "whl"),
                    str(src)], check=True, cwd=tmp_path)  # fmt: skip
    wheel = next((tmp_path / "whl").glob("rlbench-*.whl"))
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(tmp_path / "site" / "rlbench" / "suites")) and "math500" in out.stdout
    calibrations = tmp_path / "site" / "rlbench" / "simulate" / "calibrations"
    assert sorted(p.name for p in calibrations.glob("*.json")) == sorted(
        p.name for p in (ROOT / "rlbench" / "simulate" / "calibrations").glob("*.json")
    )


@pytest.mark.e2e
def test_an_editable_install_reads_the_top_level_suites(tmp_path: Path) -> None:
    """`pip install -e` (setuptools' import finder): the suites come from the source tree's suites/."""
    src = _source_copy(tmp_path)
    # --ignore-installed: without it pip uninstalls this interpreter's own rlbench (and its `rlbench` script)
    # before installing into the new prefix, a change outside tmp_path.
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip.append("--ignore-installed")
    subprocess.run([*pip, "--prefix", str(tmp_path / "prefix"), "-e", str(src)], check=True, cwd=tmp_path)
    site_dir = next((tmp_path / "prefix").glob("lib/python*/site-packages"))
    # the new install's finder first (its .pth), then this interpreter's own packages for the dependencies
    probe = f"import site, sys; site.addsitedir({str(site_dir)!r}); sys.path.extend(sys.argv[1:]); {PROBE}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-S", "-c", probe, *[p for p in sys.path if "site-packages" in p]],
                         capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(src / "rlbench" / "suites")) and "math500" in out.stdout


# ----------------------------------------------------------------------------- issue 56: values, download


@pytest.mark.parametrize(
    ("sampling", "line"),
    [
        ({"samples": 0}, "sampling.samples must be in 1.."),
        ({"samples": 70000}, "sampling.samples (-k) is 70,000 sequences at once"),
        ({"temperature": -1}, "sampling.temperature must be 0 (greedy) or in"),
        ({"top_p": 1.5}, "sampling.top_p must be >= 1e-06 and <= 1"),
        ({"max_tokens": 0}, "sampling.max_tokens must be in 1.."),
        ({"max_tokens": 2.5}, "sampling.max_tokens must be an integer"),
    ],
)
def test_a_suites_sampling_is_checked_by_the_flags_rules_and_named_by_its_key(
    tmp_path: Path, sampling: dict[str, object], line: str
) -> None:
    """`sampling: {samples: 0}` passed validate, and eval then blamed a --samples flag never given."""
    path = _user_suite(tmp_path, sampling=sampling)
    assert any(line in p for p in validate(path, None)), validate(path, None)
    res = cli("eval", "--suite", str(path))
    assert_one_line_error(res, f"{path}: {line}")
    assert "--samples" not in res.stderr and "--max-tokens" not in res.stderr


def test_a_group_by_field_that_groups_nothing_is_refused(tmp_path: Path) -> None:
    path = _user_suite(tmp_path, group_by=["subjet"])
    assert any("group_by: unknown 'subjet'" in p for p in validate(path, None))


def _local_hub_suite(folder: Path) -> Path:
    """A suite whose hub dataset is a local folder (datasets reads it without the network), with its own
    field names, as a hub dataset has."""
    hub = folder / "hub"
    hub.mkdir(parents=True)
    rows = [{"uid": f"q{i}", "question": f"What is {i} + {i}?", "final": float(2 * i), "subject": "sums"}
            for i in range(1, 4)]  # fmt: skip
    (hub / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = {
        "name": "sums", "title": "Sums", "prompt": "math", "grader": "math", "group_by": ["subject"],
        "data": {"file": "sums.jsonl",
                 "hub": {"id": str(hub), "split": "train", "data_files": ["test.jsonl"]},
                 "fields": {"id": "uid", "problem": "question", "answer": "final"}},
    }  # fmt: skip
    (folder / "suites").mkdir()
    (folder / "suites" / "sums.yaml").write_text(json.dumps(doc))
    return folder / "suites"


def test_download_writes_exactly_what_data_dir_reads(tmp_path: Path) -> None:
    """`rlbench suites download NAME --to DIR` on a connected machine (here a local hub folder, never the
    network), then `--data-dir DIR` on one without: the same problems."""
    from rlbench.eval.suites import load_problems

    include = _local_hub_suite(tmp_path)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    res = cli("suites", "download", "sums", "--include-path", str(include), "--to", str(tmp_path / "data"),
              env=offline)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"sums: 3 problems -> {tmp_path / 'data' / 'sums.jsonl'}"
    rows = [json.loads(line) for line in (tmp_path / "data" / "sums.jsonl").read_text().splitlines()]
    assert rows[0] == {"id": "q1", "problem": "What is 1 + 1?", "answer": "2", "subject": "sums"}
    suite = get_suite("sums", [include])
    assert load_problems(suite, tmp_path / "data") == load_problems(suite, None)
    assert validate(include / "sums.yaml", tmp_path / "data") == []


def test_download_refuses_a_suite_without_a_data_file_before_fetching(tmp_path: Path) -> None:
    include = _local_hub_suite(tmp_path)
    doc = json.loads((include / "sums.yaml").read_text())
    del doc["data"]["file"]
    (include / "sums.yaml").write_text(json.dumps(doc))
    res = cli("suites", "download", "sums", "--include-path", str(include), "--to", str(tmp_path / "data"))
    assert_one_line_error(res, "suite 'sums' names no data.file")
    assert not (tmp_path / "data").exists()


def test_offline_eval_names_the_download_command() -> None:
    res = cli("eval", "--suite", "aime24", env={"HF_HUB_OFFLINE": "1", "RLBENCH_DATA_DIR": ""})
    assert_one_line_error(res, "`rlbench suites download aime24 --to DIR`")


# ---- paths a suite file names stay inside their roots; its YAML is read safely (issue 55) ----------------


def _group(folder: Path, *members: str) -> Path:
    (folder / "g.yaml").write_text(json.dumps({"group": "g", "suites": list(members)}))
    return folder / "g.yaml"


@pytest.mark.parametrize("name", ["/abs/foreign_dir", "../../escaped_eval", "a/b", ".."])
def test_a_members_name_cannot_lead_its_eval_outside_out(tmp_path: Path, name: str) -> None:
    from rlbench.evaluate import EvalJob

    _user_suite(tmp_path / "g", name=name)
    group = _group(tmp_path / "g", "capitals.yaml")
    job = EvalJob(EvalConfig(suite=str(group)), out=tmp_path / "out")
    with pytest.raises(UserError, match="not a plain name"):
        job.check()  # before any model is resolved or folder claimed
    assert validate(group, None) != []  # and `suites validate` says so
    assert not (tmp_path / "out").exists()


def test_two_members_of_one_name_would_share_a_folder(tmp_path: Path) -> None:
    _user_suite(tmp_path / "g")
    shutil.copy(tmp_path / "g" / "capitals.yaml", tmp_path / "g" / "again.yaml")
    group = _group(tmp_path / "g", "capitals.yaml", "again.yaml")
    with pytest.raises(UserError, match="both named 'capitals'"):
        group_members(parse_file(group)[0])  # type: ignore[arg-type]
    assert any("both named" in p for p in validate(group, None))


@pytest.mark.parametrize("member", ["../outside.yaml", "/etc/x.yaml", "sub/../../x.yaml"])
def test_a_group_member_path_stays_in_the_groups_folder(tmp_path: Path, member: str) -> None:
    _user_suite(tmp_path)  # a readable suite outside the group's folder
    shutil.copy(tmp_path / "capitals.yaml", tmp_path / "outside.yaml")
    (tmp_path / "g").mkdir()
    group = _group(tmp_path / "g", member)
    problems = validate(group, None)
    assert problems and "leads outside" in problems[0], problems


@pytest.mark.parametrize("file", ["../outside/x.jsonl", "/abs/x.jsonl", "x" * 5000, "a/../../x.jsonl"])
def test_a_data_file_stays_inside_its_folder(tmp_path: Path, file: str) -> None:
    path = _user_suite(tmp_path, data={"file": file})
    problems = validate(path, None)
    assert any("data.file" in p for p in problems), problems
    res = cli("suites", "validate", str(path))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("sampling", "said"),
    [
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"temperature": -1}, "sampling.temperature"),
        ({"top_p": 7}, "sampling.top_p"),
        ({"samples": 0}, "sampling.samples"),
        ({"samples": 10**6}, "sampling.samples"),
        ({"max_tokens": 2**62}, "sampling.max_tokens"),
    ],
)
def test_sampling_values_hold_the_options_ranges(tmp_path: Path, sampling: dict, said: str) -> None:
    path = _user_suite(tmp_path, sampling=sampling)
    assert any(p.startswith(said) for p in validate(path, None)), validate(path, None)


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("def grade(:\n", "SyntaxError at"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("import sys\nsys.exit(0)\n", "it called sys.exit(0)"),
    ],
)
def test_a_grader_that_fails_to_import_is_a_verdict(tmp_path: Path, module: str, said: str) -> None:
    path = _user_suite(tmp_path, grader="python:broken_grader_" + str(abs(hash(module)))[:8] + ":grade")
    grader = json.loads(path.read_text())["grader"].split(":")[1]
    (tmp_path / f"{grader}.py").write_text(module)
    res = cli("suites", "validate", str(path))  # sys.exit(0) at import made this exit 0, with no verdict
    assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_relative_grader_module_is_refused(tmp_path: Path) -> None:
    path = _user_suite(tmp_path, grader="python:.rel:grade")
    assert any("absolute module name" in p for p in validate(path, None))


@pytest.mark.parametrize("key", ["title", "sampling", "metrics", "data", "group"])
def test_an_alias_bomb_is_one_line_in_any_key(tmp_path: Path, key: str) -> None:
    from test_inputs import BOMB

    lines = BOMB.decode().splitlines()[:-1]  # the anchors a..h; the last line is the bomb itself
    bomb = "[*h, *h, *h, *h, *h, *h, *h, *h, *h]"
    where = {
        "title": f"name: x\ntitle: {bomb}\n",
        "sampling": f"name: x\nsampling: {{temperature: {bomb}}}\n",
        "metrics": f"name: x\nmetrics: {bomb}\n",
        "data": f"name: x\ndata: {{file: d.jsonl, fields: {{problem: {bomb}}}}}\n",
        "group": f"group: g\nsuites: {bomb}\n",
    }[key]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines).replace("a: &a", "_a: &a") + "\n" + where)
    res = cli("suites", "validate", str(path))
    assert res.returncode == 2 and "more than 100,000 YAML nodes" in res.stderr, res.stderr


def test_a_fifo_or_device_as_a_suite_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        res = cli("suites", "validate", str(path))
        assert res.returncode == 2 and "not a regular file" in res.stderr, res.stderr
        assert_one_line_error(cli("eval", "--suite", str(path)), "not a regular file")


def test_a_titles_control_bytes_reach_the_terminal_escaped(tmp_path: Path) -> None:
    _user_suite(tmp_path, title="\x1b]0;pwned\x07\x1b[2J")
    res = cli("suites", "--include-path", str(tmp_path))
    assert res.returncode == 0 and "\x1b" not in res.stdout and "\\x1b]0;pwned" in res.stdout
