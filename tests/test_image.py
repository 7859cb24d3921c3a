"""The Docker image and the GPU workflow, checked without Docker: every COPY source exists and reaches the
build context (.dockerignore keeps it), links inside a copied folder still resolve in the image, and the
paths and suite names the workflows read exist. hadolint and actionlint run where they are installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT

from rlbench.eval.suites import suite_files

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY of the Dockerfile (multi-stage `--from` copies excepted)."""
    found = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            args = [w for w in words[1:] if not w.startswith("--")]
            found.append((args[:-1], args[-1]))
    return found


def _ignored(relative: str) -> bool:
    """Whether .dockerignore leaves `relative` (or a folder above it) out of the build context."""
    verdict = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        parts = relative.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            verdict = not keep
    return verdict


def _tracked(source: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--", source], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.splitlines()


def test_every_copy_source_exists_and_reaches_the_build_context() -> None:
    copies = _copies()
    assert copies, "the Dockerfile copies nothing"
    for sources, _ in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile: COPY {source}: no such file or folder"
            assert not _ignored(source), f"Dockerfile: COPY {source}: left out by .dockerignore"
            dropped = [f for f in _tracked(source) if _ignored(f)]
            assert not dropped, f"Dockerfile: COPY {source}: .dockerignore leaves out {dropped[:3]}"


def test_links_in_copied_folders_resolve_in_the_image() -> None:
    """Each folder is copied to the same relative place, so a link such as rlbench/suites -> ../suites
    resolves in the image exactly where its target was copied."""
    copied = {}
    for sources, destination in _copies():
        for source in sources:
            target = (
                destination if len(sources) == 1 and not destination.endswith("/") else destination + source
            )
            copied[source.rstrip("/")] = target.removeprefix("./").rstrip("/")
    links = [p for src in copied for p in (ROOT / src).rglob("*") if p.is_symlink()] if copied else []
    assert (ROOT / "rlbench" / "suites") in links
    for link in links:
        target = link.resolve().relative_to(ROOT).as_posix()
        top = target.split("/")[0]
        assert copied.get(top) == top, f"{link.relative_to(ROOT)} -> {target}: {top} is not copied beside it"


def test_the_workflows_read_paths_and_suites_that_exist() -> None:
    suites = suite_files()
    for workflow in WORKFLOWS:
        doc = yaml.safe_load(workflow.read_text())
        text = workflow.read_text()
        for path in re.findall(r"(?<![\w/$.-])((?:tests|reports|scripts|benchmarks)/[\w./-]*)", text):
            assert (ROOT / path.rstrip("/")).exists() or "*" in path, (
                f"{workflow.name}: {path} does not exist"
            )
        for job in doc["jobs"].values():
            for name in re.findall(r"'([\w,-]+)'", str(job.get("env", {}).get("SUITES", ""))):
                for suite in name.split(","):
                    assert suite in suites, f"{workflow.name}: suite {suite} is not in suites/"
    inputs = yaml.safe_load((ROOT / ".github/workflows/gpu-repro.yml").read_text())[True]["workflow_dispatch"]
    for suite in inputs["inputs"]["suites"]["default"].split(","):
        assert suite in suites, f"gpu-repro.yml: default suite {suite} is not in suites/"


@pytest.mark.parametrize("tool", ["hadolint", "actionlint"])
def test_the_linters_pass_where_installed(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    args = ["Dockerfile"] if tool == "hadolint" else [str(w) for w in WORKFLOWS]
    out = subprocess.run([tool, *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
