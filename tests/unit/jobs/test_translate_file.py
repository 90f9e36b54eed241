"""`attn_mt.translate_file`, `attn-mt translate` from Python: an interrupted translation into a
file, resumed, ends with the file of a straight run; the shards of a file concatenated are the
whole; a loaded Translator translates as its checkpoint does; the n-best written in Marian's
format reads back entry for entry."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers.busy import beside_competitors
from helpers.models import random_checkpoint
from helpers.toy import toy_pairs, write_lines

import attn_mt
from attn_mt.decode.translator import Translation, Translator
from attn_mt.errors import DataError, UserError
from attn_mt.jobs import io
from attn_mt.jobs.nbest import NbestFormat, format_entries, read_nbest
from attn_mt.jobs.translate import Interrupted

LINES = 10


@pytest.fixture(scope="module")
def checkpoint(toy_data, tmp_path_factory) -> Path:
    return random_checkpoint(tmp_path_factory.mktemp("jobs"), toy_data)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A file of LINES toy sentences, one of them blank."""
    lines = toy_pairs(LINES - 1, seed=5)[0]
    return write_lines(tmp_path / "in.txt", [*lines[:4], "", *lines[4:]])


def translated(checkpoint: Path, source: Path, out: Path, **options: Any) -> bytes:
    """The file `translate_file` writes."""
    attn_mt.translate_file(checkpoint, source, out, device="cpu", prepack=False, **options)
    return out.read_bytes()


def interrupt(checkpoint: Path, source: Path, out: Path, **options: Any) -> int:
    """A translation into `out` stopped by Ctrl-C after its first chunk (at most 4 lines):
    the lines it did."""
    translate = Translator.translate_nbest
    done: list[int] = []

    def stopped(self: Translator, lines: list[str], request: Any) -> Any:
        if done:
            raise KeyboardInterrupt
        done.append(len(lines))
        return translate(self, lines, request)

    with (
        mock.patch.object(io, "line_chunks", functools.partial(io.line_chunks, max_lines=4)),
        mock.patch.object(Translator, "translate_nbest", stopped),
        pytest.raises(Interrupted),
    ):
        translated(checkpoint, source, out, **options)
    return done[0]


def test_a_resumed_translation_equals_a_straight_run(
    checkpoint: Path, source: Path, tmp_path: Path
) -> None:
    """FILE is not there after Ctrl-C, the lines done are kept; `resume=True` translates only
    the others and ends with the straight run's file, nothing else left; other settings are
    refused."""
    straight = translated(checkpoint, source, tmp_path / "straight.txt", beam=2)
    out = tmp_path / "out.txt"
    done = interrupt(checkpoint, source, out, beam=2)
    assert not out.exists() and 0 < done < LINES
    translate = Translator.translate_nbest
    again: list[str] = []

    def counted(self: Translator, lines: list[str], request: Any) -> Any:
        again.extend(lines)
        return translate(self, lines, request)

    with mock.patch.object(Translator, "translate_nbest", counted):
        assert translated(checkpoint, source, out, beam=2, resume=True) == straight
    # Only the lines not done are searched again; the blank line is never searched (it has
    # no sentence), so it is the lines not done less the blank one.
    lines = source.read_text().splitlines()
    assert lines[done:].count("") == 1
    assert again == [line for line in lines[done:] if line] and len(again) == LINES - done - 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt", "straight.txt"]
    interrupt(checkpoint, source, tmp_path / "other.txt", beam=2)
    with pytest.raises(UserError, match="was made with request.beam 2, this run 3"):
        translated(checkpoint, source, tmp_path / "other.txt", beam=3, resume=True)


