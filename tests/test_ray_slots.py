"""Ray worker places (reference_trainer/rollout/slots.py): interleaved runs share W places, a cluster too
small is one line, and no wait on Ray is without a deadline."""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT, assert_one_line_error, cli

from reference_trainer.errors import UserError
from reference_trainer.rollout.slots import RayDeadlines, WorkerPoolError, WorkerSlots, start_local_ray
from reference_trainer.rollout.workers import RayWorkerPool
from reference_trainer.trace.writer import Trace


def _waits_on_ray(tree: ast.AST) -> list[ast.Call]:
    """Calls of `ray.get` / `ray.wait` (or `self._ray.get`, any `<x>.ray.get`)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        if node.func.attr in ("get", "wait") and name in ("ray", "_ray"):
            found.append(node)
    return found


def test_every_wait_on_ray_in_the_project_has_a_deadline() -> None:
    calls = {}
    for folder in ("rlbench", "reference_trainer", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for call in _waits_on_ray(ast.parse(path.read_text())):
                calls[f"{path.relative_to(ROOT)}:{call.lineno}"] = {k.arg for k in call.keywords}
    assert len(calls) >= 2  # the pool's get and wait are seen (the check is not vacuous)
    assert [where for where, keywords in calls.items() if "timeout" not in keywords] == []


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value


class _FakeRay:
    """Ray's calls as the pool makes them, answered at once; every get and wait records its timeout, and
    `silent` makes the actors never answer (as a hung worker)."""

    def __init__(self, silent: bool = False) -> None:
        self.timeouts: list[Any] = []
        self.silent = silent

    def remote(self, cls: type) -> Any:
        ray = self

        class Actor:
            def __init__(self, *args: Any) -> None:
                self.worker = args[2]

            def __getattr__(self, name: str) -> Any:
                return SimpleNamespace(remote=lambda *a: _Ref(self.worker if name == "ready" else None))

        return SimpleNamespace(options=lambda **o: SimpleNamespace(remote=lambda *a: Actor(*a)), ray=ray)

    def put(self, value: Any) -> _Ref:
        return _Ref(value)

    def get(self, refs: Any, timeout: Any = None) -> Any:
        from ray.exceptions import GetTimeoutError

        self.timeouts.append(timeout)
        if self.silent:
            raise GetTimeoutError("timed out")
        return [r.value for r in refs] if isinstance(refs, list) else refs.value

    def wait(self, refs: list, num_returns: int = 1, timeout: Any = None) -> tuple[list, list]:
        self.timeouts.append(timeout)
        return ([], refs) if self.silent else (refs[:num_returns], refs[num_returns:])

    def kill(self, actor: Any) -> None:
        pass


def _pool(monkeypatch, fake: _FakeRay, deadlines: RayDeadlines) -> RayWorkerPool:
    import sys

    from reference_trainer.engine.config import EngineConfig

    monkeypatch.setitem(sys.modules, "ray", fake)
    slots = SimpleNamespace(workers=2, gpu=False, unit="CPU", deadlines=deadlines, actor_options=lambda w: {})
    spec = SimpleNamespace(
        engine_config=EngineConfig(max_num_seqs=2), speculation=None, drafts=False, keeps_history=False
    )
    monkeypatch.setattr("reference_trainer.rollout.workers._inference_state", lambda state, device: {})
    return RayWorkerPool(spec, {}, 2, Trace(), slots=slots)  # type: ignore[arg-type]


def test_the_pool_waits_on_its_actors_with_the_deadlines(monkeypatch) -> None:
    pytest.importorskip("ray")
    fake = _FakeRay()
    pool = _pool(monkeypatch, fake, RayDeadlines(place_s=1.0, start_s=2.0, call_s=3.0))
    pool.submit(0, [])
    pool.advance(0, 0)
    pool.next_report()
    pool.take_unstarted(0, [])
    pool.add_history(1, [])
    pool.update_weights({})
    # start-up, then submit, wait + get, take, history, and weights: one wait per worker (a dead one is told
    # apart from the others, which carry on: rollout/multi.py)
    assert fake.timeouts == [2.0] + [3.0] * 5 + [3.0] * pool.size


def test_a_worker_that_never_answers_is_one_line(monkeypatch) -> None:
    pytest.importorskip("ray")
    pool = _pool(monkeypatch, _FakeRay(), RayDeadlines(call_s=7.0))
    pool._ray.silent = True
    pool.advance(1, 0)
    with pytest.raises(WorkerPoolError, match=r"^the 2 Ray rollout workers did not report .* within 7 s"):
        pool.next_report()
    with pytest.raises(WorkerPoolError, match=r"did not load weights within 7 s: .*RLBENCH_RAY_TIMEOUT_S"):
        pool.update_weights({})
    with pytest.raises(WorkerPoolError, match=r"did not start within 9 s"):
        _pool(monkeypatch, _FakeRay(silent=True), RayDeadlines(start_s=9.0))


@pytest.mark.parametrize("value", ["0", "-1", "inf", "soon"])
def test_a_bad_ray_deadline_is_one_line(monkeypatch, value) -> None:
    monkeypatch.setenv("RLBENCH_RAY_TIMEOUT_S", value)
    with pytest.raises(UserError, match="RLBENCH_RAY_TIMEOUT_S must be a number of seconds"):
        RayDeadlines.from_env()
    monkeypatch.setenv("RLBENCH_RAY_TIMEOUT_S", "45")
    assert RayDeadlines.from_env() == RayDeadlines(45.0, 45.0, 45.0)


@pytest.fixture
def two_cpu_ray():
    """A local Ray of 2 CPUs, as `rlbench` starts one on a 2-core machine; one per test and shut down after
    it, so that no other test (on the same xdist worker) finds it running or shuts it down under this one."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    start_local_ray(2, temp)
    assert ray.cluster_resources()["CPU"] == 2
    yield ray
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


