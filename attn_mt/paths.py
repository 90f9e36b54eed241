"""The paths a command is given, checked up front, before any work and before torch is imported
(so a mistake is reported before the seconds its import takes): `check_output_file` and
`check_output_dir`, the one check every command that writes makes (an output that cannot be
written, a loop of links, or one that is, through links, hard links or a stream, a file the
command reads); `resolve_checkpoint`, the checkpoint a `--model` path means; `denied`, a path the
user may not reach, as one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from attn_mt.errors import CheckpointError, UserError, named
from attn_mt.fileio import descriptor_of

# Check access as the effective user (what opening the file will be checked against).
_EFFECTIVE = os.access in os.supports_effective_ids
# The inputs a command reads, as (option, path) pairs; a None path is an option not given.
Inputs = Iterable[tuple[str, str | Path | None]]


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


def check_stdout(way_out: str) -> None:
    """Refuse, before any work, a stdout the shell closed (`>&-`): what the command prints
    would go nowhere; `way_out` says what to give instead."""
    if sys.stdout is None:
        raise UserError(f"stdout: cannot write (it is closed); {way_out}")


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
