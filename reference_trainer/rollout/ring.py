"""The weights a rollout run ahead of the update reads (rollout/ahead.py): a ring of complete copies, each
stamped with the policy version it holds, in files mapped by both sides.

The trainer publishes version v into slot v mod n (n = max_staleness + 1): it marks the slot as being
written, copies every tensor in, then stamps it with v, under one lock. The rollout side reads version v
only from a slot stamped v, and checks the stamp again after copying: a slot rewritten while it was read (a
torn read) is an error, never weights applied. With n = k + 1 slots it cannot happen: version v overwrites
v - k - 1, which only step v - 1's rollout used, and the trainer publishes v only after that rollout came
back.

The slots are files under /dev/shm (a temporary folder where /dev/shm lacks the room), so a process started
with `spawn` maps the same memory by name, at any model size, without torch's shared-memory handles. Their
room is reserved when they are made (a full /dev/shm is one line then, not a SIGBUS at the first write),
after checking that the k + 1 copies fit at all (checked first with the run's settings, from the model's
file headers, before the run's folder is made: `TrainConfig.check`). The folder is named by the trainer's
pid: the trainer removes it on every exit it sees, and a ring whose trainer was killed outright is removed
when the next one starts.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import UserError
from reference_trainer.model.loader import resolve_device, resolve_dtype, tensor_shapes
from reference_trainer.rollout.gate import RolloutDied

EMPTY, WRITING = -1, -2  # stamps of a slot that holds no version yet, and of one being written
ALIGN = 64  # each tensor starts at a multiple of this many bytes of its slot


class TornRead(RuntimeError):
    """A slot was rewritten while the rollout side copied it."""


class RingCut(RolloutDied):
    """A ring file was truncated while the run used it (by something outside rlbench): the run stops as
    when its rollout process dies, resumable from its last checkpoint."""


SHM = "/dev/shm"
PREFIX = "rlbench-ring-"


def _free(folder: str) -> int:
    try:
        return shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
    except OSError:
        return 0


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _room(nbytes: int) -> str | None:
    """Where `nbytes` of slots fit: /dev/shm with room to spare, else the temporary folder; None when
    neither has the room."""
    if _free(SHM) > 2 * nbytes:
        return SHM
    return tempfile.gettempdir() if _free(tempfile.gettempdir()) > nbytes else None


def check_room(copy_bytes: int, slots: int) -> None:
    """One line when `slots` copies of `copy_bytes` each fit neither /dev/shm nor the temporary folder.
    Called with a run's settings (`TrainConfig.check`), before its folder is made, and again when the
    ring is made (the room may have gone meanwhile)."""
    if _room(copy_bytes * slots) is None:
        tmp = tempfile.gettempdir()
        raise UserError(
            f"a rollout run ahead keeps max_staleness + 1 = {slots} copies of the weights "
            f"({_gib(copy_bytes * slots)}), more than {SHM} ({_gib(_free(SHM))} free) or {tmp} "
            f"({_gib(_free(tmp))} free) holds: lower max_staleness, or free some room"
        )


def _folder(nbytes: int, slots: int) -> str:
    """A new folder for `slots` slots of `nbytes` each, where they fit (checked before anything is
    written)."""
    remove_orphans()
    check_room(nbytes, slots)
    prefix = f"{PREFIX}{os.getpid()}-"
    return tempfile.mkdtemp(prefix=prefix, dir=_room(nbytes * slots))


Layout = list[tuple[str, tuple[int, ...], torch.dtype, int, int]]  # name, shape, dtype, at, n


def layout_of(tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]]) -> tuple[Layout, int]:
    """Where each tensor (name, shape, dtype) lies in a slot, and the slot's bytes: each tensor starts at
    a multiple of ALIGN."""
    layout: Layout = []
    at = 0
    for name, shape, dtype in tensors:
        size = math.prod(shape) * dtype.itemsize
        layout.append((name, tuple(shape), dtype, at, size))
        at += -(-size // ALIGN) * ALIGN
    return layout, max(at, ALIGN)


def model_copy_bytes(model_dir: str | Path, device: str) -> int:
    """The bytes of one slot for the model in `model_dir` on `device`, from its files' headers (no weights
    read): what `max_staleness` is checked against before a run starts."""
    dtype = resolve_dtype("auto", resolve_device(device))
    shapes = tensor_shapes(model_dir)
    return layout_of((name, shape, dtype) for name, (shape, _) in shapes.items())[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process: its folder is not ours to judge
    return True


def remove_orphans() -> list[Path]:
    """Remove the rings left by trainers that are gone (killed with SIGKILL, which nothing can catch): each
    ring's folder is named by its trainer's pid. Returns what it removed."""
    removed = []
    for base in (SHM, tempfile.gettempdir()):
        for folder in Path(base).glob(f"{PREFIX}*-*") if os.path.isdir(base) else []:
            pid = folder.name.removeprefix(PREFIX).split("-")[0]
            if pid.isdigit() and not _alive(int(pid)) and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _reserve(path: str, nbytes: int) -> None:
    """Make `path` with `nbytes` of room reserved, so writing to its mapping cannot find the disk full."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


