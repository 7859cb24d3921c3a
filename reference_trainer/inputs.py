"""What a user hands rlbench, read safely: the one guard of each concept, used by every reader.

- `open_input`: every input file is opened here. It must be a regular file: a FIFO would block the read
  forever, a device (/dev/zero) never ends, a directory is not data; each is one line naming the path. It
  is opened non-blocking and checked on the open descriptor, so a file swapped after a check is caught too.
- `read_input`: a whole file's bytes, at most `limit` of them (a file past it is refused before it is read).
  `BoundedReader` bounds a file read line by line the same way, counting what was read.
- `load_yaml`: YAML through the safe loader with aliases bounded: a "billion laughs" file of a few hundred
  bytes expands to 10^9 nodes through nested aliases; its expanded size is counted on the parsed node graph
  (each alias once, memoised) and refused past MAX_YAML_NODES before anything is built from it.
- `inside`: a path read from a file (a suite's data file, a group's member) stays inside its declared root:
  relative, no `..`, no NUL, each name within NAME_MAX. `plain_name` is a name that becomes one folder.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import yaml

from reference_trainer.errors import UserError

MAX_INPUT_BYTES = 1 << 30  # one file rlbench reads (a log, a trace, a data file): 1 GiB
MAX_YAML_BYTES = 1 << 20  # a suite or group file: hand-written, a few hundred bytes
MAX_YAML_NODES = 100_000  # nodes of a YAML document once its aliases are expanded
NAME_MAX = 255  # bytes in one file name (Linux, macOS)
PATH_MAX = 4096


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _refusal(path: str | Path, err: OSError) -> UserError:
    if err.errno == errno.ENOENT:
        return UserError(f"{path}: no such file")
    if err.errno == errno.ENAMETOOLONG:
        return UserError(f"{str(path)[:200]}...: file name too long")
    return UserError(f"{path}: cannot read ({err.strerror or err})")


def open_input(path: str | Path) -> BinaryIO:
    """`path` opened for binary reading, refusing anything but a regular file with one line."""
    try:
        found = os.stat(path)  # before the open: opening some devices has effects of its own
        _check_regular(path, found.st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise _refusal(path, err) from None
    try:
        _check_regular(path, os.fstat(fd).st_mode)  # the file opened is the file checked
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _check_regular(path: str | Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a FIFO, device or socket); rlbench reads only files")


def check_size(path: str | Path, size: int, limit: int) -> None:
    if size > limit:
        raise UserError(f"{path}: {_mib(size)}, more than the {_mib(limit)} rlbench reads from such a file")


def read_input(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of regular file `path`, refused past `limit` (a file that grows while read, too)."""
    with open_input(path) as fh:
        check_size(path, os.fstat(fh.fileno()).st_size, limit)
        data = fh.read(limit + 1)
    check_size(path, len(data), limit)
    return data


class BoundedReader:
    """The lines of an opened input, refusing the file once more than `limit` bytes were read (it grew
    past its checked size); `read` counts the bytes so far. With `line_limit`, a longer line is refused
    once that many bytes of it are read, before it is parsed: a format whose line is one small record
    then holds at most that much of one line in memory, not a whole file's worth."""

    def __init__(
        self, fh: BinaryIO, path: str | Path, limit: int = MAX_INPUT_BYTES, line_limit: int | None = None
    ) -> None:
        check_size(path, os.fstat(fh.fileno()).st_size, limit)
        self.fh, self.path, self.limit, self.read = fh, path, limit, 0
        self.line_limit = line_limit

    def __iter__(self) -> Iterator[bytes]:
        most = -1 if self.line_limit is None else self.line_limit + 1
        for number, line in enumerate(iter(lambda: self.fh.readline(most), b""), 1):
            self.read += len(line)
            check_size(self.path, self.read, self.limit)
            if self.line_limit is not None and len(line) > self.line_limit:
                raise UserError(f"{self.path}:{number}: a line longer than {self.line_limit:,} bytes")
            yield line


# --- YAML --------------------------------------------------------------------------------------------------


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader (no Python objects) that counts a document's expanded size before building it."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return self.construct_document(node)


def expanded_size(root: yaml.Node, limit: int = MAX_YAML_NODES) -> int:
    """Nodes of `root` with every alias expanded, counted without expanding (each node's size memoised);
    a UserError past `limit` or for an alias inside its own anchor (a cycle). Iterative: no recursion."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > limit:
                raise UserError(f"more than {limit:,} YAML nodes once its aliases are expanded")
            continue
        if key in size:
            continue
        if key in on_path:
            raise UserError("a YAML alias refers to a node that holds it (a cycle)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(data: bytes | str, source: str | Path) -> Any:
    """YAML text (safe: no Python objects) with its aliases' expansion bounded; one line naming `source`."""
    try:
        return yaml.load(data, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except UserError as err:
        raise UserError(f"{source}: {err}") from None
    except RecursionError:
        raise UserError(f"{source}: YAML nested too deeply to read") from None
    except yaml.YAMLError as err:  # the parser's first line names the place
        raise UserError(f"{source}: not valid YAML: {str(err).splitlines()[0]}") from None


# --- paths -------------------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def plain_name(value: str, what: str) -> str:
    """`value` if it can name one folder as it is: letters, digits, `._+-`, not starting with a dot, at
    most 128 characters (no `/`, `..`, absolute path or control byte can reach a path through it)."""
    if not _PLAIN.fullmatch(value) or len(value) > 128:
        shown = repr(value) if len(value) <= 80 else repr(value[:80]) + "..."
        raise UserError(
            f"{what} {shown} is not a plain name (letters, digits, . _ + -, not starting with a dot, at "
            "most 128 characters)"
        )
    return value


def inside(root: str | Path, relative: str, what: str) -> Path:
    """`root / relative` for a path read from a file, refused unless it stays inside `root`: relative,
    without `..`, NUL or an empty name, each name at most NAME_MAX bytes and the whole within PATH_MAX.
    (Links inside `root` are the user's own and are followed, as for any path they give.)"""
    shown = repr(relative) if len(relative) <= 80 else repr(relative[:80]) + "..."
    if not relative or "\0" in relative:
        raise UserError(f"{what} {shown} is not a path")
    encoded = relative.encode("utf-8", errors="surrogateescape")
    if len(encoded) > PATH_MAX or any(len(part.encode()) > NAME_MAX for part in relative.split("/")):
        raise UserError(f"{what} {shown} is longer than a file name may be ({NAME_MAX} bytes a name)")
    parts = PurePosixPath(relative).parts
    if relative.startswith(("/", "\\")) or PurePosixPath(relative).is_absolute() or ".." in parts:
        raise UserError(f"{what} {shown} leads outside {root}: give a path inside it (no leading /, no ..)")
    return Path(root) / relative
