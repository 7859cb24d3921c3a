"""Ray for the rollout workers: a local instance started quietly, or a cluster joined; the places a pool's
actors run in (`WorkerSlots`, one placement group that several runs' pools can share); and the deadline of
every wait on Ray (`RayDeadlines`), which ends in one line (`WorkerPoolError`), never in a silent wait.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError


def start_local_ray(num_cpus: int, temp_dir: str) -> None:
    """A local Ray instance for this process's actors, quiet and private:
    - token authentication stays on, with a fresh token held only in this process's environment (inherited
      by Ray's own processes): Ray's default writes one to ~/.ray/auth_token, outside the run, and warns;
    - logging level WARNING: without it Ray prints "INFO ... Started a local Ray instance." into the output.
    A RAY_AUTH_MODE the user set is kept as it is."""
    import ray

    try:  # Rays with token authentication (Ray 2.60 has it); older ones neither write a token nor warn
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        pass
    else:
        if "RAY_AUTH_MODE" not in os.environ:
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        # Ray reads the mode into its config once, at import: refreshed (as Ray's own default does) so that
        # this start follows the environment as it is now, also after an earlier start in this process.
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir,
             logging_level=logging.WARNING)  # fmt: skip


class WorkerPoolError(UserError):
    """Ray could not place, start or hear from the rollout workers in time: one line that says what was
    asked, what the cluster has and what to change (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class RayDeadlines:
    """How long the driver waits on Ray before it says so in one line, never forever. Generous for a loaded
    2-core machine, where building an actor (torch imported, weights loaded) takes 10-30 s, yet finite.
    RLBENCH_RAY_TIMEOUT_S (seconds) sets all three, for a slower cluster or an impatient test."""

    place_s: float = 60.0  # the cluster has the CPUs (GPUs) but others hold them: wait for them this long
    start_s: float = 300.0  # the actors built, weights loaded
    call_s: float = 600.0  # one call: a slice of engine steps, a weight update (many seconds on a CPU)

    @classmethod
    def from_env(cls) -> RayDeadlines:
        value = os.environ.get("RLBENCH_RAY_TIMEOUT_S")
        if not value:
            return cls()
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            raise UserError(f"RLBENCH_RAY_TIMEOUT_S must be a number of seconds > 0, got {value!r}")
        return cls(seconds, seconds, seconds)


def ensure_ray(workers: int, address: str | None) -> None:
    """Ray started in this process: joined at `address`, or a local instance with a CPU for each of
    `workers` and at least one for each core (kept if a caller started one already)."""
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        temp = os.environ.get("RLBENCH_RAY_TMPDIR") or tempfile.mkdtemp(prefix="rlbench-ray-")
        start_local_ray(max(workers, os.cpu_count() or 1), temp)


RAY_DIR = "RLBENCH_RAY_TMPDIR"  # the local Ray's folder; Ray's processes inherit it, so it also names them


def own_ray_dir(workers: int, backend: str, address: str | None) -> str | None:
    """A fresh folder for the local Ray another process of this run starts for its engines (a rollout run
    ahead's: W > 1 Ray actors, no cluster `address`), in RLBENCH_RAY_TMPDIR when set, else the temp folder;
    None where it starts none. That process sets it as its RLBENCH_RAY_TMPDIR, so Ray's processes carry it
    in their environment and `end_local_ray` finds them by it."""
    if workers <= 1 or backend != "ray" or address:
        return None
    return tempfile.mkdtemp(prefix="rlbench-ray-", dir=os.environ.get(RAY_DIR) or None)


def end_local_ray(ray_dir: str | None) -> None:
    """Remove the local Ray started in `ray_dir` (`own_ray_dir`) by a process that has ended, however it
    ended: its processes are killed and the folder removed. A driver killed by SIGKILL takes its gcs_server
    and raylet with it, but leaves Ray's agents running for minutes and its session folder for good."""
    if not ray_dir:
        return
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) != os.getpid() and _of_ray(proc, ray_dir):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or another user's
            continue
    shutil.rmtree(ray_dir, ignore_errors=True)