class WeightRing:
    """`slots` copies of a state dict shaped like `template` (its dtypes kept), and their version stamps.
    `lock` (a multiprocessing or threading Condition) guards the stamps and is notified on every publish."""

    def __init__(self, template: Mapping[str, torch.Tensor], slots: int, lock: Any) -> None:
        self.layout, self.nbytes = layout_of((name, tuple(t.shape), t.dtype) for name, t in template.items())
        self.n, self.lock = max(1, slots), lock
        self.folder = _folder(self.nbytes, self.n)
        try:
            _reserve(os.path.join(self.folder, "stamps"), self.n * 8)
            for i in range(self.n):
                _reserve(os.path.join(self.folder, f"slot{i}"), self.nbytes)
        except OSError as err:
            self.close()
            size, where = _gib(self.n * self.nbytes), os.path.dirname(self.folder)
            raise UserError(
                f"cannot reserve the weight ring's {self.n} copies of the weights ({size}) in {where}: "
                f"{err.strerror or err}; lower max_staleness, or free some room"
            ) from None
        self._map()
        self.stamps.fill_(EMPTY)

    def _map(self) -> None:
        self.stamps = torch.from_file(os.path.join(self.folder, "stamps"), True, self.n, dtype=torch.int64)
        self.slots = [self._slot(i) for i in range(self.n)]

    def _slot(self, i: int) -> dict[str, torch.Tensor]:
        flat = torch.from_file(os.path.join(self.folder, f"slot{i}"), True, self.nbytes, dtype=torch.uint8)
        return {
            name: flat[at : at + size].view(dtype).view(shape) for name, shape, dtype, at, size in self.layout
        }

    def __getstate__(self) -> dict[str, Any]:  # the files are mapped again by name on the other side
        return {k: v for k, v in self.__dict__.items() if k not in ("stamps", "slots")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map()

    def _intact(self, name: str) -> None:
        """Raise RingCut when ring file `name` is shorter than its mapping: touching the mapping past the
        file's end would be a SIGBUS, which ends a process without a word. Checked before each touch (the
        stamps' under their lock); a cut landing between the check and the touch is still a SIGBUS, which
        the trainer names when it is the rollout process's."""
        path = os.path.join(self.folder, name)
        want = self.n * 8 if name == "stamps" else self.nbytes
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return  # unlinked: the mapping keeps its pages
        if size < want:
            raise RingCut(
                f"the weight ring's {path} was cut to {size} bytes (of {want}) while the run used it, by "
                "something outside rlbench; the run keeps every finished step: `rlbench train --resume "
                "RUN_DIR` continues from its last checkpoint"
            )

    def _stamps(self) -> torch.Tensor:
        """The stamps, checked intact (call with the lock held)."""
        self._intact("stamps")
        return self.stamps

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy `state_dict` (cast to the ring's dtypes) into version's slot and stamp it."""
        i = version % self.n
        with self.lock:
            self._stamps()[i] = WRITING
        self._intact(f"slot{i}")
        for name, tensor in self.slots[i].items():
            tensor.copy_(state_dict[name].detach())
        with self.lock:
            self._stamps()[i] = version
            self.lock.notify_all()

    def holds(self, version: int) -> bool:
        """Whether `version` is published (call with the lock held)."""
        return int(self._stamps()[version % self.n]) == version

    def versions(self) -> list[int]:
        with self.lock:
            return sorted(int(v) for v in self._stamps().tolist() if v >= 0)

    def read_into(self, version: int, apply: Callable[[dict[str, torch.Tensor]], Any]) -> Any:
        """`apply(slot)`: the slot holding `version` (its tensors, to copy from, not to keep); a TornRead if
        the slot was rewritten meanwhile, a RuntimeError if it does not hold `version`."""
        i = version % self.n
        with self.lock:
            if int(self._stamps()[i]) != version:
                raise RuntimeError(
                    f"weights of version {version} are not published (slot holds {self.stamps[i]})"
                )
        self._intact(f"slot{i}")
        out = apply(self.slots[i])
        with self.lock:
            if int(self._stamps()[i]) != version:
                raise TornRead(f"the slot of version {version} was rewritten while it was read")
        return out

    def read(self, version: int) -> dict[str, torch.Tensor]:
        """A copy of `version`'s weights."""
        return self.read_into(version, lambda slot: {k: v.clone() for k, v in slot.items()})

    def close(self) -> None:
        """Remove the files (the trainer's side, which made them)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def check_history(
    history: Mapping[int, Mapping[str, torch.Tensor]],
    layout: list[tuple[str, tuple[int, ...], torch.dtype, int, int]],
    version: int,
    step: int,
    k: int,
    where: str,
) -> list[int]:
    """The versions older than `version` that steps step..step+k-1 roll out on, each checked to be in
    `history` with the ring's names and shapes; one line naming `where` for what cannot be resumed."""
    at = f"{where}: " if where else ""
    if version != step:  # one update per step: a checkpoint of step s holds version s
        raise UserError(f"{at}policy_version {version} does not match step {step}; the checkpoint was edited")
    need = sorted({max(0, j - k) for j in range(step, step + k)} - {version})
    if missing := [v for v in need if v not in history]:
        kept = sorted(history)
        raise UserError(
            f"{at}a resume at step {step} with max_staleness {k} rolls out on versions {need}, and the "
            f"checkpoint keeps {kept or 'none'} (missing {missing}): resume with the max_staleness the run "
            "was started with, or start it again with --overwrite"
        )
    shapes = {name: (shape, dtype) for name, shape, dtype, _, _ in layout}
    for v in need:
        got = {name: (tuple(t.shape), t.dtype) for name, t in history[v].items()}
        if {n: s for n, (s, _) in got.items()} != {n: s for n, (s, _) in shapes.items()}:
            raise UserError(f"{at}version {v}'s weights are not this model's (another run's history?)")
        if bad := [n for n, (_, d) in got.items() if not d.is_floating_point]:
            raise UserError(f"{at}version {v}'s {bad[0]} is not a floating-point tensor")
    return need
