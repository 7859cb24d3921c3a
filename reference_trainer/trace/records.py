"""Every JSON/JSONL record rlbench writes or reads goes through here, so a killed run never leaves a file
that a later command chokes on.

Writers: `write_text`/`write_bytes`/`write_json`/`write_jsonl`/`write_safetensors` replace a file atomically
(temp file beside it, fsync, rename, fsync the directory); `atomic_path` gives the temp path to a library
that writes files itself. `append_jsonl`/`extend_jsonl` add rows durably. `replace_dir`
publishes a directory built aside (checkpoints, imported models); locks.py builds one under a lock.

Reader: `read_jsonl` returns the rows as dicts (`iter_jsonl` one at a time), from a regular file of
bounded size (reference_trainer/inputs.py: no FIFO, device or unbounded read). A kill mid-append leaves at
most an unterminated last line; that one is dropped with a one-line note on stderr. Anything else
malformed is a `UserError` naming the file and line, which the CLI prints as one line. `read_json` does
the same for whole files.

Faults: a writer never replaces what is not a regular file (a device such as /dev/null, a FIFO, a socket:
an `--out` pointing at one is refused), and a full, read-only or forbidden disk is a one-line UserError
naming the path. A file written in place (appended, trimmed) is opened with `open_own`, which refuses a
symlink rather than follow it out of the run. `make_dir` creates an output directory the same way
(locks.py makes one process the only writer of a run directory).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from reference_trainer.errors import UserError, printable
from reference_trainer.inputs import MAX_INPUT_BYTES, BoundedReader, open_input, read_input

_BLOCK = 1 << 16
_WRITE_BLOCK = 1 << 20
_noted: set[tuple[str, str, int]] = set()  # one note per file, message and size in a process


# --- writing ---------------------------------------------------------------------------------------------


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path` to write; on a clean exit it is fsync'd and renamed over `path`.

    The temp file is created with mode 0o666 so the umask applies exactly as for `open(path, "w")` (a
    mkstemp file would stay 0600); replacing an existing file keeps that file's permission bits. An OSError
    while writing (disk full, read-only) is a UserError naming `path`; the old file is left as it was.
    """
    path = Path(path)
    existing = _check_target(path)
    tmp = temp_beside(path, f".{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as err:
        raise cannot_write(path, err) from None
    try:
        try:
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        yield tmp
        # A library that writes the file itself may recreate it (safetensors does, 0600): the mode chosen
        # above is set again, so a checkpoint stays readable by whoever could read the file it replaces.
        os.chmod(tmp, mode)
        _fsync_path(tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise cannot_write(path, err) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def temp_beside(path: Path, suffix: str) -> Path:
    """A hidden temp path beside `path`, ending in `suffix`, whose name fits NAME_MAX (255 bytes): a legal
    250-byte file name must not be refused because its temp name would be longer."""
    room = 255 - len(suffix.encode()) - 1  # the leading dot
    name = path.name.encode()[:room].decode("utf-8", errors="ignore")
    return path.with_name(f".{name}{suffix}")


def write_safetensors(
    path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None
) -> None:
    """Tensors as a safetensors file, atomically. safetensors writes the file itself (in Rust): its I/O
    errors come as SafetensorError, turned here into the same one line as any refused write."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=metadata)
        except SafetensorError as err:
            raise UserError(f"cannot write {path}: {str(err).rpartition(': ')[2] or err}") from None


def write_bytes(path: str | Path, data: bytes) -> None:
    _write_blocks(path, [data])


def write_chunks(path: str | Path, chunks: Iterable[str]) -> None:
    """Replace `path` with these pieces of text, written as they come in blocks of about 1 MiB: a large
    document or a stream of rows is never held as one string."""
    _write_blocks(path, _blocks(chunks))


def _blocks(chunks: Iterable[str]) -> Iterator[bytes]:
    """UTF-8 blocks; a file name that is not UTF-8 (its bytes kept by Python as lone surrogates) is written
    as its escape, `\\udcff`, as json.dumps writes it, never a UnicodeEncodeError after the work is done."""
    block: list[str] = []
    size = 0
    for chunk in chunks:
        block.append(chunk)
        size += len(chunk)
        if size >= _WRITE_BLOCK:
            yield "".join(block).encode("utf-8", "backslashreplace")
            block, size = [], 0
    yield "".join(block).encode("utf-8", "backslashreplace")


def _write_blocks(path: str | Path, blocks: Iterable[bytes]) -> None:
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            for block in blocks:
                _write_all(fd, block)
        finally:
            os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    write_chunks(path, [text])


def write_json(path: str | Path, obj: Any) -> None:
    encoder = json.JSONEncoder(indent=2, default=_json_default)  # as json.dumps(obj, indent=2), streamed
    write_chunks(path, itertools.chain(encoder.iterencode(obj), ["\n"]))


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> None:
    """Replace `path` with these rows (any iterable: a generator is written as it yields), one JSON object
    per line."""
    write_chunks(path, (_line(row) for row in rows))


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one row durably: once this returns, the row survives a kill."""
    extend_jsonl(path, [obj])


def extend_jsonl(path: str | Path, rows: Iterable[Any]) -> None:
    """Append rows with one write and one fsync. A torn last line left by an earlier kill is cut off
    first, so a new row is never glued onto a fragment."""
    payload = "".join(_line(row) for row in rows).encode("utf-8")
    if not payload:
        return
    path = Path(path)
    created = _check_target(path) is None
    try:
        if not created:
            trim_torn_tail(path)
        fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:  # a failed append leaves at most a torn last line, which readers drop
        raise cannot_write(path, err) from None
    if created:  # the new directory entry must reach the disk too
        _fsync_dir(path.parent)


def trim_torn_tail(path: str | Path) -> bool:
    """Make `path` end in a newline: an unterminated last line that parses as a row gets its newline, a
    fragment is cut off (said once on stderr). True when the file changed."""
    path = Path(path)
    with os.fdopen(open_own(path, os.O_RDWR), "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return False
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return False
        start = _last_line_start(fh, size)
        fh.seek(start)
        fragment = fh.read()
        if _parse(fragment)[0] is not None:  # a whole row that only lacks its newline
            fh.write(b"\n")
        else:
            fh.truncate(start)
            if fragment.strip():
                _note(path, "cut a torn last line before appending (kill mid-write?)", size)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def replace_dir(tmp: str | Path, final: str | Path) -> Path:
    """Publish directory `tmp` as `final` (replacing an older one): its files are fsync'd first, so the
    renamed directory never holds data that a power cut could still lose."""
    tmp, final = Path(tmp), Path(final)
    if final.exists() and not final.is_dir():
        raise UserError(f"{final}: exists and is not a directory; refusing to replace it")
    try:
        for file in (p for p in tmp.rglob("*") if p.is_file()):
            _fsync_path(file)
        if final.exists():  # rename cannot replace a non-empty directory
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as err:
        raise cannot_write(final, err) from None
    _fsync_dir(final.parent)
    return final


def open_own(path: str | Path, flags: int) -> int:
    """os.open for a run's file written in place (appended, trimmed, truncated): a symlink at `path` is
    refused, not followed (O_NOFOLLOW), so a link planted in a run directory never leads a write to a file
    outside it. A writer that renames into place needs no such care: rename replaces the link itself."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError:
        if os.path.islink(path):  # ELOOP (Linux), EMLINK (BSD)
            raise UserError(f"{path}: is a symlink; rlbench writes only its own files (remove it)") from None
        raise


def make_dir(path: str | Path) -> Path:
    """Create output directory `path` (and its parents); a path that is a file, or a disk that refuses,
    is a one-line UserError naming it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{path}: exists and is not a directory") from None
    except OSError as err:
        raise UserError(f"cannot create directory {path}: {err.strerror or err}") from None
    return path


def cannot_write(path: str | Path, err: OSError) -> UserError:
    """The one line for a write the disk refused (full, read-only, no permission)."""
    return UserError(f"cannot write {path}: {err.strerror or err}")


# --- reading ---------------------------------------------------------------------------------------------


def read_jsonl(path: str | Path, required: Sequence[str] = (), **options: Any) -> list[dict[str, Any]]:
    """The JSON object on every non-blank line of `path`, as a list (iter_jsonl: the options and checks)."""
    return list(iter_jsonl(path, required, **options))


def iter_jsonl(
    path: str | Path,
    required: Sequence[str] = (),
    *,
    torn_tail: bool = True,
    check: Callable[[dict[str, Any]], str | None] | None = None,
    limit: int = MAX_INPUT_BYTES,
    line_limit: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The JSON object on every non-blank line of `path`, one at a time, each holding the `required` fields
    (and passing `check`, which returns what is wrong with a row, or None).

    The file must be a regular file of at most `limit` bytes (inputs.open_input: no FIFO, device or
    directory). An unterminated last line that does not parse is what a kill mid-append leaves: with
    `torn_tail` it is dropped and one note names the file on stderr; without (user-supplied data) it is an
    error. Any other bad line raises UserError("FILE:LINE: why"), one line for the CLI; so does a line
    longer than `line_limit` bytes, before it is parsed.
    """
    path = Path(path)
    with open_input(path) as fh:
        for lineno, raw in enumerate(BoundedReader(fh, path, limit, line_limit), 1):
            if not raw.strip():
                continue
            row, why = _parse(raw)
            if row is None:
                if torn_tail and not raw.endswith(b"\n"):  # only the last line can lack its newline
                    _note(path, "dropped a torn last line (kill mid-write?)", os.fstat(fh.fileno()).st_size)
                    break
                raise UserError(f"{path}:{lineno}: {why}")
            if missing := [k for k in required if k not in row]:
                raise UserError(f"{path}:{lineno}: row lacks field(s) {', '.join(missing)}")
            if check is not None and (why := check(row)) is not None:
                raise UserError(f"{path}:{lineno}: {why}")
            yield row


def read_json(path: str | Path, limit: int = MAX_INPUT_BYTES) -> Any:
    """A whole JSON file (a regular file of at most `limit` bytes); a missing or malformed one is a
    one-line UserError naming it."""
    path = Path(path)
    try:
        text = read_input(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    value, why, line = decode_json(text)
    if why:
        raise UserError(f"{path}:{line}: {why}" if line else f"{path}: {why}") from None
    return value


def decode_json(raw: str | bytes) -> tuple[Any, str, int | None]:
    """(value, "", None) for JSON text, or (None, why, line or None) for what the project cannot read:
    malformed text, not UTF-8, nesting deeper than the interpreter's recursion limit, an integer past
    Python's 4,300-digit conversion limit. Every reader of the project's JSON files goes through here, so
    each of these is one line naming the file rather than a RecursionError or ValueError traceback."""
    try:
        return json.loads(raw), "", None
    except UnicodeDecodeError:
        return None, "not UTF-8 text", None
    except json.JSONDecodeError as err:
        return None, f"malformed JSON ({err.msg})", err.lineno
    except RecursionError:
        return None, "JSON nested too deeply to read", None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        return None, "an integer of more than 4,300 digits, which JSON readers refuse", None


# --- helpers ---------------------------------------------------------------------------------------------


def _line(obj: Any) -> str:
    return json.dumps(obj, default=_json_default) + "\n"  # json.dumps escapes newlines: one row, one line


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    value, why, _ = decode_json(raw)  # the row's line number is the caller's
    if why:
        return None, why.replace("malformed JSON (", "malformed JSON row (")
    if not isinstance(value, dict):
        return None, "row is not a JSON object"
    return value, ""


def _last_line_start(fh: BinaryIO, size: int) -> int:
    """Offset just after the last newline (0 when there is none), reading back in blocks."""
    end = size
    while end > 0:
        start = max(0, end - _BLOCK)
        fh.seek(start)
        at = fh.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _note(path: Path, message: str, size: int) -> None:
    """One line on stderr, once per file state: resume and report both read the same torn file."""
    key = (str(path.resolve()), message, size)
    if key not in _noted:
        _noted.add(key)
        print(printable(f"note: {path}: {message}"), file=sys.stderr, flush=True)


def _check_target(path: Path) -> os.stat_result | None:
    """The stat of the regular file at `path` (None: nothing there). Anything else is refused: renaming over
    a device node would replace /dev/null for every process, and appending to a FIFO blocks."""
    try:
        found = os.stat(path)  # follows a symlink: a link to /dev/null is the device
    except FileNotFoundError:
        return None
    except OSError as err:  # a parent that is a file, no permission: the write itself says it
        if err.errno in (errno.ENOTDIR, errno.EACCES, errno.ELOOP):
            raise cannot_write(path, err) from None
        return None
    if stat.S_ISDIR(found.st_mode):
        raise UserError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(found.st_mode):
        kind = "a device, pipe or socket"
        raise UserError(f"{path}: exists and is not a regular file ({kind}); not writing over it")
    return found


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    # Not every filesystem (or OS) can fsync a directory; the rename itself is still atomic.
    with suppress(OSError):
        _fsync_path(directory)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
