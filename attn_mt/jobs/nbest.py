"""The n-best formats of a translation job: written as `translate --nbest` writes them
(`format_entries`) and Marian's read back (`read_nbest`, by `distill`), side by side so the
two cannot drift apart. No torch here.

tsv: `score<TAB>text` lines, a blank line after each input line's block (with one entry per
line, the text alone). marian: `LINE ||| TEXT ||| SCORE` lines, LINE the input line counted
from 0 (Marian, Moses, fairseq). The score is the search's: the log-probability divided by
the length penalty. An entry's word alignment, if asked for, follows its text after ` ||| `.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.errors import DataError, named

if TYPE_CHECKING:  # imported inside the commands: `attn-mt --help` must not load torch
    from attn_mt.decode.translator import Translation


class NbestFormat(str, enum.Enum):
    """How `translate --nbest` writes its entries."""

    tsv = "tsv"  # score<TAB>text lines, a blank line after each input line
    marian = "marian"  # `id ||| text ||| score` lines (Marian, Moses, fairseq), id from 0


def format_entries(index: int, entries: list[Translation], nbest: int, style: NbestFormat) -> str:
    """The output lines of input line `index` (from 0): its n-best block in marian's format
    (asked for by name, so even of one entry), else its best text or its tsv n-best block; an
    entry's alignment, if any, follows its text after ` ||| `."""
    texts = [_with_alignment(e) for e in entries]
    if style is NbestFormat.marian:
        return "".join(
            f"{index} ||| {t} ||| {e.score:.4f}\n" for t, e in zip(texts, entries, strict=True)
        )
    if nbest == 1:
        return texts[0] + "\n"
    return "".join(f"{e.score:.4f}\t{t}\n" for t, e in zip(texts, entries, strict=True)) + "\n"


def _with_alignment(entry: Translation) -> str:
    """`text ||| 0-0 1-1 ...` when the entry has an alignment, else the text."""
    if entry.alignment is None:
        return entry.text
    return entry.text + " ||| " + " ".join(f"{i}-{j}" for i, j in entry.alignment)


def read_nbest(path: Path, nbest: int) -> Iterator[list[tuple[str, float]]]:
    """Each input line's entries (text, score) of a Marian n-best file, in input order."""
    for expected, (index, entries) in enumerate(groupby(_entries(path), key=lambda e: e[0])):
        if index != expected:
            raise DataError(f"{named(path)}: no translation of line {expected + 1}")
        found = [(text, score) for _, text, score in entries]
        if len(found) > nbest:
            raise DataError(f"{named(path)}: {len(found)} translations of line {index + 1}")
        yield found


def _entries(path: Path) -> Iterator[tuple[int, str, float]]:
    """The (line, text, score) entries of a Marian n-best file."""
    from attn_mt.data.text import iter_lines  # numpy: not when `translate` only writes

    for number, line in enumerate(iter_lines(path), start=1):
        try:
            index, rest = line.split(" ||| ", 1)
            text, score = rest.rsplit(" ||| ", 1)
            yield int(index), text, float(score)
        except ValueError:
            raise DataError(f"{named(path)}:{number}: not an n-best entry") from None
