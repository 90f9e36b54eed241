"""Line input and output of a translation job: stdin or a file in, stdout or a file out
(through `fileio.atomic_write`), lines read in chunks as they arrive, split into their fields
(a source, a prefix, terms); the paths checked before any work.

Streams are streams, as a Unix tool treats them: `--input` may be a FIFO, /dev/stdin or a
process substitution (read once, as it comes; gzip data is decompressed), `--output` a device
such as /dev/null (written in place; only a regular file is replaced atomically), or a link
(the file it names is written).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import queue
import stat
import sys
import tempfile
import threading
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO, cast

from attn_mt.errors import UserError, named
from attn_mt.paths import Inputs

GZIP_MAGIC = b"\x1f\x8b"
# What reading damaged or odd input raises: OS errors (a folder, EIO), truncated or corrupt gzip
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error)


def check_input(path: Path | None) -> None:
    """Refuse, before any work, an --input that is missing, a folder or unreadable (stdin:
    closed)."""
    if path is None:
        if sys.stdin is None:  # the shell closed it (<&-)
            raise UserError("stdin: cannot read text (it is closed)")
    elif not path.exists():
        raise UserError(f"--input {named(path)}: file not found")
    elif path.is_dir():
        raise UserError(f"--input {named(path)}: is a folder; give a text file")
    elif not os.access(path, os.R_OK):
        raise UserError(f"--input {named(path)}: permission denied; the file is not readable")


def stdin_path() -> Path | None:
    """stdin as a path (/dev/fd/N), to compare with the outputs; None where it has no
    descriptor (closed, or replaced by a test harness)."""
    try:
        return Path(f"/dev/fd/{sys.stdin.fileno()}")
    except (AttributeError, OSError, ValueError):
        return None


def check_output(path: Path | None, inputs: Inputs = ()) -> None:
    """Refuse, before any work, an --output (or stdout) that cannot be written or that is one of
    the files the command reads, `inputs` ((option, path) pairs: `paths.check_output_file`)."""
    from attn_mt.paths import check_output_file, check_stdout, same_file

    if path is not None:
        check_output_file(path, "--output", inputs)
        return
    check_stdout("give --output FILE")
    try:
        stdout = f"/dev/fd/{sys.stdout.fileno()}"
    except (AttributeError, OSError, ValueError):  # replaced by a test harness
        return
    for name, source in inputs:
        if source is not None and same_file(stdout, source):
            raise UserError(
                f"stdout: is the {name} file being read ({named(source)}); write elsewhere"
            )


@contextlib.contextmanager
def input_file(path: Path | None, count: bool = False) -> Iterator[tuple[BinaryIO, int | None]]:
    """stdin or FILE as a binary stream (gzip data decompressed), with its number of lines
    when it is a regular file (a progress bar's total; stdin's only on a terminal), else None.
    With `count`, a stream (a pipe, a FIFO) is read whole into a temporary file first and its
    lines counted there: where a shard starts depends on the number of lines."""
    if path is None:
        check_input(path)
        reader = _stdin_reader()
        total = _lines_ahead(reader) if count or sys.stderr.isatty() else None
        if count and getattr(reader, "peek", lambda n: b"")(2)[:2] == GZIP_MAGIC:
            raise UserError("stdin: gzip-compressed data; decompress it (zcat FILE | ...)")
        if total is not None or not count:
            yield reader, total
            return
        with _spooled(reader, "stdin") as (spool, total):
            yield spool, total
        return
    with contextlib.ExitStack() as stack:
        try:
            raw = stack.enter_context(path.open("rb"))  # buffered: peek() reads ahead
            handle: BinaryIO = raw
            if raw.peek(2)[:2] == GZIP_MAGIC:
                handle = cast(BinaryIO, stack.enter_context(gzip.GzipFile(fileobj=raw)))
            total = None
            if path.is_file():
                total = sum(1 for _ in handle)
                handle.seek(0)
        except READ_ERRORS as err:
            reason = getattr(err, "strerror", None) or err
            raise UserError(f"--input {named(path)}: cannot read ({reason})") from None
        if total is None and count:
            handle, total = stack.enter_context(_spooled(handle, f"--input {named(path)}"))
        yield handle, total


@contextlib.contextmanager
def _spooled(stream: BinaryIO, name: str) -> Iterator[tuple[BinaryIO, int]]:
    """`stream` read whole into an unnamed temporary file (in TMPDIR), and its line count."""
    with tempfile.TemporaryFile() as spool:
        total = 0
        try:
            for line in stream:
                spool.write(line)
                total += 1
        except READ_ERRORS as err:
            reason = getattr(err, "strerror", None) or err
            raise UserError(f"{name}: cannot read ({reason})") from None
        spool.seek(0)
        yield cast(BinaryIO, spool), total


def _lines_ahead(reader: BinaryIO) -> int | None:
    """The lines left in stdin when it is a regular file (`< FILE`: the progress bar's total),
    counted and read again from where they start; None for a pipe or a terminal."""
    try:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            return None
        start = reader.tell()
        total = sum(1 for _ in reader)
        reader.seek(start)
    except (OSError, ValueError):  # not seekable after all
        return None
    return total


def _stdin_reader() -> BinaryIO:
    """A binary reader of stdin of our own, over a copy of its file descriptor.

    `line_chunks`'s reader thread may still be blocked in a read when the command ends (an
    error, Ctrl-C); were it reading `sys.stdin.buffer`, Python's exit would find that buffer's
    lock held and abort ("could not acquire lock for <stdin> at interpreter shutdown"). It is
    never closed: closing it would wait for that read; the process's exit closes the copy.
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test harness, no descriptor
        return sys.stdin.buffer
    return open(os.dup(fd), "rb")


