"""One training process per run folder: an OS lock held for the whole run.

`lock_run_folder` takes an exclusive `flock` on `OUT/.lock` before anything else is written
there. The kernel drops the lock when the process ends, however it ends, so a SIGKILL never
leaves a stale lock; the file only names the holder's pid for the message a second process
prints. A run that fails before its first checkpoint takes away the files it created (and the
folder, if it made it), so the retry finds the folder as it was. `check_run_start` refuses, from
what the folder holds alone, a start it could not make; the CLI calls it before torch is
imported (seconds), so this module imports no torch; `continue_command` names the command that
continues a run, for the run's last line and `attn-mt info`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.errors import UserError
from attn_mt.fileio import os_reason
from attn_mt.paths import writable, writable_dir

if TYPE_CHECKING:
    from attn_mt.config.schema import TrainConfig

LOCK_NAME = ".lock"
# What a run writes into its folder (README.md, "Train"); removed again when the run fails
# before its first last.pt.
RUN_ENTRIES = ("checkpoints", "config.yaml", "casing.json", "metrics.jsonl", "train.log", "tb")


@contextlib.contextmanager
def lock_run_folder(out_dir: str | Path, command: str = "train") -> Iterator[None]:
    """Hold the run folder `out_dir` (created if needed) for this process until the block ends;
    the lock file names the holder (its pid and `command`) for another process's message."""
    out = Path(out_dir)
    created = _make_folders(out)
    try:
        handle = _acquire(out, command)
    except BaseException:
        _remove_folders(created)
        raise
    existed = {name for name in RUN_ENTRIES if (out / name).exists()}
    try:
        _check_writable(out)
        yield
    except BaseException:
        if not (out / "checkpoints" / "last.pt").exists():  # nothing to resume: leave no trace
            for name in sorted(set(RUN_ENTRIES) - existed):
                _remove(out / name)
        raise
    finally:
        (out / LOCK_NAME).unlink(missing_ok=True)  # the next holder makes a new one
        handle.close()
        _remove_folders(created)


def check_run_start(out_dir: str | Path, resume: bool) -> None:
    """Refuse what the run folder alone rules out: overwriting a run, a folder that holds part
    of one (`_unfinished`), nothing to resume, a folder (or a resumed run's log) not writable.
    Whether last.pt fits the config is checked where it is read (train/setup.py)."""
    out = Path(out_dir)
    last = out / "checkpoints" / "last.pt"
    if not last.is_file() and (why := _unfinished(out)):  # neither resumable nor ours to replace
        raise UserError(f"{out}: {why}")
    if last.is_file() and not resume:
        raise UserError(
            f"{out}: already holds a run; continue it with `attn-mt train --resume`, "
            "or choose another train.out_dir"
        )
    if resume and not last.is_file():
        raise UserError(
            f"{out}: nothing to resume (no checkpoints/last.pt); start without --resume"
        )
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: train.out_dir exists and is not a folder")
    if out.is_dir() and not writable_dir(out):
        raise UserError(f"{out}: cannot write in the run folder (Permission denied)")
    if resume:
        _check_writable(out)


def _unfinished(out: Path) -> str | None:
    """What a folder without checkpoints/last.pt holds of a run, said as it is: checkpoints
    that cannot be resumed, a run stopped before its first checkpoint, or a config.yaml alone
    (perhaps the user's own); None for a new or empty folder."""
    if not out.is_dir():
        return None
    kept = sorted(path.name for path in (out / "checkpoints").glob("*.pt"))
    if kept:
        weights = out / "checkpoints" / ("best.pt" if "best.pt" in kept else kept[-1])
        return (
            f"holds checkpoints ({', '.join(kept)}) but no checkpoints/last.pt, which resuming "
            f"needs; train from those weights in another train.out_dir with `--init-from "
            f"{weights}`, or delete that folder"
        )
    if any((out / name).exists() for name in RUN_ENTRIES if name != "config.yaml"):
        return (
            "holds a run that stopped before its first checkpoint (no checkpoints/last.pt); "
            "delete that folder or choose another train.out_dir"
        )
    if (out / "config.yaml").exists():
        return (
            "holds a config.yaml and nothing else of a run (no checkpoints, metrics.jsonl or "
            "train.log); a run writes its resolved config there: move that file elsewhere (it "
            "may be your own config) or choose another train.out_dir"
        )
    return None


