"""The line-break set is exactly what `str.splitlines` breaks at, and a message naming a file
with a line break in it stays one line."""

from __future__ import annotations

import sys

from attn_mt.errors import LINE_BREAKS, named, one_line


def test_line_breaks_are_what_splitlines_breaks_at() -> None:
    breaks = {c for c in map(chr, range(sys.maxunicode + 1)) if len(f"a{c}b".splitlines()) == 2}
    assert breaks == LINE_BREAKS


def test_every_line_break_is_quoted_in_a_message() -> None:
    for char in LINE_BREAKS:
        assert len(named(f"a{char}b").splitlines()) == 1
        assert len(one_line(f"file a{char}b: not found").splitlines()) == 1
