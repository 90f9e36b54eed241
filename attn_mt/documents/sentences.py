"""A paragraph's sentences: a paragraph is split into sentences (sentencex, a rule-based
segmenter with each language's abbreviations), each a `Segment` translated alone.

A line break always ends a sentence (a title, a list item); a boundary the segmenter finds
inside a word ("Hello.World") is none. A sentence longer than the model reads
(decode.max_input_len source pieces, less a language tag) is cut in pieces between words (after
a comma, semicolon or colon in the piece's second half, where there is one), a word longer than
that between characters: never cut silently. A line with terms or a prefix stays whole
(`steered_paragraph`), as the steering applies to the whole line. `documents/paragraphs.py`
translates the segments and joins them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attn_mt.errors import LINE_BREAKS, UserError

_LINES = re.compile(f"[^{re.escape(''.join(sorted(LINE_BREAKS)))}]+")  # text between breaks
BREAKS = re.compile(f"[{re.escape(''.join(sorted(LINE_BREAKS)))}]+")
WORD = re.compile(r"\S+")
CLAUSE_ENDS = ",;:"  # a long sentence is cut after one of these where it can

Encode = Callable[[Sequence[str]], list[list[int]]]  # texts -> their source ids (Translator.encode)


@dataclass(frozen=True)
class Segment:
    """A sentence of a paragraph, or a piece of a long one: translated alone."""

    start: int  # its offset in the paragraph
    end: int  # the offset after its last character (whitespace around it left out)
    part: bool = False  # a piece of a sentence longer than the model reads, cut between words


@dataclass(frozen=True)
class Paragraph:
    """A paragraph and the segments it is translated in, in order."""

    text: str
    segments: list[Segment]

    def gap(self, index: int) -> str:
        """The paragraph's own text before segment `index` (`len(segments)`: after the last)."""
        start = self.segments[index - 1].end if index else 0
        end = self.segments[index].start if index < len(self.segments) else len(self.text)
        return self.text[start:end]


def split_paragraph(text: str, lang: str | None, limit: int, encode: Encode) -> Paragraph:
    """`text` in sentences of `lang` (its lines' sentences, in order; None: each line one),
    each at most `limit` pieces as `encode` segments it (a longer one in pieces)."""
    segments: list[Segment] = []
    for line in _LINES.finditer(text):
        for start, end in _sentences(line.group(), lang):
            sentence = text[line.start() + start : line.start() + end]
            pieces = _pieces(sentence, limit, encode)
            segments += [
                Segment(line.start() + start + a, line.start() + start + b, len(pieces) > 1)
                for a, b in pieces
            ]
    return Paragraph(text, segments)


def sentence_count(text: str, lang: str) -> int:
    """How many sentences of `lang` the segmenter finds in `text` (a line break ends one)."""
    return sum(len(_sentences(line.group(), lang)) for line in _LINES.finditer(text))


def _sentences(line: str, lang: str | None) -> list[tuple[int, int]]:
    """The sentences of one line as (start, end) offsets, whitespace around them left out
    (`lang` None: the line is one)."""
    import sentencex

    spans: list[list[int]] = []
    position = 0
    found = sentencex.get_sentence_boundaries(lang, line) if lang else [{"text": line}]
    for boundary in found:
        found = boundary["text"]
        start = line.find(found, position) if found else -1
        if start < 0:
            continue
        end = position = start + len(found)
        if spans and start > 0 and not line[start - 1].isspace():  # inside a word: no boundary
            spans[-1][1] = end
        else:
            spans.append([start, end])
    stripped = []
    for start, end in spans:
        words = [m.span() for m in WORD.finditer(line, start, end)]
        if words:
            stripped.append((words[0][0], words[-1][1]))
    return stripped


def _pieces(sentence: str, limit: int, encode: Encode) -> list[tuple[int, int]]:
    """`sentence` as (start, end) pieces of at most `limit` source pieces each: whole if it
    fits, else cut between words, after a clause's punctuation in a piece's second half where
    there is one."""

    def fits(start: int, end: int) -> bool:
        return len(encode([sentence[start:end]])[0]) <= limit

    if fits(0, len(sentence)):
        return [(0, len(sentence))]
    words = [m.span() for m in WORD.finditer(sentence)]
    sizes = [len(ids) for ids in encode([sentence[a:b] for a, b in words])]
    pieces: list[tuple[int, int]] = []
    first = 0
    while first < len(words):
        last, total = first, 0
        while last < len(words) and total + sizes[last] <= limit:
            total += sizes[last]
            last += 1
        if last == first:  # one word longer than the limit alone
            pieces += _cut_word(sentence, *words[first], fits)
            first += 1
            continue
        if last < len(words):
            middle = first + (last - first) // 2
            clauses = [
                k + 1 for k in range(middle, last) if sentence[words[k][1] - 1] in CLAUSE_ENDS
            ]
            last = clauses[-1] if clauses else last
        while last > first + 1 and not fits(words[first][0], words[last - 1][1]):
            last -= 1  # the words segmented in context took more pieces than alone
        pieces.append((words[first][0], words[last - 1][1]))
        first = last
    return pieces


def _cut_word(
    text: str, start: int, end: int, fits: Callable[[int, int], bool]
) -> list[tuple[int, int]]:
    """The word `text[start:end]` cut between characters into the longest parts that fit (a
    part of one character may not, as nothing smaller is left)."""
    parts = []
    while start < end:
        low, high = start + 1, end  # the longest part that fits ends in [low, high]
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(start, middle) else (low, middle - 1)
        parts.append((start, low))
        start = low
    return parts


def steered_paragraph(line: str, number: int, limit: int, encode: Encode) -> Paragraph:
    """A line with terms or a prefix, whole: refused if blank (it would translate to a silent
    blank line) or longer than the model reads (the steering holds for the whole line)."""
    words = [m.span() for m in WORD.finditer(line)]
    if not words:
        raise UserError(
            f"line {number}: the source is blank but has a prefix or terms; "
            "give a source, or no prefix and no terms"
        )
    segment = Segment(words[0][0], words[-1][1])
    if len(encode([line[segment.start : segment.end]])[0]) > limit:
        raise UserError(
            f"line {number}: more source pieces than the model reads ({limit}, as "
            "decode.max_input_len); a line with terms or a prefix is translated whole: "
            "split it, or leave its terms and prefix out"
        )
    return Paragraph(line, [segment])
