"""`FILE.partial` is attn-mt's own: a file of someone else's in its place (a link, a FIFO, a
hard link, a file with no record) is refused and left as it is; a damaged record is one line
saying to delete it; a name too long for the suffixes is shortened, not refused; the lines
finished ahead of those written are kept in the record and given back, checked, to the next
run; an interrupted job keeps every line it finished and its resume translates only the
others."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers.models import random_checkpoint
from helpers.toy import toy_pairs, write_lines

import attn_mt
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.fileio import name_max
from attn_mt.jobs.partial import PartialOutput, partial_paths
from attn_mt.jobs.record import FORMAT
from attn_mt.jobs.translate import Interrupted

PART = {"start": 0, "stop": None, "shard": None, "rank": 0, "ranks": 1}


def record(**changes: Any) -> dict[str, Any]:
    """A sound record of one line done, with `changes` made to it."""
    sound = {
        "format": FORMAT,
        "settings": {"beam": 2},
        "part": dict(PART),
        "done": {"lines": 1, "bytes": 3, "input_sha256": None},
    }
    return sound | changes


def partial_beside(tmp_path: Path, found: Any, data: bytes = b"qb\n") -> PartialOutput:
    """out.txt's partial translation: FILE.partial holding `data`, and `found` as its record
    (written as JSON; a str as it is)."""
    partial = PartialOutput(tmp_path / "out.txt")
    partial.data.write_bytes(data)
    text = found if isinstance(found, str) else json.dumps(found)
    partial.record_path.write_text(text, encoding="utf-8")
    return partial


@pytest.mark.parametrize(
    ("found", "words"),
    [
        (record(done=None), '"done" is not a mapping'),
        (record(done={"lines": "3", "bytes": 3, "input_sha256": None}), '"done.lines" is "3"'),
        (record(done={"lines": 1, "bytes": -1, "input_sha256": None}), '"done.bytes" is -1'),
        (record(done={"lines": True, "bytes": 3, "input_sha256": None}), '"done.lines" is true'),
        (record(settings=None), '"settings" is not a mapping'),
        (record(part={"stop": 2}), '"part.start" is not a line number'),
        (record(ahead=[{"line": 0, "text": "x"}]), '"ahead" holds'),
        ([1, 2], "not a record of attn-mt's"),
        ({"format": "another program's"}, "not a record of attn-mt's"),
        ('{"format": ', "unreadable"),
    ],
    ids=[
        "no-done",
        "string",
        "negative",
        "bool",
        "settings-null",
        "part",
        "ahead",
        "list",
        "other-format",
        "not-json",
    ],  # fmt: skip
)
@pytest.mark.parametrize("resume", [False, True])
def test_a_damaged_record_is_one_line_saying_to_delete_it(
    tmp_path: Path, found: Any, words: str, resume: bool
) -> None:
    """Not KeyError/TypeError/ValueError: the record and its partial named, the way out is to
    delete them (never "leave out --resume", which a run without it could not do); both files
    left as they were."""
    partial = partial_beside(tmp_path, found)
    before = partial.record_path.read_bytes()
    with pytest.raises(UserError) as refused:
        partial.open({"beam": 2}, PART, resume)
    message = str(refused.value)
    assert message.startswith(f"{partial.record_path}: ") and words in message, message
    assert f"delete it and {partial.data}" in message and "leave out" not in message, message
    assert partial.record_path.read_bytes() == before and partial.data.read_bytes() == b"qb\n"


def place(tmp_path: Path, kind: str) -> Path:
    """Something not attn-mt's at out.txt.partial (and ./precious.txt, which it must not touch)."""
    precious = write_lines(tmp_path / "precious.txt", ["mine"])
    data = tmp_path / "out.txt.partial"
    if kind == "link":
        data.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(data)
    elif kind == "hard-link":
        os.link(precious, data)
        data.with_name("out.txt.partial.json").write_text(json.dumps(record()))
    elif kind == "no-record":
        data.write_text("my own notes\n")
    elif kind == "record-link":
        data.write_text("qb\n")
        data.with_name("out.txt.partial.json").symlink_to(precious)
    return precious


def listing(folder: Path) -> dict[str, Any]:
    """Each entry's mode and, for a file, its bytes (a FIFO's never read)."""
    return {p.name: (p.lstat().st_mode, p.is_file() and p.read_bytes()) for p in folder.iterdir()}


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("link", "a symbolic link"),
        ("fifo", "not a regular file"),
        ("hard-link", "a hard link of another file"),
        ("no-record", "no record"),
        ("record-link", "a symbolic link"),
    ],
)
@pytest.mark.parametrize("resume", [False, True])
def test_a_file_not_attn_mts_in_the_partials_place_is_refused(
    tmp_path: Path, kind: str, why: str, resume: bool
) -> None:
    """Refused before it is opened or written; nothing in the folder changes."""
    precious = place(tmp_path, kind)
    before = {
        p.name: (p.lstat().st_mode, p.is_file() and p.read_bytes()) for p in tmp_path.iterdir()
    }
    partial = PartialOutput(tmp_path / "out.txt")
    with pytest.raises(UserError, match=f"not attn-mt's partial translation .*{why}"):
        partial.open({"beam": 2}, PART, resume)
    after = {
        p.name: (p.lstat().st_mode, p.is_file() and p.read_bytes()) for p in tmp_path.iterdir()
    }
    assert after == before and precious.read_text() == "mine\n"