def _of_ray(proc: Path, ray_dir: str) -> bool:
    """Whether process `proc` is of the Ray in `ray_dir`: the folder is in its environment (inherited from
    the process that started that Ray), or one of its open files is in it (Ray's processes log there; its
    agents retitle themselves over their environment, so only their files say whose they are)."""
    if f"{RAY_DIR}={ray_dir}".encode() in (proc / "environ").read_bytes().split(b"\0"):
        return True
    inside = ray_dir.rstrip("/") + "/"
    return any(os.readlink(fd).startswith(inside) for fd in (proc / "fd").iterdir())


def _plural(count: float, unit: str) -> str:
    return f"{count:g} {unit}{'' if count == 1 else 's'}"


class WorkerSlots:
    """W places for rollout workers on a Ray cluster, one CPU (or one GPU with `gpu`) each, reserved as one
    placement group from `__init__` to `close()`. Worker w of every pool given these slots runs in place w,
    holding 1/`runs` of it: `runs` pools share the places. The runs of `compare` take their steps in turn,
    so one run at a time works in a place and the place is never split while it works; every run's worker w
    also lands on the same node and device, so the modes are measured on the same hardware. A pool without
    slots opens its own (runs=1). The cluster is asked for W places once: too few there is one line at
    once, too few free for `deadlines.place_s` one line then."""

    def __init__(
        self,
        workers: int,
        gpu: bool = False,
        runs: int = 1,
        address: str | None = None,
        deadlines: RayDeadlines | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        ensure_ray(workers, address)
        self.workers, self.gpu, self.runs, self.group = workers, gpu, runs, None
        self.deadlines = deadlines or RayDeadlines.from_env()
        self.unit = "GPU" if gpu else "CPU"
        # Ray takes fractions to 4 decimals: 1/3 is 0.3333, so `runs` shares fit in one place.
        self.share = math.floor(10_000 / runs) / 10_000
        total = ray.cluster_resources().get(self.unit, 0)
        if total < workers:
            raise WorkerPoolError(f"{self._asked()}; the Ray cluster has {_plural(total, self.unit)}: "
                                  f"{self._fix(total)}")  # fmt: skip
        self.group = placement_group([{self.unit: 1}] * workers)
        if not self.group.wait(timeout_seconds=self.deadlines.place_s):
            free = ray.available_resources().get(self.unit, 0)
            remove_placement_group(self.group)
            raise WorkerPoolError(
                f"{self._asked()}; the Ray cluster has {_plural(total, self.unit)}, {free:g} of them free "
                f"after {self.deadlines.place_s:g} s (other jobs hold the rest): {self._fix(free)}, or wait "
                "longer (RLBENCH_RAY_TIMEOUT_S, seconds)"
            )

    def _asked(self) -> str:
        asked = _plural(self.workers, self.unit)
        shared = f", shared by {self.runs} runs taking turns" if self.runs > 1 else ""
        return f"--workers {self.workers} asks Ray for {asked} (one per rollout worker{shared})"

    def _fix(self, have: float) -> str:
        fewer = f"use --workers {int(have)}" if have >= 2 else "drop --workers"
        return f"{fewer}, or run on a Ray cluster with more {self.unit}s (--ray-address)"

    def actor_options(self, worker: int) -> dict[str, Any]:
        """Ray's options for the actor of worker `worker`: its share of place `worker`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        at = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=worker)
        if self.gpu:
            return {"num_cpus": 0, "num_gpus": self.share, "scheduling_strategy": at}
        return {"num_cpus": self.share, "scheduling_strategy": at}

    def close(self) -> None:
        """Give the places back (the actors still in them end with them)."""
        from ray.util.placement_group import remove_placement_group

        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
