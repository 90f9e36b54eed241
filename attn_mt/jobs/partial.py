"""A translation written as it goes, so that `translate --output FILE --resume` can continue it.

While `translate -o FILE` runs, FILE itself is untouched: the output lines done so far, in input
order, go to `FILE.partial` (beside the file a link names), and `FILE.partial.json` (the record,
rewritten atomically at most every FLUSH_SECONDS, after the lines it counts are synced) says
what made them: the checkpoints' sha256, the decode settings, which input lines the part covers,
and how far it got (lines, bytes, the sha256 of those input lines). When every line is done,
FILE.partial is renamed to FILE and the record removed: FILE is whole or not there, as any
output of attn-mt. A run killed at any moment (Ctrl-C, SIGTERM, SIGKILL) leaves the two files;
`--resume` checks the record against its own settings and input, cuts FILE.partial back to the
bytes the record counts (a line written after the last record is done again) and goes on.
FILE.partial is locked (flock) while a process writes it, so a second writer is refused.

Under torchrun each process writes a part of its own (`FILE.part2of4.partial`), which rank 0
joins in order once all are done (`jobs/split.py`). No torch here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from attn_mt.errors import UserError, named
from attn_mt.fileio import atomic_write, os_reason, sync_folder

FORMAT = "attn-mt partial translation 1"
FLUSH_SECONDS = 1.0  # the most a SIGKILL loses of lines already finished, beside those in flight


def line_digest() -> Any:
    """The running digest of the input lines a part has translated (`add_lines`)."""
    return hashlib.sha256()


def add_lines(digest: Any, lines: Iterable[str]) -> None:
    """Add input lines (as read: text without the line break) to `digest`."""
    for line in lines:
        digest.update(line.encode("utf-8", "surrogatepass") + b"\n")


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes (a checkpoint: which model made a partial translation)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"decode": {"beam": 5}} -> {"decode.beam": 5}: the settings as one level of names."""
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def difference(made: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """The first setting in which a partial translation's record differs from this run's,
    as words (None: the same settings)."""
    old, new = _flat(made), _flat(wanted)
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            if name.startswith("models"):
                return "other model checkpoints (their sha256 differ)"
            return f"{name} {json.dumps(old.get(name))}, this run {json.dumps(new.get(name))}"
    return None


class PartialOutput:
    """The part of a translation's output that a process writes: `FILE[.partNofM].partial`
    and its record, locked while this process holds them."""

    def __init__(self, target: Path, part_name: str = ""):
        self.target = target
        self.data = target.with_name(f"{target.name}{part_name}.partial")
        self.record_path = self.data.with_name(self.data.name + ".json")
        self.handle: BinaryIO | None = None
        self.record: dict[str, Any] = {}
        self.digest = line_digest()
        self.lines = 0  # lines done, FILE.partial's bytes, as far as written (ahead of the record)
        self.bytes = 0
        self.resumed = 0  # lines done before this process began
        self.checked = True  # the input lines done match the record (`check_input`)
        self.synced_at = 0.0

    def open(self, settings: dict[str, Any], part: dict[str, Any], resume: bool) -> None:
        """Take FILE.partial (refused if another process writes it) and, with `resume`, what
        its record says was done with these `settings` over these input lines (`part`; the
        lines themselves are checked by `check_input`); otherwise start it empty."""
        try:
            fd = os.open(self.data, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise UserError(f"{self._name()}: cannot write ({os_reason(err)})") from None
        self.handle = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self.close()
            if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise UserError(
                f"{self._name()}: another attn-mt translate is writing it ({named(self.data)} "
                "is locked); wait for it to end, or give another --output"
            ) from None
        try:
            self._start(settings, part, resume)
        except BaseException:
            self.close()
            raise

    def _start(self, settings: dict[str, Any], part: dict[str, Any], resume: bool) -> None:
        """`open`'s work once FILE.partial is held: continue its record, or start anew."""
        assert self.handle is not None
        found = self._read_record()
        if resume and found is not None:
            self._check(found, settings, part)
            self.record = found
            self.lines = self.resumed = found["done"]["lines"]
            self.bytes = found["done"]["bytes"]
            self.checked = self.resumed == 0
        else:
            done = (found or {}).get("done", {}).get("lines")
            if done:
                print(
                    f"attn-mt: {named(self.data)}: its {done} translated line(s) are replaced "
                    "(--resume continues them)",
                    file=sys.stderr,
                )
            elif resume:
                print(
                    f"attn-mt: --resume: no partial translation of {named(self.target)} "
                    f"(no {named(self.record_path)}); translating from the start",
                    file=sys.stderr,
                )
            self.record = {"format": FORMAT, "settings": settings, "part": part}
            self.record["done"] = {"lines": 0, "bytes": 0, "input_sha256": None}
            self._write_record()
        self.handle.truncate(self.bytes)
        self.handle.seek(self.bytes)

    def _name(self) -> str:
        return f"--output {named(self.target)}"

    def _read_record(self) -> dict[str, Any] | None:
        """The record beside FILE.partial, or None (none there: a fresh start)."""
        try:
            found = json.loads(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise UserError(
                f"--resume: {named(self.record_path)}: unreadable ({err}); leave out --resume "
                "to translate from the start"
            ) from None
        if not isinstance(found, dict) or found.get("format") != FORMAT:
            raise UserError(
                f"--resume: {named(self.record_path)}: not a record of attn-mt's; leave out "
                "--resume to translate from the start"
            )
        return found

    def _check(self, found: dict[str, Any], settings: dict[str, Any], part: dict[str, Any]) -> None:
        """A record of other settings or other input lines cannot be continued."""
        what = difference(found["settings"], settings)
        if what is None and found["part"] != part:
            what = f"input lines {_lines(found['part'])}, this run {_lines(part)}"
        if what is not None:
            raise UserError(
                f"--resume: {named(self.data)} was made with {what}; give the same settings "
                "and input, or leave out --resume to start over"
            )
        size = self.data.stat().st_size
        if size < found["done"]["bytes"]:
            raise UserError(
                f"--resume: {named(self.data)} holds {size} bytes, fewer than the "
                f"{found['done']['bytes']} its record counts; leave out --resume to start over"
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

    def write(self, text: str, sources: list[str]) -> None:
        """Append the output `text` of the input lines `sources` (the next ones, in order); the
        record follows when FLUSH_SECONDS have passed since it last did."""
        assert self.handle is not None, "open() first"
        data = text.encode("utf-8")
        self.handle.write(data)
        add_lines(self.digest, sources)
        self.lines += len(sources)
        self.bytes += len(data)
        if time.monotonic() - self.synced_at >= FLUSH_SECONDS:
            self.sync()

    def sync(self) -> None:
        """Make the lines written so far durable, then say so in the record."""
        assert self.handle is not None and self.checked, "open() and check_input() first"
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.record["done"] = {
            "lines": self.lines,
            "bytes": self.bytes,
            "input_sha256": self.digest.hexdigest(),
        }
        self._write_record()
        self.synced_at = time.monotonic()

    def _write_record(self) -> None:
        with atomic_write(self.record_path) as out:
            out.write(json.dumps(self.record, indent=1).encode("utf-8"))

    def finish(self) -> None:
        """Every line is done: FILE.partial becomes FILE (renamed: FILE appears whole), the
        record goes."""
        self.sync()
        self.record_path.unlink()  # first: a crash next leaves a partial without a record,
        os.replace(self.data, self.target)  # which a --resume starts over
        sync_folder(self.target.parent)
        self.close()

    def remove(self) -> None:
        """Take away FILE.partial (if still there) and the record, and let go of the lock."""
        self.data.unlink(missing_ok=True)
        self.record_path.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        """Let go of FILE.partial (kept, with its record, for --resume)."""
        if self.handle is not None:
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
            if self.lines == 0:
                self.remove()
            else:
                self.close()
            raise


def _lines(part: dict[str, Any]) -> str:
    """`part` as words: `3-10 (shard 2/4)` for its 1-based first and last line."""
    stop = part.get("stop")
    span = f"{part['start'] + 1}-{'end' if stop is None else stop}"
    return span + (f" (--shard {part['shard']})" if part.get("shard") else "")
