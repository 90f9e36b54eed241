"""Reading parallel text and cleaning it.

Reading is strict and loud: a missing file, a line-count mismatch or invalid UTF-8 is a
`DataError` naming the file (and line). Files are plain text or gzip, read as a stream.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from attn_mt.data.filters import rule_names
from attn_mt.errors import DataError, named
from attn_mt.fileio import os_reason


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (plain or gzip), without line endings (LF or CRLF)."""
    return list(iter_lines(path))


def check_text_file(path: Path) -> None:
    """A DataError unless `path` names a file or a stream (a FIFO such as bash's `<(...)`, a
    device such as /dev/stdin): not a folder, not missing."""
    if path.is_dir():
        raise DataError(f"{named(path)}: is a folder, not a text file")
    if not path.exists():
        raise DataError(f"{named(path)}: file not found")


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (plain or gzip), read as a stream: memory stays flat."""
    path = Path(path)
    check_text_file(path)
    number = 0
    try:
        # Opened once and peeked at: a stream (a FIFO) can be read only once.
        with open(path, "rb") as raw_handle:
            gzipped = raw_handle.peek(2)[:2] == b"\x1f\x8b"
            handle = gzip.GzipFile(fileobj=raw_handle) if gzipped else raw_handle
            for number, raw in enumerate(handle, start=1):  # noqa: B007 (used after the loop)
                yield raw.removesuffix(b"\n").decode("utf-8").removesuffix("\r")
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:  # before OSError: BadGzipFile is one
        raise DataError(
            f"{path}: cannot read, damaged gzip data ({err}); download or compress it again"
        ) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({os_reason(err)})") from None
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}:{number}: invalid UTF-8 at byte {err.start}; convert the file to UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)"
        ) from None


def iter_parallel(src: str | Path, tgt: str | Path) -> Iterator[tuple[str, str]]:
    """(source, target) line pairs of a parallel corpus, streamed; the counts must match."""
    src_lines, tgt_lines = iter_lines(src), iter_lines(tgt)
    count = 0
    for count, pair in enumerate(itertools.zip_longest(src_lines, tgt_lines), start=1):
        if None in pair:
            extra_src = sum(1 for _ in src_lines) + (pair[0] is not None)
            extra_tgt = sum(1 for _ in tgt_lines) + (pair[1] is not None)
            _mismatch(src, count - 1 + extra_src, tgt, count - 1 + extra_tgt)
        yield pair


def _mismatch(src: str | Path, src_count: int, tgt: str | Path, tgt_count: int) -> NoReturn:
    raise DataError(
        f"{src} has {src_count} lines but {tgt} has {tgt_count}; "
        "a parallel corpus needs one target line per source line"
    )


def read_parallel(src: str | Path, tgt: str | Path) -> tuple[list[str], list[str]]:
    """Source and target lines of a parallel corpus; their counts must match."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        _mismatch(src, len(src_lines), tgt, len(tgt_lines))
    return src_lines, tgt_lines


# ---------------------------------------------------------------------------------------------
# Cleaning


@dataclass
class FilterStats:
    """What cleaning removed from a training corpus: the pairs kept, and the pairs dropped by
    each rule (`rule_names`: data.filters' rules on the text, then data.max_len and
    data.max_len_ratio on the tokens), each pair counted under the first rule that dropped it."""

    kept: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # only rules that did

    @classmethod
    def read(cls, record: dict[str, Any]) -> FilterStats:
        """The counts of a record that holds them (a prepared manifest's corpus entry)."""
        return cls(record["kept"], dict(record["dropped"]))

    @property
    def pairs(self) -> int:
        """Every pair read: kept or dropped."""
        return self.kept + sum(self.dropped.values())

    def drop(self, rule: str, count: int = 1) -> None:
        """Count `count` pairs dropped by `rule`."""
        if count:
            self.dropped[rule] = self.dropped.get(rule, 0) + count
            self.dropped = {r: self.dropped[r] for r in rule_names() if r in self.dropped}

    def add(self, other: FilterStats) -> None:
        """Count `other`'s pairs too."""
        self.kept += other.kept
        for rule, count in other.dropped.items():
            self.drop(rule, count)

    def describe(self) -> str:
        """What was dropped: 'dropped 3 dedup, 12 langid' (by rule, in order) or 'none dropped'."""
        return describe_dropped(self.dropped)


def describe_dropped(dropped: dict[str, int]) -> str:
    """'dropped 3 dedup, 12 langid' (the rules with a count) or 'none dropped'."""
    counts = ", ".join(f"{count:,} {rule}" for rule, count in dropped.items() if count)
    return f"dropped {counts}" if counts else "none dropped"


def clean_pairs(
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    max_len: int,
    max_ratio: float = 0,
) -> tuple[list[int], FilterStats]:
    """Indices of pairs to train on: drop empty pairs, pairs over `max_len` tokens, and (when
    `max_ratio` > 0) pairs whose longer side has more than `max_ratio` times the tokens."""
    keep, stats = [], FilterStats()
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if not s or not t:
            stats.drop("empty")
        elif len(s) > max_len or len(t) > max_len:
            stats.drop("max_len")
        elif max_ratio and max(len(s), len(t)) > max_ratio * min(len(s), len(t)):
            stats.drop("max_len_ratio")
        else:
            keep.append(i)
    stats.kept = len(keep)
    return keep, stats
