"""Files written whole or not at all, with the user's umask; output paths and checkpoint paths
checked up front (no torch here: a mistake is reported before the seconds its import takes).

`atomic_write` is the one way attn-mt writes a file others may read (checkpoints, cached
SentencePiece models, downloads, hypotheses): a temp file beside the target, fsync, rename, so a
crash or a full disk leaves the old file (or none) in place. `check_output_file` and
`check_output_dir` say before any work starts that an output cannot be written.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
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


def umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary handle on the output `path`: the one way attn-mt writes a file.

    `path` is followed through symbolic links (the file a link names is written, the link
    kept). A device or FIFO (/dev/null, a pipe) is written in place: renaming over it would
    replace the node with a regular file. Anything else is written to a temp file beside the
    target, fsynced and renamed over it only when the block ends without error; the file gets
    the mode an ordinary `open(path, "w")` would give (0644 under umask 022), not mkstemp's
    0600, so a team can share runs and caches. Missing folders are made. The temp file is named
    for this process (host, pid, random): a concurrent writer's is never touched, and those a
    killed writer left (its pid gone) are removed. A SIGTERM while the block runs unwinds it,
    so no temp file is left.
    """
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        # Opened through the link itself: /dev/stdout's chain ends in a pipe with no path.
        with sigterm_unwinds(), open(path, "wb") as handle:
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
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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


def writable(path: str | Path) -> bool:
    """Whether this process may write the existing file or folder `path`."""
    return os.access(path, os.W_OK, effective_ids=_EFFECTIVE)


def writable_dir(path: str | Path) -> bool:
    """Whether this process may create files in the folder `path`."""
    return os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE)


def check_output_file(
    path: str | Path, option: str = "--out", inputs: Iterable[tuple[str, Path | None]] = ()
) -> None:
    """Refuse, before any work, a file path that cannot be written: a folder, a path under a
    file, a folder without write permission, or one of the command's `inputs` ((option, path);
    through any link: writing it would destroy what is being read)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {named(path)}: is a folder; give a file name")
    for name, source in inputs:
        if source is not None and _same_file(path, source):
            raise UserError(
                f"{option} {named(path)}: is the {name} file being read; give another file"
            )
    if path.exists() and not writable(path):
        raise UserError(f"{option} {named(path)}: permission denied; the file is not writable")
    _check_parent(path, option)


def _same_file(out: Path, source: Path) -> bool:
    """Whether `out` names the regular file `source` (a device such as /dev/null may be both)."""
    try:
        return source.is_file() and out.exists() and os.path.samefile(out, source)
    except OSError:
        return False


def check_output_dir(path: str | Path, option: str = "--out") -> None:
    """Refuse, before any work, a folder path that cannot be created or written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {named(path)}: exists and is not a folder")
    _check_parent(path, option)


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
