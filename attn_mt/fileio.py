"""Files written whole or not at all, with the user's umask (no torch here: a command writes its
files the same way before torch is imported and after).

`atomic_write` is the one way attn-mt writes a file others may read (checkpoints, cached
SentencePiece models, downloads, hypotheses): a temp file beside the target, fsync, rename, so a
crash or a full disk leaves the old file (or none) in place. An open stream named as a path
(/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, or a link to one) is written where the
shell opened it, never replaced or truncated. The checks an output path passes before any work
are `paths.py`'s.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from attn_mt.errors import UserError, named

# In temp names: a pid means something only on its own host (a shared file system has many).
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
# Paths that name an open file descriptor rather than a file: (process, descriptor) groups.
_DESCRIPTOR = re.compile(r"/dev/fd/(\d+)|/proc/(self|thread-self|\d+)/fd/(\d+)")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
# What a temp name adds after `.NAME.HOST-`: a pid (Linux's are at most 7 digits), "-", mkstemp's
# 8 random characters and the longest suffix, ".staging".
_TEMP_TAIL = 10 + 1 + 8 + len(".staging")


def cache_dir() -> Path:
    """The user cache folder: $ATTN_MT_CACHE, else $XDG_CACHE_HOME/attn-mt, else ~/.cache."""
    if os.environ.get("ATTN_MT_CACHE"):
        return Path(os.environ["ATTN_MT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attn-mt"


def umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary handle on the output `path`: the one way attn-mt writes a file.

    `path` is followed through symbolic links (the file a link names is written, the link
    kept). An open stream (/dev/stdout, ...: `open_stream`) is written where the shell opened
    it, a device or FIFO (/dev/null, a pipe) in place: renaming over either would replace the
    node (or the file the shell opened) with a new file. Anything else is written to a temp
    file beside the target, fsynced and renamed over it only when the block ends without
    error; the file gets the mode an ordinary `open(path, "w")` would give (0644 under umask
    022), not mkstemp's 0600, so a team can share runs and caches. Missing folders are made.
    The temp file is named for this process (host, pid, random): a concurrent writer's is
    never touched, and those a killed writer left (its pid gone) are removed. A SIGTERM while
    the block runs unwinds it, so no temp file is left.
    """
    if descriptor_of(path) is not None:
        with sigterm_unwinds(), open_stream(path) as handle:
            yield handle
        return
    if written_in_place(path):
        with sigterm_unwinds(), open(path, "wb") as handle:  # a device or FIFO
            yield handle
        return
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    with sigterm_unwinds():
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temp_prefix(target), suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~umask())
            with io.BufferedWriter(_Named(fd, target)) as handle:
                yield handle
                handle.flush()
                _named_errors(os.fsync, target, handle.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    sync_folder(target.parent)


class _Named(io.FileIO):
    """A file descriptor written for `target`: a write error (a full disk, a file-size limit)
    names `target`, as an error of `open` names its file, so that whoever reports it can say
    which of several files being written failed."""

    def __init__(self, fd: int, target: Path):
        super().__init__(fd, "wb")
        self.target = target

    def write(self, data: Any, /) -> int:
        written: int = _named_errors(super().write, self.target, data)
        return written


def _named_errors(call: Callable[..., Any], target: Path, *args: Any) -> Any:
    """`call(*args)`, an OS error it raises given `target` as its file name."""
    try:
        return call(*args)
    except OSError as err:
        err.filename = err.filename or str(target)
        raise


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a crash of the machine."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def written_in_place(path: str | Path) -> bool:
    """Whether `atomic_write` writes `path` in place, not through a temp file and a rename: an
    open stream (`descriptor_of`), a device or a FIFO."""
    if descriptor_of(path) is not None:
        return True
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def descriptor_of(path: str | Path) -> tuple[int | None, int] | None:
    """(process id, descriptor) when `path` names an open file descriptor: /dev/stdout,
    /dev/stderr, /dev/fd/N, /proc/self/fd/N or /proc/PID/fd/N, or a link (chain) to one; the
    process None for this one. None for any other path."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel follows at most 40 links
        if current in _STANDARD:
            return None, _STANDARD[current]
        found = _DESCRIPTOR.fullmatch(current)
        if found:
            fd, process, proc_fd = found.groups()
            if fd is not None:
                return None, int(fd)
            pid = None if process in ("self", "thread-self") else int(process)
            return (None if pid == os.getpid() else pid), int(proc_fd)
        try:
            target = os.readlink(current)
        except OSError:  # not a link (or nothing there): a path like any other
            return None
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
    return None


@contextlib.contextmanager
def open_stream(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary handle writing to the open stream `path` names (`descriptor_of`), never
    truncating it: this process's descriptor is written through a copy of itself (so
    `-o /dev/stdout >> log` appends to log, and `> log 2>&1` shares the shell's offset with
    stderr); another process's is opened for appending."""
    found = descriptor_of(path)
    assert found is not None, f"{path}: not a stream"
    pid, fd = found
    for stream in (sys.stdout, sys.stderr):  # what Python holds for them goes first
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    copy = os.open(path, os.O_WRONLY | os.O_APPEND) if pid is not None else os.dup(fd)
    with os.fdopen(copy, "wb") as handle:
        yield handle


def temp_prefix(path: Path) -> str:
    """The name start of this process's temp files (or folders) for `path`:
    `.NAME.HOST-PID-`, then a random part; a NAME too long for that to fit the file system's
    limit on a name is cut (`fitted`)."""
    return f"{_temp_stem(path)}{os.getpid()}-"


def _temp_stem(path: Path) -> str:
    """`.NAME.HOST-`: what every temp name of `path` on this host starts with."""
    room = name_max(path.parent) - len(f"..{_HOST}-".encode()) - _TEMP_TAIL
    return f".{fitted(path.name, room)}.{_HOST}-"


def name_max(folder: Path) -> int:
    """The longest file name, in bytes, that the file system of `folder` takes (255 where it
    does not say, or `folder` is not there yet)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def fitted(name: str, room: int) -> str:
    """`name` if its UTF-8 takes at most `room` bytes, else its start and `~` and 8 hex digits
    of its sha256 in `room` bytes: a name derived from a long one (a temp file's, a partial
    translation's) still fits the file system, and two long names stay apart."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= room:
        return name
    digest = hashlib.sha256(data).hexdigest()[:8]
    start = data[: max(room - 9, 0)].decode("utf-8", "ignore")  # never half a character
    return f"{start}~{digest}"


def remove_stale_temps(path: Path) -> None:
    """Remove the temp files and folders of `path` that a killed process of this host left
    (its pid no longer runs); another process's, or another host's, are left alone."""
    stem = _temp_stem(path)
    pattern = re.compile(re.escape(stem) + r"(\d+)-[^/]*\.(tmp|staging)")
    for stale in path.parent.glob(f"{glob.escape(stem)}*"):
        found = pattern.fullmatch(stale.name)
        if found and not _alive(int(found.group(1))):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Terminated(SystemExit):
    """SIGTERM, raised where the process is, so that `finally` blocks remove temp files."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM exits (143, the shell's 128 + 15) by unwinding the stack,
    not by dying at once, so the temp files and folders of the writes in progress are removed.

    Only where SIGTERM has its default action and in the main thread: a command that handles
    SIGTERM itself (training saves and stops; serving drains) keeps its handler.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        print("attn-mt: terminated", file=sys.stderr)
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is terminate:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_output(path: str | Path, text: str, option: str = "--out") -> None:
    """Write the UTF-8 `text` to `path` (see `atomic_write`); an OS error is a UserError."""
    try:
        with atomic_write(path) as handle:
            handle.write(text.encode("utf-8"))
    except OSError as err:
        raise UserError(f"{option} {named(path)}: cannot write ({os_reason(err)})") from None


def drop_stdout() -> None:
    """Point stdout at /dev/null once it cannot be written (its reader went away: `| head`;
    a full disk): Python's flush at exit would otherwise fail again, with a traceback-like
    "Exception ignored" and exit 120."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def os_reason(err: OSError) -> str:
    """The short reason of an OS error: 'Permission denied', 'No space left on device'."""
    return err.strerror or str(err) or type(err).__name__