def is_locked(out_dir: str | Path) -> bool:
    """Whether a process holds the run folder's lock now (a run in progress there; checked
    before this process takes the lock, so that `lock_run_folder` names that process)."""
    return holder(out_dir) is not None


def holder(out_dir: str | Path) -> str | None:
    """The process that holds the run folder's lock now, in words (`attn-mt distill (pid
    123)`); None when none does."""
    try:
        with open(Path(out_dir) / LOCK_NAME, encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _holder_words(handle.read())
    except OSError:
        return None  # no lock file, or one this process cannot read: nothing holds it
    return None


def busy(out: Path, who: str) -> UserError:
    """The refusal of a run folder another process holds, naming it and its lock."""
    return UserError(
        f"{out}: another {who} is running in this folder (it holds {out / LOCK_NAME}); wait for "
        "it to end or choose another train.out_dir"
    )


def _holder_words(text: str) -> str:
    """A lock file's `PID COMMAND` (an older one: `PID`) as `attn-mt COMMAND (pid PID)`."""
    pid, command = [*text.split(), "unknown", "train"][:2]
    return f"attn-mt {command} (pid {pid})"


def _check_writable(out: Path) -> None:
    """The logs a resumed run appends to must be writable (a read-only copy of a run would fail
    at its first log line, after the start-up); checkpoints are checked where they are read."""
    for name in ("metrics.jsonl", "train.log", "tb"):
        path = out / name
        if path.exists() and not writable(path):
            raise UserError(f"{path}: permission denied; the run writes it (make it writable)")


def _acquire(out: Path, command: str):
    """The open lock file, locked; a UserError naming the holder if another process has it."""
    path = out / LOCK_NAME
    while True:
        try:
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until the run ends)
        except OSError as err:
            raise UserError(f"{out}: cannot write in the run folder ({os_reason(err)})") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            who = _holder_words(handle.read())
            handle.close()
            raise busy(out, who) from None
        # The holder before us may have removed the file after we opened it: lock the new one.
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            handle.truncate(0)
            handle.write(f"{os.getpid()} {command}\n")
            handle.flush()
            return handle
        handle.close()


def _make_folders(out: Path) -> list[Path]:
    """Create `out` and any missing parents; return those created, deepest first."""
    missing = []
    folder = out.absolute()
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: train.out_dir exists and is not a folder")
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue  # made by someone else meanwhile
        except OSError as err:
            _remove_folders([p for p in missing if p.is_dir()])
            if path.parent.exists() and not path.parent.is_dir():
                why = f"{path.parent} is a file, not a folder"
            elif isinstance(err, PermissionError):
                why = f"permission denied in {path.parent}"
            else:
                why = os_reason(err)
            raise UserError(f"{out}: cannot create the run folder ({why})") from None
    return missing


def _remove_folders(folders: list[Path]) -> None:
    """Remove the folders this process created, deepest first, while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def continue_command(out_dir: str | Path, stopped_by: str, t: TrainConfig | None = None) -> str:
    """What continues the run in `out_dir` that stopped so: one command whatever config or
    `--set` started it, since the run folder holds its resolved config; with the run's
    train config `t`, the budget it reached doubled."""
    command = f"attn-mt train --resume {shlex.quote(str(out_dir))}"
    if stopped_by == "signal":
        return f"continue it with `{command}`"
    # The budget it reached must grow, or the resumed run ends at once.
    budget = {"max_steps": "N", "max_minutes": "M", "max_epochs": "E"}.get(stopped_by)
    if budget:
        had = getattr(t, stopped_by, 0)
        if had > 0:
            return (
                f"train it further with `{command} --set train.{stopped_by}={2 * had:g}` (it "
                f"had {had:g}; give more)"
            )
        return f"train it further with `{command} --set train.{stopped_by}={budget}`"
    return f"train it further with `{command} --set train.KEY=VALUE` (a larger budget)"


def stopped_by(out_dir: str | Path, step: int) -> str | None:
    """How the run in `out_dir` stopped at `step`, as its train.log's last "finished at step
    N (HOW)" line says (max_steps, max_minutes, early stopping, ...); None where the log
    says nothing of that step (stopped by a signal, killed, or no log)."""
    try:
        text = (Path(out_dir) / "train.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _FINISHED.findall(text)
    if found and int(found[-1][0]) == step:
        return str(found[-1][1])
    return None


# The closing line of a run that ends by itself (`train.loglines.log_finish`).
_FINISHED = re.compile(r"finished at step (\d+) \(([^)]*)\)")
