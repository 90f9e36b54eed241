"""Files written whole or not at all, with the user's umask; output paths and checkpoint paths
checked up front (no torch here: a mistake is reported before the seconds its import takes).

`atomic_write` is the one way attn-mt writes a file others may read (checkpoints, cached
SentencePiece models, downloads, hypotheses): a temp file beside the target, fsync, rename, so a
crash or a full disk leaves the old file (or none) in place. An open stream named as a path
(/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, or a link to one) is written where the
shell opened it, never replaced or truncated. `check_output_file` and `check_output_dir` are the
one check every command that writes makes before any work: an output that cannot be written, a
loop of links, or one that is (through links, hard links or a stream) a file the command reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from attn_mt.errors import CheckpointError, UserError, named

# Check access as the effective user (what opening the file will be checked against).
_EFFECTIVE = os.access in os.supports_effective_ids
# In temp names: a pid means something only on its own host (a shared file system has many).
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
# Paths that name an open file descriptor rather than a file: (process, descriptor) groups.
_DESCRIPTOR = re.compile(r"/dev/fd/(\d+)|/proc/(self|thread-self|\d+)/fd/(\d+)")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
# The inputs a command reads, as (option, path) pairs; a None path is an option not given.
Inputs = Iterable[tuple[str, str | Path | None]]


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
            with os.fdopen(fd, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    sync_folder(target.parent)


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
    `.NAME.HOST-PID-`, then a random part."""
    return f".{path.name}.{_HOST}-{os.getpid()}-"


def remove_stale_temps(path: Path) -> None:
    """Remove the temp files and folders of `path` that a killed process of this host left
    (its pid no longer runs); another process's, or another host's, are left alone."""
    pattern = re.compile(re.escape(f".{path.name}.{_HOST}-") + r"(\d+)-[^/]*\.(tmp|staging)")
    for stale in path.parent.glob(f"{glob.escape(f'.{path.name}.{_HOST}-')}*"):
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


def os_reason(err: OSError) -> str:
    """The short reason of an OS error: 'Permission denied', 'No space left on device'."""
    return err.strerror or str(err) or type(err).__name__


def denied(err: PermissionError) -> str:
    """The one line for a path this process may not reach (an OS error of a stat, an open or a
    resolve): the first folder on its way it cannot enter, or the path itself."""
    path = Path(err.filename)
    for folder in reversed(path.parents):
        if not os.access(folder, os.X_OK, effective_ids=_EFFECTIVE):
            return f"{named(path)}: permission denied; cannot enter the folder {named(folder)}"
    return f"{named(path)}: permission denied"


def writable(path: str | Path) -> bool:
    """Whether this process may write the existing file or folder `path`."""
    return os.access(path, os.W_OK, effective_ids=_EFFECTIVE)


def writable_dir(path: str | Path) -> bool:
    """Whether this process may create files in the folder `path`."""
    return os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE)


def check_output_file(path: str | Path, option: str = "--out", inputs: Inputs = ()) -> None:
    """Refuse, before any work, a file path that cannot be written: a loop of links, a folder,
    a path under a file, a folder without write permission, a closed stream, or one of the
    command's `inputs` ((option, path) pairs; through links, hard links or a stream such as
    /dev/stdout: writing it would destroy what is being read)."""
    path = Path(path)
    _check_not_a_loop(path, option)
    for name, source in inputs:
        if source is not None and same_file(path, source):
            raise UserError(
                f"{option} {named(path)}: is the {name} file being read; give another file"
            )
    found = descriptor_of(path)
    if found is not None:
        _check_stream(path, option, *found)
    elif path.is_dir():
        raise UserError(f"{option} {named(path)}: is a folder; give a file name")
    elif path.exists() and not writable(path):
        what = "the file" if path.is_file() else "it"  # else a device or FIFO, written in place
        raise UserError(f"{option} {named(path)}: permission denied; {what} is not writable")
    else:
        _check_parent(path, option)


def _check_not_a_loop(path: Path, option: str) -> None:
    """A path whose links lead round in a loop names nothing that could be written."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(
                f"{option} {named(path)}: its symbolic links form a loop; give another name"
            ) from None


def _check_stream(path: Path, option: str, pid: int | None, fd: int) -> None:
    """This process's descriptor `fd` (or another's, by its path) must be open for writing."""
    if pid is not None:
        if not os.access(path, os.W_OK):
            raise UserError(f"{option} {named(path)}: cannot write to that process's stream")
        return
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise UserError(f"{option} {named(path)}: descriptor {fd} is not open") from None
    if mode == os.O_RDONLY:
        raise UserError(f"{option} {named(path)}: descriptor {fd} is open for reading only")


def same_file(out: str | Path, source: str | Path) -> bool:
    """Whether `out` names the regular file `source`, followed through links and streams and
    compared by device and inode (hard links too); a device such as /dev/null may be both."""
    try:
        written, read = os.stat(out), os.stat(source)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(read.st_mode) and (written.st_dev, written.st_ino) == (
        read.st_dev,
        read.st_ino,
    )


def check_output_dir(path: str | Path, option: str = "--out", inputs: Inputs = ()) -> None:
    """Refuse, before any work, a folder path that cannot be created or written, or one that
    holds one of the command's `inputs` (replacing the folder would delete what is read)."""
    path = Path(path)
    _check_not_a_loop(path, option)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {named(path)}: exists and is not a folder")
    for name, source in inputs:
        if source is not None and path.is_dir() and _holds(path, Path(source)):
            raise UserError(
                f"{option} {named(path)}: holds the {name} file being read ({named(source)}); "
                "give another folder"
            )
    _check_parent(path, option)


def _holds(folder: Path, source: Path) -> bool:
    """Whether the file `source` lies in `folder` (at any depth, through any links)."""
    try:
        inside = os.stat(folder)
        real = Path(os.path.realpath(source))
        return any(
            (found.st_dev, found.st_ino) == (inside.st_dev, inside.st_ino)
            for found in map(os.stat, [real, *real.parents])
        )
    except OSError:
        return False


def _check_parent(path: Path, option: str) -> None:
    """The nearest existing folder above `path` must be a writable folder (the rest is made)."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{option} {named(path)}: {named(parent)} is a file, not a folder")
    if not writable_dir(parent):
        raise UserError(
            f"{option} {named(path)}: permission denied; cannot write in {named(parent)}"
        )


def _no_best(folder: Path) -> str:
    """Why a folder given as --model has no best.pt, and what to give instead."""
    run = folder.parent
    if (folder / "last.pt").is_file():
        return (
            "no checkpoints/best.pt yet (the run stopped before its first validation); give its "
            f"last.pt (--model {named(folder / 'last.pt')}) or continue the run "
            f"(`attn-mt train --resume {named(run)}`)"
        )
    if (run / "config.yaml").is_file():
        return (
            "a run folder with no checkpoint yet (no checkpoints/best.pt or last.pt): a run "
            "saves one at its first validation or when it stops"
        )
    return "no checkpoints/best.pt in this folder; give a run folder (train.out_dir) or a .pt file"


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint a `--model` path means, checked before any import of torch: a run folder
    (or its checkpoints/ folder) means its best.pt; a file is used as it is."""
    path = Path(path).expanduser()
    if path.is_dir():
        folder = path if path.name == "checkpoints" else path / "checkpoints"
        best = folder / "best.pt"
        if not best.is_file():
            raise CheckpointError(f"{named(path)}: {_no_best(folder)}")
        return best
    if not path.is_file():
        raise CheckpointError(f"{named(path)}: checkpoint not found")
    return path
