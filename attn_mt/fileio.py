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
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from attn_mt.errors import CheckpointError, UserError

# Check access as the effective user (what opening the file will be checked against).
_EFFECTIVE = os.access in os.supports_effective_ids


def umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary handle whose content replaces `path` only when the block ends without error.

    The file gets the mode an ordinary `open(path, "w")` would give (0644 under umask 022), not
    mkstemp's 0600, so a team can share runs and caches. Missing folders are made; temp files
    of earlier writes of `path` that a SIGKILL cut short are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = f".{path.name}.", ".tmp"
    for stale in path.parent.glob(f"{glob.escape(prefix)}*{suffix}"):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_output(path: str | Path, text: str) -> None:
    """Write the UTF-8 `text` to `path` atomically; an OS error is a UserError."""
    try:
        with atomic_write(path) as handle:
            handle.write(text.encode("utf-8"))
    except OSError as err:
        raise UserError(f"{path}: cannot write ({os_reason(err)})") from None


def os_reason(err: OSError) -> str:
    """The short reason of an OS error: 'Permission denied', 'No space left on device'."""
    return err.strerror or str(err) or type(err).__name__


def writable(path: str | Path) -> bool:
    """Whether this process may write the existing file or folder `path`."""
    return os.access(path, os.W_OK, effective_ids=_EFFECTIVE)


def writable_dir(path: str | Path) -> bool:
    """Whether this process may create files in the folder `path`."""
    return os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE)


def check_output_file(path: str | Path, option: str = "--out") -> None:
    """Refuse, before any work, a file path that cannot be written: a folder, a path under a
    file, a folder without write permission."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    if path.exists() and not writable(path):
        raise UserError(f"{option} {path}: permission denied; the file is not writable")
    _check_parent(path, option)


def check_output_dir(path: str | Path, option: str = "--out") -> None:
    """Refuse, before any work, a folder path that cannot be created or written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: exists and is not a folder")
    _check_parent(path, option)


def _check_parent(path: Path, option: str) -> None:
    """The nearest existing folder above `path` must be a writable folder (the rest is made)."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{option} {path}: {parent} is a file, not a folder")
    if not writable_dir(parent):
        raise UserError(f"{option} {path}: permission denied; cannot write in {parent}")


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint a `--model` path means, checked before any import of torch: a run folder
    (or its checkpoints/ folder) means its best.pt; a file is used as it is."""
    path = Path(path).expanduser()
    if path.is_dir():
        folder = path if path.name == "checkpoints" else path / "checkpoints"
        best = folder / "best.pt"
        if not best.is_file():
            hint = (
                "it stopped before its first validation; resume it with `attn-mt train --resume`"
                if (folder / "last.pt").is_file()
                else "is it a run folder (train.out_dir)?"
            )
            raise CheckpointError(f"{path}: no {best.relative_to(path)} in this folder; {hint}")
        return best
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    return path
