"""A translation written as it goes, so that `translate --output FILE --resume` can continue it.

While `translate -o FILE` runs, FILE itself is untouched: the output lines done so far, in input
order, go to `FILE.partial` (beside the file a link names), and `FILE.partial.json` (the record,
rewritten atomically at most every FLUSH_SECONDS, after the lines it counts are synced) says
what made them: the checkpoints' sha256, the decode settings, which input lines the part covers,
how far it got (lines, bytes, the sha256 of those input lines) and the lines finished ahead of
those (a chunk's lines are searched shortest first: each with the sha256 of its input line and
its output). When every line is done, FILE.partial is renamed to FILE and the record removed:
FILE is whole or not there, as any output of attn-mt. A run stopped at any moment (Ctrl-C,
SIGTERM, SIGKILL) leaves the two files; `--resume` checks the record against its own settings
and input, cuts FILE.partial back to the bytes the record counts, takes the lines finished ahead
as they come (a line finished after the last record is done again) and goes on.

FILE.partial is attn-mt's own: created exclusively, never followed through a link, never one of
the files the command reads; a FILE.partial that is not (a link, a FIFO, a file with no record
beside it) is refused in one line and left as it is. It is locked (flock) while a process
writes it, so a second writer is refused. Where FILE's name is too long for the file system to
take `FILE.partial.json`, the two take a shortened name (`fileio.fitted`).

Under torchrun each process writes a part of its own (`FILE.part2of4.partial`), which rank 0
joins in order once all are done (`jobs/split.py`). The record's format and checks:
`jobs/record.py`. No torch here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from attn_mt.errors import UserError, named
from attn_mt.fileio import atomic_write, fitted, name_max, os_reason, sync_folder
from attn_mt.jobs.record import (
    FORMAT,
    add_lines,
    difference,
    line_digest,
    line_sha,
    lines_words,
    read_record,
)
from attn_mt.paths import Inputs, same_file

FLUSH_SECONDS = 1.0  # the most a SIGKILL loses of lines already finished, beside those in flight


def partial_paths(target: Path, part_name: str = "") -> tuple[Path, Path]:
    """`FILE[.partNofM].partial` and its record `....partial.json` beside `target`, FILE's
    name shortened where the file system would not take the record's."""
    room = name_max(target.parent) - len(f"{part_name}.partial.json".encode())
    data = target.with_name(f"{fitted(target.name, room)}{part_name}.partial")
    return data, data.with_name(data.name + ".json")


