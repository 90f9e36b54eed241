"""HTML translated with its markup kept (LibreTranslate's `format: "html"`): every tag,
attribute, comment and declaration comes out as given and in the same order; only the text
changes.

The page is read with Python's own `html.parser`, which gives a best effort on any input
(unclosed or stray tags, a lone `<`), and cut into blocks at every tag that is not inline
(`<p>`, `<li>`, `<br>`, `<td>`, ...). A block's text, its inline tags (`<b>`, `<a>`, `<span>`,
...) taken out, is translated as one paragraph (a sentence spanning `<b>` is one sentence);
the inline tags are put back around the output words that the word alignment links to the
source words they held (less a word at an edge that a source word beside the element, left
without any output word by the alignment, must have given), in their own order. `<script>`,
`<style>`, `<pre>`, `<textarea>`, `<template>`, `<code>` and any element marked
`translate="no"` or `class="notranslate"` are kept whole, as are blocks of whitespace only.
Characters the page wrote as entities (`&amp;`, `&copy;`) are written so again in the
translation; `<`, `>` and `&` are always escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translation

# Tags inside a sentence: a block's text runs through them.
INLINE = frozenset(
    "a abbr b bdi bdo big cite code data del dfn em font i img ins kbd label mark q s samp "  # noqa: SIM905
    "small span strike strong sub sup time tt u var wbr".split()
)
# Elements kept whole, their text not translated.
KEPT = frozenset("script style pre textarea template code".split())  # noqa: SIM905
VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())  # noqa: SIM905
_WORD = re.compile(r"\S+")


@dataclass
class _Item:
    """A piece of a block other than its text: a tag, comment or element kept whole, at
    `offset` in the block's text."""

    raw: str
    kind: str  # "open", "close" or "other" (a void tag, a comment, an element kept whole)
    tag: str
    offset: int
    boundary: int = 0  # the source word it stands before (set when the block is closed)
    partner: int | None = None  # an open tag's close (an index in the block's items)


@dataclass
class _Block:
    """Text between block-level tags: its text as given and decoded, and its inline items."""

    text: str = ""
    items: list[_Item] = field(default_factory=list)
    entities: dict[str, str] = field(default_factory=dict)  # character -> how the page wrote it
    raw: list[str] = field(default_factory=list)  # the block as given, piece by piece

    def words(self) -> list[str]:
        return self.text.split()


class Page:
    """An HTML page cut into its untranslated parts and the blocks of text to translate."""

    def __init__(self, page: str):
        reader = _Reader(page)
        self.parts: list[str | _Block] = reader.parts  # in page order
        self.blocks = [p for p in self.parts if isinstance(p, _Block)]

    @property
    def texts(self) -> list[str]:
        """Each block's text to translate: its words, one space between."""
        return [" ".join(block.words()) for block in self.blocks]

    def render(self, translations: Sequence[Translation]) -> str:
        """The page with each block's text replaced by its translation (one for each of
        `texts`, with its word `alignment` to that text), inline tags placed by it."""
        found = iter(translations)
        out = []
        for part in self.parts:
            out.append(part if isinstance(part, str) else _render(part, next(found)))
        return "".join(out)


