"""One translation job's work: the input lines this process takes (`split.lines_of`: all, a
--shard's, a torchrun rank's share), read in chunks as they arrive, translated, and written in
input order as they finish (a chunk's lines are searched shortest first, so each batch writes
the run of lines now done from the first one not yet written), to stdout, a stream or device in
place, or an --output file through its resumable partial (`jobs/partial.py`), which also keeps
the lines done ahead of the first one not yet written, so that an interruption loses none and a
resume searches none of them again. Under torchrun
each process writes its part and rank 0 joins them in order (`split.join_parts`). How far it
is, the job tells the `Progress` it is given (`jobs/pace.py`). Before each batch torch's threads
are sized to the cores other processes leave free (`cpuenv.ThreadSizer`): a long translation
started on an idle machine would otherwise spin at every barrier once other work comes.
"""

from __future__ import annotations

import contextlib
import io as text_io
import os
import sys
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import count, islice, takewhile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TextIO

from attn_mt.cpuenv import ThreadSizer, sized_torch_threads
from attn_mt.errors import UserError, named
from attn_mt.fileio import atomic_write, os_reason, sigterm_unwinds
from attn_mt.jobs import io, split
from attn_mt.jobs.nbest import NbestFormat, format_entries
from attn_mt.jobs.pace import Pace, Progress, unseen, weight
from attn_mt.jobs.partial import PartialOutput
from attn_mt.world import World

if TYPE_CHECKING:
    from attn_mt.decode.request import Request
    from attn_mt.decode.translator import Translation, Translator


@dataclass(frozen=True)
class LineFields:
    """How input lines are read (a prefix, terms after TABs) and output lines written."""

    nbest: int
    nbest_format: NbestFormat
    prefix: bool
    constraints: bool


@dataclass
class Job:
    """What one translation job reads and writes, and which of torchrun's processes it is;
    `settings` (what a partial translation's record keeps) where --output is a regular file."""

    input: Path | None
    output: Path | None
    shard: tuple[int, int] | None
    resume: bool
    world: World
    settings: dict[str, Any] | None = None
    again: str = "the same command with --resume"  # what continues an interrupted --output
    complete: bool = False  # `resume` of an --output that is whole: nothing to do


class Sink(Protocol):
    """Where translated lines go, in input order: `lines` counts the input lines written. A
    line finished before those ahead of it is told to `finished` (which may keep it, so that
    an interruption loses no finished line), and `kept` gives what an earlier run finished of
    a line (None: translate it). Lines are numbered from 0 among the sink's."""

    lines: int

    def write(self, text: str, sources: list[str]) -> None: ...

    def finished(self, line: int, source: str, text: str) -> None: ...

    def kept(self, line: int, source: str) -> str | None: ...


class StreamSink:
    """Output lines to a text stream, flushed as they come (stdout, a device, a FIFO)."""

    def __init__(self, out: TextIO):
        self.out = out
        self.lines = 0

    def write(self, text: str, sources: list[str]) -> None:
        self.out.write(text)
        self.out.flush()
        self.lines += len(sources)

    def finished(self, line: int, source: str, text: str) -> None:
        """A stream keeps nothing ahead: lines are written in order, or not at all."""

    def kept(self, line: int, source: str) -> str | None:
        return None


def run_job(
    translator: Translator,
    request: Request,
    fields: LineFields,
    job: Job,
    progress: Progress = unseen,
) -> None:
    """Translate the job's lines of its input into its output (see the module's docstring),
    its pace shown by `progress` (on rank 0)."""
    counted = job.shard is not None or job.world.distributed
    with io.input_file(job.input, counted) as (stream, total):
        lines = split.lines_of(total if counted else None, job.shard, job.world)
        reader = _read(stream)
        deque(islice(reader, lines.start), maxlen=0)  # the lines before this process's
        work = _Work(translator, request, fields, job, lines, reader, total, progress)
        if job.settings is not None:
            _to_file(work)
        else:
            _to_stream(work)