class PartialOutput:
    """The part of a translation's output that a process writes: `FILE[.partNofM].partial`
    and its record, locked while this process holds them."""

    def __init__(self, target: Path, part_name: str = ""):
        self.target = target
        self.data, self.record_path = partial_paths(target, part_name)
        self.handle: BinaryIO | None = None
        self.record: dict[str, Any] = {}  # as last written
        self.digest = line_digest()
        self.lines = 0  # lines done, FILE.partial's bytes, as far as written (ahead of the record)
        self.bytes = 0
        self.resumed = 0  # lines done before this process began
        self.checked = True  # the input lines done match the record (`check_input`, `kept`)
        self.synced_at = 0.0
        # Lines finished ahead of those written, by their number in the part: (the sha256 of
        # the input line, the output text); `earlier`: those an earlier run finished, kept
        # until this run reaches them.
        self.ahead: dict[int, tuple[str, str]] = {}
        self.earlier: dict[int, tuple[str, str]] = {}

    def check(self, inputs: Inputs = ()) -> dict[str, Any] | None:
        """Refuse, before any work, a FILE.partial or record that is one of the command's
        `inputs` ((option, path) pairs) or that is not attn-mt's: a link, not a regular file,
        a hard link, a FILE.partial with no record beside it, a record that is damaged or
        another program's. The record found (None: none there)."""
        if not _record_there(self.data, self.record_path, self.target, inputs):
            return None
        return read_record(self.record_path, self.data, self.target)

    def open(self, settings: dict[str, Any], part: dict[str, Any], resume: bool) -> None:
        """Take FILE.partial (refused if another process writes it, or if it is not attn-mt's:
        `check`) and, with `resume`, what its record says was done with these `settings` over
        these input lines (`part`; the lines themselves are checked by `check_input`);
        otherwise start it empty."""
        found = self.check()
        there = os.path.lexists(self.data)
        if resume and found is not None and there:
            self._take(create=False)
            self._guarded(self._continue, found, settings, part)
            return
        done = (found or {}).get("done", {}).get("lines") if there else None
        if done:
            print(
                f"attn-mt: {named(self.data)}: its {done} translated line(s) are replaced "
                "(--resume continues them)",
                file=sys.stderr,
            )
        elif resume:
            print(
                f"attn-mt: --resume: no partial translation of {named(self.target)} "
                f"(no {named(self.data)}); translating from the start",
                file=sys.stderr,
            )
        fresh = {"format": FORMAT, "settings": settings, "part": part}
        fresh["done"] = {"lines": 0, "bytes": 0, "input_sha256": None}
        if there:  # ours, replaced: held first, so that a writer's record stays its own
            self._take(create=False)
            self._guarded(self._write_record, fresh)
            assert self.handle is not None
            self.handle.truncate(0)
        else:  # the record first: a FILE.partial never stands without one
            self._guarded(self._write_record, fresh)
            self._take(create=True)

    def _take(self, create: bool) -> None:
        """Open and lock FILE.partial: made exclusively (`create`) or the one `check` passed,
        never through a link."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.data, flags | (os.O_CREAT | os.O_EXCL if create else 0), 0o666)
        except FileExistsError:
            raise _busy(self.target, self.data) from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _foreign(self.data, self.target, "a symbolic link") from None
            raise UserError(
                f"--output {named(self.target)}: cannot write {named(self.data)} ({os_reason(err)})"
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            os.close(fd)
            raise _foreign(self.data, self.target, "not a regular file of its own")
        self.handle = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self.close()
            if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise _busy(self.target, self.data) from None

    def _guarded(self, step: Any, *args: Any) -> None:
        """`step(*args)` of `open`: FILE.partial let go if it fails, an OS error one line."""
        try:
            step(*args)
        except OSError as err:
            self.close()
            name = named(err.filename or self.record_path)
            raise UserError(f"{name}: cannot write ({os_reason(err)})") from None
        except BaseException:
            self.close()
            raise

    def _continue(
        self, found: dict[str, Any], settings: dict[str, Any], part: dict[str, Any]
    ) -> None:
        """Continue the record `found`: of other settings or other input lines it cannot be."""
        assert self.handle is not None
        what = difference(found["settings"], settings)
        if what is None and found["part"] != part:
            what = f"input lines {lines_words(found['part'])}, this run {lines_words(part)}"
        if what is not None:
            raise UserError(
                f"--resume: {named(self.data)} was made with {what}; give the same settings "
                "and input, or leave out --resume to start over"
            )
        done = found["done"]
        size = os.fstat(self.handle.fileno()).st_size
        if size < done["bytes"]:
            raise UserError(
                f"--resume: {named(self.data)} holds {size} bytes, fewer than the "
                f"{done['bytes']} its record counts; leave out --resume to start over"
            )
        self.record = found
        self.lines = self.resumed = done["lines"]
        self.bytes = done["bytes"]
        self.earlier = {e["line"]: (e["input_sha256"], e["text"]) for e in found.get("ahead", [])}
        self.checked = self.resumed == 0
        self.handle.truncate(self.bytes)
        self.handle.seek(self.bytes)
        ahead = f" and {len(self.earlier)} finished ahead of them" if self.earlier else ""
        print(
            f"attn-mt: continuing {named(self.data)}: {self.resumed} line(s) done{ahead} are "
            "kept; translating the others",
            file=sys.stderr,
        )

    def check_input(self, lines: Iterable[str]) -> None:
        """The input lines this part has done, read again: they must be those translated."""
        add_lines(self.digest, lines)
        if self.resumed and self.digest.hexdigest() != self.record["done"]["input_sha256"]:
            raise UserError(
                f"--resume: the input's lines differ from the {self.resumed} that "
                f"{named(self.data)} translated; give the same input, or leave out --resume "
                "to start over"
            )
        self.checked = True

    def kept(self, line: int, source: str) -> str | None:
        """The output an earlier run finished for the part's line `line` (from 0), whose input
        line is `source` (checked against the one translated); None if it did not."""
        entry = self.earlier.pop(line, None)
        if entry is None:
            return None
        if entry[0] != line_sha(source):
            self.checked = False  # the record stays as it was
            raise UserError(
                f"--resume: the input's line {line + 1} of this part differs from the one "
                f"{named(self.record_path)} kept a translation of; give the same input, or "
                "leave out --resume to start over"
            )
        self.ahead[line] = entry
        return entry[1]

    def finished(self, line: int, source: str, text: str) -> None:
        """The part's line `line` (from 0), input `source`, is translated as `text` ahead of
        the lines written: kept in the record at its next sync."""
        self.ahead[line] = (line_sha(source), text)
        if time.monotonic() - self.synced_at >= FLUSH_SECONDS:
            self.sync()

    def write(self, text: str, sources: list[str]) -> None:
        """Append the output `text` of the input lines `sources` (the next ones, in order); the
        record follows when FLUSH_SECONDS have passed since it last did."""
        assert self.handle is not None, "open() first"
        data = text.encode("utf-8")
        self.handle.write(data)
        add_lines(self.digest, sources)
        for line in range(self.lines, self.lines + len(sources)):
            self.ahead.pop(line, None)
        self.lines += len(sources)
        self.bytes += len(data)
        if time.monotonic() - self.synced_at >= FLUSH_SECONDS:
            self.sync()

    def sync(self) -> None:
        """Make the lines written so far durable, then say so in the record, with the lines
        finished ahead of them."""
        assert self.handle is not None and self.checked, "open() and check_input() first"
        self.handle.flush()
        os.fsync(self.handle.fileno())
        done = {"lines": self.lines, "bytes": self.bytes, "input_sha256": self.digest.hexdigest()}
        ahead = sorted((self.earlier | self.ahead).items())
        entries = [{"line": n, "input_sha256": sha, "text": text} for n, (sha, text) in ahead]
        self._write_record(self.record | {"done": done, "ahead": entries})
        self.synced_at = time.monotonic()

    @property
    def kept_lines(self) -> int:
        """The lines done that the record on disk keeps (in order, and ahead of those)."""
        return int(self.record.get("done", {}).get("lines", 0)) + len(self.record.get("ahead", []))

    def _write_record(self, record: dict[str, Any]) -> None:
        with atomic_write(self.record_path) as out:
            out.write(json.dumps(record, indent=1).encode("utf-8"))
        self.record = record

    def finish(self) -> None:
        """Every line is done: FILE.partial becomes FILE (renamed: FILE appears whole), the
        record goes."""
        self.sync()
        os.replace(self.data, self.target)  # first: a crash next leaves a record without its
        self.record_path.unlink()  # partial, which the next run replaces
        sync_folder(self.target.parent)
        self.close()

    def remove(self) -> None:
        """Take away FILE.partial (if still there) and the record, and let go of the lock."""
        self.data.unlink(missing_ok=True)
        self.record_path.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        """Let go of FILE.partial (kept, with its record, for --resume). A write that failed
        (a full disk) may leave bytes that cannot be flushed: the record never counts them."""
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None

    @contextlib.contextmanager
    def kept_on_failure(self) -> Iterator[None]:
        """However the block fails (Ctrl-C, SIGTERM, a user error, a full disk): the lines
        done are synced and kept; a part with none is removed."""
        try:
            yield
        except BaseException:
            if self.handle is None:  # finished, or never opened
                raise
            if not self.checked:  # the record is kept as it was
                self.close()
                raise
            with contextlib.suppress(OSError):
                self.sync()
            if self.kept_lines == 0:
                self.remove()
            else:
                self.close()
            raise


def _lstat(path: Path) -> os.stat_result | None:
    """`path`'s own status (a link's, not its target's); None if nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _foreign(path: Path, target: Path, why: str) -> UserError:
    """The refusal of a file in the place of attn-mt's own partial translation of `target`."""
    return UserError(
        f"{named(path)}: not attn-mt's partial translation of {named(target)} ({why}); "
        "attn-mt leaves it as it is: move it away, or give another --output"
    )


def _busy(target: Path, data: Path) -> UserError:
    """The refusal of a partial translation another process holds the lock of."""
    return UserError(
        f"--output {named(target)}: another attn-mt process is writing it "
        f"({named(data)} is locked); wait for it to end, or give another --output"
    )


def _record_there(data: Path, record: Path, target: Path, inputs: Inputs) -> bool:
    """Whether the record of `target`'s partial translation `data` is there; a `data` or
    `record` that is one of the command's `inputs`, or not attn-mt's, is refused."""
    for name, source in inputs:
        for path in (data, record):
            if source is not None and same_file(path, source):
                raise UserError(
                    f"--output {named(target)}: its partial translation {named(path)} is the "
                    f"{name} file being read; give another --output"
                )
    found = {path: _lstat(path) for path in (data, record)}
    for path, info in found.items():
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise _foreign(path, target, "a symbolic link")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise _foreign(path, target, "not a regular file")
        if info is not None and info.st_nlink > 1:
            raise _foreign(path, target, "a hard link of another file")
    if found[record] is None and found[data] is not None:
        raise _foreign(data, target, f"no record {named(record)} beside it")
    return found[record] is not None