def test_shards_concatenated_are_the_whole(checkpoint: Path, source: Path, tmp_path: Path):
    """(I, N) or "I/N": contiguous parts, the n-best ids counted from the whole input's start."""
    marian = {"nbest": 2, "nbest_format": "marian"}
    whole = translated(checkpoint, source, tmp_path / "whole.txt", **marian)
    parts = [
        translated(checkpoint, source, tmp_path / f"part{i}.txt", shard=shard, **marian)
        for i, shard in enumerate([(1, 3), "2/3", (3, 3)])
    ]
    assert b"".join(parts) == whole and all(parts)
    assert parts[1].startswith(b"3 ||| ")  # the second of three parts of 10 lines: lines 3-5
    with pytest.raises(UserError, match="--shard 4/3: write it I/N"):
        translated(checkpoint, source, tmp_path / "none.txt", shard=(4, 3))


def test_a_loaded_translator_translates_as_its_checkpoint(
    checkpoint: Path, source: Path, tmp_path: Path
) -> None:
    """The same file from the path and from the Translator; loading options with a loaded
    Translator are refused (it is used as it is)."""
    translator = attn_mt.load(checkpoint, device="cpu", prepack=False)
    attn_mt.translate_file(translator, source, tmp_path / "loaded.txt", beam=2)
    from_path = translated(checkpoint, source, tmp_path / "path.txt", beam=2)
    assert (tmp_path / "loaded.txt").read_bytes() == from_path
    with pytest.raises(UserError, match="precision, decode: how `attn_mt.load` loads a model"):
        attn_mt.translate_file(
            translator, source, tmp_path / "x.txt", precision="bf16", decode={"beam": 3}
        )


def test_marian_nbest_reads_back_as_written(checkpoint: Path, source: Path, tmp_path: Path) -> None:
    """Written by `format_entries`, read by `read_nbest`: each line's entries in order, their
    scores to 4 places; a line without entries is refused, naming it."""
    entries = [
        [Translation("ein Hund", -1.23456, [5]), Translation("ein | Hund\t!", -2.5, [6])],
        [Translation("", -0.5, [])],
        [Translation("x ||| y", -3.0, [7]), Translation("ünïcode", -3.00004, [8])],
    ]
    nbest = tmp_path / "written.nbest"
    nbest.write_text(
        "".join(format_entries(i, e, 2, NbestFormat.marian) for i, e in enumerate(entries)),
        encoding="utf-8",
    )
    assert list(read_nbest(nbest, 2)) == [
        [("ein Hund", -1.2346), ("ein | Hund\t!", -2.5)],
        [("", -0.5)],
        [("x ||| y", -3.0), ("ünïcode", -3.0)],
    ]
    translated(checkpoint, source, tmp_path / "out.nbest", nbest=3, nbest_format="marian")
    read = list(read_nbest(tmp_path / "out.nbest", 3))
    best = attn_mt.load(checkpoint, device="cpu", prepack=False).translate_nbest(
        source.read_text().splitlines(), nbest=3
    )
    assert [[text for text, _ in line] for line in read] == [[e.text for e in b] for b in best]
    gap = tmp_path / "gap.nbest"
    gap.write_text("0 ||| a ||| -1.0\n2 ||| b ||| -1.0\n", encoding="utf-8")
    with pytest.raises(DataError, match="no translation of line 2"):
        list(read_nbest(gap, 1))


def test_a_translation_job_sizes_torchs_threads_to_the_free_cores(
    checkpoint: Path, source: Path, tmp_path: Path
) -> None:
    """Beside a competitor on two cores every batch searches on one thread (no barrier to spin
    at), the file is the one two threads write, and the thread count is given back after."""
    chunks = functools.partial(io.line_chunks, max_lines=4)
    with mock.patch.object(io, "line_chunks", chunks), beside_competitors(0) as idle:
        alone = translated(checkpoint, source, tmp_path / "alone.txt", beam=2)
    with mock.patch.object(io, "line_chunks", chunks), beside_competitors(1) as busy:
        beside = translated(checkpoint, source, tmp_path / "busy.txt", beam=2)
    assert beside == alone
    assert len(busy) >= 3 and set(busy) == {1} and set(idle) == {2}, (busy, idle)