class _Reader(HTMLParser):
    """The page as untranslated strings and blocks; every piece is sliced from the page as
    given (the parser says where each event starts; it ends where the next one starts)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=False)
        self.page = page
        self.line_starts = [0, *(m.end() for m in re.finditer("\n", page))]
        self.events: list[tuple[int, str, str, bool]] = []  # (offset, kind, tag, kept)
        self.feed(page)
        self.close()
        self.parts: list[str | _Block] = []
        self._cut()

    def _event(self, kind: str, tag: str = "", kept: bool = False) -> None:
        line, column = self.getpos()
        self.events.append((self.line_starts[line - 1] + column, kind, tag, kept))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        kept = tag in KEPT or values.get("translate") == "no"
        kept |= "notranslate" in (values.get("class") or "").split()
        self._event("void" if tag in VOID else "open", tag, kept)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._event("void", tag)

    def handle_endtag(self, tag: str) -> None:
        self._event("close", tag)

    def handle_data(self, data: str) -> None:
        self._event("text")

    def handle_entityref(self, name: str) -> None:
        self._event("entity")

    def handle_charref(self, name: str) -> None:
        self._event("entity")

    def handle_comment(self, data: str) -> None:
        self._event("other")

    def handle_decl(self, decl: str) -> None:
        self._event("other")

    def handle_pi(self, data: str) -> None:
        self._event("other")

    def unknown_decl(self, data: str) -> None:
        self._event("other")

    def _cut(self) -> None:
        """Group the events into untranslated parts and blocks."""
        ends = [offset for offset, *_ in self.events[1:]] + [len(self.page)]
        block = _Block()
        index = 0
        while index < len(self.events):
            offset, kind, tag, kept = self.events[index]
            end = ends[index]
            if kept:  # the element whole, up to its own close tag
                index = _closing(self.events, index)
                end, kind = ends[index], "other"
            raw = self.page[offset:end]
            index += 1
            if kind in ("text", "entity"):
                decoded = html.unescape(raw) if kind == "entity" else raw
                if kind == "entity" and decoded != raw:
                    block.entities.setdefault(decoded, raw)  # as the page first wrote it
                block.text += decoded
                block.raw.append(raw)
            elif tag in INLINE or (kind == "other" and not tag):
                kind = kind if kind in ("open", "close") else "other"
                block.items.append(_Item(raw, kind, tag, len(block.text)))
                block.raw.append(raw)
            else:  # a block-level tag ends the block
                self._close(block)
                self.parts.append(raw)
                block = _Block()
        self._close(block)

    def _close(self, block: _Block) -> None:
        """Add a finished block: as given if it holds no word, else to translate."""
        if not block.words():
            if block.raw:
                self.parts.append("".join(block.raw))
            return
        opened: list[int] = []
        for number, item in enumerate(block.items):
            inside = 0 < item.offset < len(block.text) and not (
                block.text[item.offset - 1].isspace() or block.text[item.offset].isspace()
            )
            before = len(_WORD.findall(block.text, 0, item.offset))
            item.boundary = before - inside if item.kind == "open" else before
            if item.kind == "open":
                opened.append(number)
            elif item.kind == "close":
                match = [k for k in opened if block.items[k].tag == item.tag]
                if match:
                    opened = opened[: opened.index(match[-1])]
                    block.items[match[-1]].partner = number
        self.parts.append(block)


def _closing(events: list[tuple[int, str, str, bool]], start: int) -> int:
    """The index of the event that closes the element opened at `start` (the last event if
    it is never closed; the start itself for a void one)."""
    tag = events[start][2]
    if events[start][1] == "void":
        return start
    depth = 0
    for index in range(start, len(events)):
        _, kind, other, _ = events[index]
        if other == tag and kind in ("open", "close"):
            depth += 1 if kind == "open" else -1
            if depth == 0:
                return index
    return len(events) - 1


def _render(block: _Block, translation: Translation) -> str:
    """The block's translation with its inline items placed: each between the output words
    that the alignment gives it, in the block's own order."""
    words = translation.text.split()
    positions = _positions(block, len(words), translation.alignment or [])
    gaps: list[list[_Item]] = [[] for _ in range(len(words) + 1)]
    for item, position in zip(block.items, positions, strict=True):
        gaps[position].append(item)
    stripped = block.text.strip()
    lead = block.text[: block.text.index(stripped[0])]
    trail = block.text[len(lead) + len(stripped) :]
    out = [_escaped(lead, block.entities)]
    for number, items in enumerate(gaps):
        # A close tag ends the word before the space; the rest start the word after it, and
        # what stands alone (a comment, an image, code) keeps a space after it as it had.
        closing = next((k for k, item in enumerate(items) if item.kind != "close"), len(items))
        out += [item.raw for item in items[:closing]]
        out.append(" " if 0 < number < len(words) else "")
        for k, item in enumerate(items[closing:], start=closing):
            alone = item.kind == "other" and block.text[item.offset : item.offset + 1].isspace()
            followed = k + 1 < len(items) or number < len(words)
            out += [item.raw, " " if alone and followed else ""]
        if number < len(words):
            out.append(_escaped(words[number], block.entities))
    out.append(_escaped(trail, block.entities))
    return "".join(out)


def _positions(block: _Block, outputs: int, alignment: Sequence[tuple[int, int]]) -> list[int]:
    """Where each item of the block goes among `outputs` output words (0: before the first,
    `outputs`: after the last), never before an earlier item: an element around the output
    words aligned to its source words, anything else before the first output word that comes
    from a source word after it."""
    targets: dict[int, list[int]] = {}
    for source, target in alignment:
        targets.setdefault(source, []).append(target)

    def before(boundary: int) -> int:
        later = [t for s, ts in targets.items() if s >= boundary for t in ts]
        return min(later, default=outputs)

    sources = len(block.words())
    wanted: dict[int, int] = {}
    for number, item in enumerate(block.items):
        if number in wanted:  # a close tag, placed with its open tag
            continue
        wanted[number] = before(item.boundary)
        if item.partner is not None:
            end = block.items[item.partner].boundary
            covered = [t for s in range(item.boundary, end) for t in targets.get(s, [])]
            outside = (item.boundary - 1 if item.boundary > 0 else None, end)
            if covered:
                first, last = _span(covered, *outside, targets, sources)
                wanted[number], wanted[item.partner] = first, last + 1
            else:
                wanted[item.partner] = wanted[number]
    positions: list[int] = []
    opened_at: dict[int, int] = {}
    for number, item in enumerate(block.items):
        position = max(wanted[number], positions[-1] if positions else 0)
        if item.partner is not None:
            opened_at[item.partner] = position
        elif number in opened_at and position == opened_at[number] and position < outputs:
            position += 1  # an element that held words holds at least one
        positions.append(min(position, outputs))
    return positions


def _span(
    covered: list[int],
    before: int | None,
    after: int,
    targets: dict[int, list[int]],
    sources: int,
) -> tuple[int, int]:
    """The first and last output word an element wraps: those of `covered`, the output words
    aligned to the source words it wrapped, less a word at an edge that the source word just
    outside on that side (`before`; `after`, if not past the `sources` words) must have
    given: one the alignment linked to no output word at all (its argmax often links the "A"
    of "Ein kleiner Hund" to "kleiner", leaving "Ein" without a word)."""
    first, last = min(covered), max(covered)
    if last > first and before is not None and before not in targets:
        first = min(t for t in covered if t > first)
    if last > first and after < sources and after not in targets:
        last = max(t for t in covered if t < last)
    return first, last


def _escaped(text: str, entities: dict[str, str]) -> str:
    """`text` as HTML: a character the page wrote as an entity written so again, `<`, `>` and
    `&` escaped."""
    return "".join(entities.get(c) or html.escape(c, quote=False) for c in text)