TINY = ("--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "6", "--eval-every",
        "0", "--device", "cpu", "--threads", "1")  # fmt: skip


@pytest.mark.e2e
def test_compare_of_three_modes_on_two_workers_runs_on_two_cpus(
    two_cpu_ray, tiny_model_dir, tmp_path
) -> None:
    modes = ("baseline", "histopipe", "rhyme")
    out = tmp_path / "cmp"
    res = cli("compare", "--modes", ",".join(modes), "--workers", "2", "--model", str(tiny_model_dir), *TINY,
              "--out", str(out), tmp=tmp_path, env={"RLBENCH_RAY_TIMEOUT_S": "1800"})  # fmt: skip
    # The deadline is raised: this test asks that the run finishes, and at load 8 on two cores the actors
    # took over 300 s to start (the deadline's own one line is tested below, with a pool that cannot fit).
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "compare.json").read_text())
    assert [r["mode"] for r in doc["runs"]] == list(modes) and doc["workload"]["workers"] == 2
    for mode in modes:  # each mode's rollout ran on both of its workers
        events = [json.loads(line) for line in (out / mode / "trace.jsonl").read_text().splitlines()]
        assert {e["worker"] for e in events if e.get("kind") == "decode"} == {0, 1}


@pytest.mark.e2e
def test_a_pool_asking_for_more_cpus_than_ray_has_is_one_line(two_cpu_ray, tiny_model_dir, tmp_path) -> None:
    res = cli("train", "--mode", "histopipe", "--workers", "3", "--model", str(tiny_model_dir), *TINY,
              "--out", str(tmp_path / "run"), tmp=tmp_path)  # fmt: skip
    assert_one_line_error(
        res, "--workers 3 asks Ray for 3 CPUs (one per rollout worker); the Ray cluster has 2"
    )
    assert "use --workers 2" in res.stderr


@pytest.mark.e2e
def test_places_others_hold_are_waited_for_until_the_deadline(two_cpu_ray) -> None:
    held = WorkerSlots(2)  # every CPU of the cluster
    try:
        with pytest.raises(WorkerPoolError) as err:
            WorkerSlots(2, deadlines=RayDeadlines(place_s=0.5))
    finally:
        held.close()
    assert str(err.value).startswith("--workers 2 asks Ray for 2 CPUs (one per rollout worker); the Ray "
                                     "cluster has 2 CPUs, 0 of them free after 0.5 s")  # fmt: skip
    WorkerSlots(2, runs=3).close()  # free again: placed at once


def test_a_local_ray_started_by_a_process_that_ended_goes_with_its_folder(tmp_path, monkeypatch):
    """`end_local_ray` kills the processes that carry the folder in their environment (Ray's, started by
    the rollout process in it) or hold a file open in it (Ray's agents, whose environment their title
    overwrites) and removes it; a process with another folder is left alone. Engines get a
    folder of their own only where a process of theirs starts a local Ray: W > 1 Ray actors, no address."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    from reference_trainer.rollout.slots import RAY_DIR, end_local_ray, own_ray_dir

    monkeypatch.setenv(RAY_DIR, str(tmp_path))
    ray_dir = own_ray_dir(2, "ray", None)
    assert Path(ray_dir).parent == tmp_path
    (Path(ray_dir) / "session_latest").mkdir()
    mine = subprocess.Popen(["sleep", "60"], env={**os.environ, RAY_DIR: ray_dir})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, RAY_DIR: ray_dir + "-other"})
    with open(Path(ray_dir) / "session_latest" / "agent.log", "w") as log:  # an agent: only its log says
        agent = subprocess.Popen(
            ["sleep", "60"], stdout=log, env={k: v for k, v in os.environ.items() if k != RAY_DIR}
        )
    try:
        end_local_ray(ray_dir)
        assert mine.wait(timeout=30) == -signal.SIGKILL and agent.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None and not Path(ray_dir).exists()
    finally:
        for proc in (other, mine, agent):
            proc.kill()
            proc.wait()
    for workers, backend, address in ((1, "ray", None), (2, "local", None), (2, "ray", "ray://x:1")):
        assert own_ray_dir(workers, backend, address) is None
    end_local_ray(None)  # nothing to remove