def test_the_partial_is_checked_against_the_inputs(tmp_path: Path) -> None:
    """`--input out.txt.partial --output out.txt` would wipe the input before reading it."""
    source = write_lines(tmp_path / "out.txt.partial", ["qb"])
    with pytest.raises(UserError, match="its partial translation .* is the --input file"):
        PartialOutput(tmp_path / "out.txt").check([("--input", source)])
    assert source.read_text() == "qb\n"


@pytest.mark.parametrize("length", [200, 240, 250, 255])
def test_a_long_output_name_takes_a_shortened_partial_name(tmp_path: Path, length: int) -> None:
    """Every name the file system takes gets a partial and a record whose names it takes too
    (their temp files' as well): written, read back, finished."""
    out = tmp_path / ("o" * length)
    data, record_path = partial_paths(out)
    assert len(record_path.name.encode()) <= name_max(tmp_path)
    assert data.name == f"{out.name}.partial" or "~" in data.name
    partial = PartialOutput(out)
    partial.open({"beam": 2}, PART, resume=False)
    partial.check_input([])
    partial.write("A\n", ["qb"])
    partial.finish()
    assert out.read_text() == "A\n" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_lines_finished_ahead_are_kept_and_given_back(tmp_path: Path) -> None:
    """Line 0 still searching, lines 2 and 1 done: the record keeps both; the next run gets
    them back for the same input lines and refuses them for other ones."""
    partial = PartialOutput(tmp_path / "out.txt")
    partial.open({"beam": 2}, PART, resume=False)
    partial.check_input([])
    partial.finished(2, "qd", "D\n")
    partial.finished(1, "qc", "C\n")
    partial.sync()
    partial.close()
    kept = json.loads(partial.record_path.read_text())
    assert kept["done"]["lines"] == 0 and [e["line"] for e in kept["ahead"]] == [1, 2]
    again = PartialOutput(tmp_path / "out.txt")
    again.open({"beam": 2}, PART, resume=True)
    again.check_input([])
    assert again.kept(0, "qb") is None and again.kept(1, "qc") == "C\n"
    with pytest.raises(UserError, match="line 3 of this part differs"):
        again.kept(2, "qz")
    assert not again.checked  # the record stays as it was


# ---------------------------------------------------------------------------------------------
# An interrupted job keeps every line it finished


@pytest.fixture(scope="module")
def checkpoint(toy_data, tmp_path_factory) -> Path:
    return random_checkpoint(tmp_path_factory.mktemp("partial"), toy_data)


def test_ctrl_c_keeps_every_finished_line_and_resume_translates_only_the_others(
    checkpoint: Path, tmp_path: Path
) -> None:
    """A chunk's lines are searched shortest first, one a batch here: Ctrl-C after 5 lines
    finish leaves few of them in input order, the others ahead; all 5 are kept, the resume
    searches only the other lines and ends with the straight run's file."""
    lines = toy_pairs(12, seed=7)[0]
    source = write_lines(tmp_path / "in.txt", lines)
    options = {"device": "cpu", "prepack": False, "decode": {"batch_tokens": 1}}
    attn_mt.translate_file(checkpoint, source, tmp_path / "straight.txt", **options)
    translate = Translator.translate_nbest
    finished: list[int] = []

    def interrupted(self: Translator, sources: list[str], request: Any) -> Any:
        def on_line(row: int, entries: list[Any]) -> None:
            request.on_line(row, entries)
            finished.append(row)
            if len(finished) == 5:
                raise KeyboardInterrupt

        return translate(self, sources, dataclasses.replace(request, on_line=on_line))

    out = tmp_path / "out.txt"
    with (
        mock.patch.object(Translator, "translate_nbest", interrupted),
        pytest.raises(Interrupted),
    ):
        attn_mt.translate_file(checkpoint, source, out, **options)
    kept = json.loads(out.with_name("out.txt.partial.json").read_text())
    assert kept["done"]["lines"] < 5 and kept["ahead"]  # out of order: some finished ahead
    assert kept["done"]["lines"] + len(kept["ahead"]) == 5
    again: list[str] = []

    def counted(self: Translator, sources: list[str], request: Any) -> Any:
        again.extend(source for source in sources if source)  # kept lines are passed blank
        return translate(self, sources, request)

    with mock.patch.object(Translator, "translate_nbest", counted):
        attn_mt.translate_file(checkpoint, source, out, resume=True, **options)
    assert len(again) == len(lines) - 5
    assert out.read_bytes() == (tmp_path / "straight.txt").read_bytes()


def test_resume_of_a_finished_output_does_no_work(checkpoint: Path, tmp_path: Path) -> None:
    """FILE whole, no partial: it is said to be complete; nothing is translated or written."""
    source = write_lines(tmp_path / "in.txt", toy_pairs(3, seed=1)[0])
    out = tmp_path / "out.txt"
    attn_mt.translate_file(checkpoint, source, out, device="cpu", prepack=False)
    before = out.read_bytes()
    with mock.patch.object(Translator, "translate_nbest", side_effect=AssertionError("work")):
        attn_mt.translate_file(checkpoint, source, out, resume=True)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