@contextlib.contextmanager
def output_file(path: Path | None) -> Iterator[TextIO]:
    """stdout, or `path` written by `fileio.atomic_write`: a file appears only once every line
    is written; a device or FIFO is written in place; a link's file is written, the link kept."""
    from attn_mt.fileio import atomic_write, os_reason

    if path is None:
        yield sys.stdout
        return
    try:
        with atomic_write(path) as raw:
            handle = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            yield handle
            handle.flush()
            handle.detach()  # atomic_write closes the file itself
    except OSError as err:
        raise UserError(f"--output {named(path)}: cannot write ({os_reason(err)})") from None


def line_text(raw: bytes, number: int | None = None) -> str:
    """An input line as translated: UTF-8 without its line break, invalid bytes replaced (with
    a warning naming line `number`, if given)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        if number is not None:
            warnings.warn(f"line {number}: invalid UTF-8, replaced with U+FFFD", stacklevel=1)
    return text.rstrip("\r\n")


def line_chunks(
    stream: Iterable[bytes], name: str, max_lines: int = 1000, first_line: int = 1
) -> Iterator[list[str]]:
    """Lines of `stream` (the first numbered `first_line`) in chunks of what has arrived (so a
    pipeline flows), at most `max_lines`.

    A reader thread decodes UTF-8 (invalid bytes replaced, with one warning per line) into a
    bounded queue, so memory stays bounded on endless input.
    """
    lines: queue.Queue[str | UserError | None] = queue.Queue(maxsize=4 * max_lines)

    def reader() -> None:
        try:
            for number, raw in enumerate(stream, start=first_line):
                if number == 1 and raw.startswith(GZIP_MAGIC):
                    raise UserError(
                        f"{name}: gzip-compressed data; decompress it (zcat FILE | ...)"
                    )
                lines.put(line_text(raw, number))
        except READ_ERRORS as err:  # write-only, a folder, not a file, damaged gzip
            lines.put(
                UserError(f"{name}: cannot read text ({getattr(err, 'strerror', None) or err})")
            )
        except UserError as err:
            lines.put(err)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        first = lines.get()
        if first is None:
            return
        if isinstance(first, UserError):
            raise first
        chunk = [first]
        while len(chunk) < max_lines:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None or isinstance(line, UserError):
                yield chunk
                if line is None:
                    return
                raise line
            chunk.append(line)
        yield chunk


def line_fields(
    lines: list[str], prefix: bool, constraints: bool, first_line: int = 1
) -> tuple[list[str], list[str] | None, list[list[str]] | None]:
    """Split `source<TAB>[prefix<TAB>]term<TAB>...` lines (the first numbered `first_line`)
    into sources, prefixes and terms (None where the option is off; a line without the fields
    has none). A blank source with a prefix or terms is refused: it would translate to a
    silent blank line."""
    if not (prefix or constraints):
        return lines, None, None
    if any("\t" not in line and line.strip() for line in lines):
        # One message, whatever the line: Python's warning filter then shows it once a run.
        option, fields_wanted = (
            ("--constraints", "source<TAB>term<TAB>...")
            if constraints
            else ("--prefix", "source<TAB>prefix")
        )
        warnings.warn(
            f"{option}: a line without a TAB is a source alone (give {fields_wanted}); "
            "such lines are translated without it",
            stacklevel=1,
        )
    fields = [line.split("\t") for line in lines]
    for number, f in enumerate(fields, start=first_line):
        if not f[0].strip() and any(part.strip() for part in f[1:]):
            raise UserError(
                f"line {number}: the source is blank but has a prefix or terms; "
                "give a source, or no prefix and no terms"
            )
    sources = [f[0] for f in fields]
    tail = 2 if constraints else None  # without terms, a prefix holding a TAB is refused
    prefixes = ["\t".join(f[1:tail]) for f in fields] if prefix else None
    terms = [f[1 + prefix :] for f in fields] if constraints else None
    return sources, prefixes, terms


def avoid_list(path: Path | None) -> list[str]:
    """The words of an --avoid file, one a line, blank lines skipped."""
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(
            f"--avoid {path}: cannot read ({getattr(err, 'strerror', None) or err})"
        ) from None
    return [line.strip() for line in text.splitlines() if line.strip()]