def _read(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's lines, read only when asked for: a read error is raised where lines are
    read (`io.line_chunks` makes it one line), not when the job starts."""
    yield from stream


@dataclass
class _Work:
    """A run's translation, set up: what `_translate` needs besides where it writes."""

    translator: Translator
    request: Request
    fields: LineFields
    job: Job
    lines: split.Lines
    reader: Iterator[bytes]
    total: int | None  # the input's lines, if counted
    progress: Progress
    sizer: ThreadSizer | None = None  # torch's threads sized to the free cores, each batch

    def translate(self, sink: Sink) -> None:
        """The process's lines not yet in `sink`, translated into it."""
        every = self.lines.count if self.lines.count is not None else self.total
        todo = None if every is None else every - sink.lines
        source = self.reader if todo is None else islice(self.reader, todo)
        name = named(self.job.input) if self.job.input else "stdin"
        first = self.lines.start + sink.lines + 1
        shown = every if self.job.world.is_main else None
        with self.progress(shown) as pace, sized_torch_threads() as self.sizer:
            pace.resumed(sink.lines)
            for chunk in io.line_chunks(source, name, first_line=first):
                pace.read(chunk)
                self.chunk(chunk, self.lines.start + sink.lines, sink, pace)

    def chunk(self, chunk: list[str], index: int, sink: Sink, pace: Pace) -> None:
        """Translate `chunk`, whose first line is input line `index` (from 0), writing after
        each batch the lines done in order; a line an earlier run finished (`Sink.kept`) is
        taken as it is (searched as a blank line: at once, the other lines' numbers kept)."""
        fields = self.fields
        first = sink.lines  # the chunk's first line among the sink's
        sources, prefixes, terms = io.line_fields(
            chunk, fields.prefix, fields.constraints, index + 1
        )
        done: dict[int, str] = {}  # row -> its output text
        for row, line in enumerate(chunk):
            if (text := sink.kept(first + row, line)) is not None:
                done[row] = text
                sources[row] = ""
                if prefixes is not None:
                    prefixes[row] = ""
                if terms is not None:
                    terms[row] = []
        earlier = set(done)
        written = 0
        if self.sizer is not None:
            self.sizer.adjust()

        def finished(row: int, entries: list[Translation]) -> None:
            if row in earlier:
                pace.resumed(1, weight(chunk[row]))
                return
            done[row] = format_entries(index + row, entries, fields.nbest, fields.nbest_format)
            sink.finished(first + row, chunk[row], done[row])
            pace.finished(1, weight(chunk[row]))

        def write_ready(_: int = 0) -> None:
            nonlocal written
            if self.sizer is not None:  # before the next batch
                self.sizer.adjust()
            ready = list(takewhile(done.__contains__, count(written)))
            if ready:
                text = "".join(done.pop(row) for row in ready)
                sink.write(text, chunk[written : written + len(ready)])
                written += len(ready)

        self.translator.translate_nbest(
            sources,
            replace(
                self.request,
                first_line=index + 1,
                on_batch=write_ready,
                on_line=finished,
                constraints=terms,
                prefixes=prefixes,
            ),
        )
        write_ready()


def _to_file(work: _Work) -> None:
    """Translate into --output FILE through this process's partial (resumable), then FILE."""
    from attn_mt import distributed

    job = work.job
    assert job.output is not None and job.settings is not None
    partial = PartialOutput(Path(os.path.realpath(job.output)), work.lines.part_name)
    partial.open(job.settings, work.lines.record(), job.resume)
    try:
        with sigterm_unwinds(), partial.kept_on_failure():
            partial.check_input(io.line_text(raw) for raw in islice(work.reader, partial.resumed))
            work.translate(partial)
            if not job.world.distributed:
                partial.finish()
                return
            partial.sync()
            with open(partial.data, "rb") as part, _joined(job.world, job.output) as out:
                split.join_parts(part, out, job.world)
            distributed.barrier(job.world)  # the output is whole before any part is removed
            partial.remove()
    except OSError as err:  # a full disk, a file-size limit: one line, the lines done kept
        name = named(err.filename or partial.data)
        raise UserError(f"{name}: cannot write ({os_reason(err)}); {_kept(job, partial)}") from None
    except BaseException as err:
        _say_kept(err, job, partial)
        raise


def _kept(job: Job, partial: PartialOutput) -> str:
    """What a failed or interrupted run leaves of --output's translation, in words."""
    output = job.output
    assert output is not None
    if not partial.checked or not partial.kept_lines:
        return f"--output {named(output)} not written"
    return (
        f"--output {named(output)} not written yet; {partial.kept_lines} line(s) done are "
        f"kept in {named(partial.data)}: {job.again} continues them"
    )


def _say_kept(err: BaseException, job: Job, partial: PartialOutput) -> None:
    """One line on what a failed or interrupted run leaves of --output's translation."""
    if isinstance(err, KeyboardInterrupt):
        print(f"attn-mt: interrupted; {_kept(job, partial)}", file=sys.stderr)
    elif partial.checked and partial.kept_lines:
        print(f"attn-mt: {_kept(job, partial)}", file=sys.stderr)


@contextlib.contextmanager
def _joined(world: World, output: Path | None) -> Iterator[IO[bytes] | None]:
    """Rank 0's handle on the output the parts are joined into (stdout, or `output` through
    `atomic_write`); None on the other ranks."""
    if not world.is_main:
        yield None
    elif output is None:
        sys.stdout.flush()
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
    else:
        with atomic_write(output) as out:
            yield out


def _to_stream(work: _Work) -> None:
    """Translate to stdout, or a stream or device written in place (under torchrun: each
    process's part to a temporary file, which rank 0 joins)."""
    from attn_mt import distributed

    job = work.job
    if job.world.distributed:
        with tempfile.TemporaryFile() as part:
            text = text_io.TextIOWrapper(part, encoding="utf-8", newline="")
            work.translate(StreamSink(text))
            text.detach()
            with _joined(job.world, job.output) as out:
                split.join_parts(part, out, job.world)
        distributed.barrier(job.world)
        return
    sink = None
    try:
        with io.output_file(job.output) as out:
            sink = StreamSink(out)
            work.translate(sink)
    except KeyboardInterrupt:  # the lines finished in order are written
        written = sink.lines if sink else 0
        print(f"attn-mt: interrupted; the first {written} line(s) are written", file=sys.stderr)
        raise
