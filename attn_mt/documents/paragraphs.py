"""Paragraphs translated as sentences: lines split into their segments (`sentences.py`), the
segments of every line translated as one batch, and each line's translations joined with its
own spacing, so a paragraph is translated exactly as its sentences would be one by one.

`ParagraphTranslator` is a Translator whose `translate_nbest` takes paragraphs (`attn-mt
translate --split-sentences`); the server calls `split_lines` and `Split.join` around its
batcher.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from attn_mt.decode.request import Request
from attn_mt.decode.translator import Translation, Translator
from attn_mt.documents.sentences import (
    BREAKS,
    WORD,
    Paragraph,
    split_paragraph,
    steered_paragraph,
)
from attn_mt.errors import UserError

T = TypeVar("T")


@dataclass
class ParagraphTranslation(Translation):
    """A paragraph's translation: its segments' joined with the paragraph's spacing, the mean
    of their scores, their tokens and alignments end to end (word numbers count the words of
    the paragraph and of this text); `sentences` holds each segment's source and its own."""

    sentences: list[tuple[str, Translation]] = field(default_factory=list)


@dataclass
class Split:
    """Lines split into the segments translated: each line's paragraph, and every segment in
    line order with the line it comes from."""

    paragraphs: list[Paragraph]

    def __post_init__(self) -> None:
        self.owners = [row for row, p in enumerate(self.paragraphs) for _ in p.segments]
        self.firsts = [0]  # each line's first segment, then the number of segments
        for paragraph in self.paragraphs:
            self.firsts.append(self.firsts[-1] + len(paragraph.segments))

    @property
    def texts(self) -> list[str]:
        """Each segment's text, in order."""
        return [p.text[s.start : s.end] for p in self.paragraphs for s in p.segments]

    def per_segment(self, per_line: Sequence[T] | None) -> list[T] | None:
        """A value per line (a line's terms, its prefix) as one per segment (its line's)."""
        return None if per_line is None else [per_line[row] for row in self.owners]

    def join(
        self,
        found: Sequence[list[Translation]],
        nbest: int,
        alignment: bool,
        line_breaks: bool = False,
    ) -> list[list[ParagraphTranslation]]:
        """The `nbest` entries of each line from its segments' (`found`, in segment order);
        see `line_entries`."""
        return [
            self.line_entries(
                row, found[self.firsts[row] : self.firsts[row + 1]], nbest, alignment, line_breaks
            )
            for row in range(len(self.paragraphs))
        ]

    def line_entries(
        self,
        row: int,
        found: Sequence[list[Translation]],
        nbest: int,
        alignment: bool,
        line_breaks: bool = False,
    ) -> list[ParagraphTranslation]:
        """Line `row`'s `nbest` entries from its segments' (`found`): entry k joins entry k of
        each segment (a blank line's are blank). `line_breaks`: keep the paragraph's line
        breaks (a document); else each run of them is a space, so one line gives one line."""
        paragraph = self.paragraphs[row]
        return [
            _joined(paragraph, [e[min(k, len(e) - 1)] for e in found], alignment, line_breaks)
            for k in range(nbest)
        ]

    def user_error(self, err: UserError, first_line: int) -> UserError:
        """`err` as the user's lines show it, where it names a segment ("line N", the segments
        numbered from 1): the line (numbered from `first_line`) and which of its sentences."""

        def line(match: re.Match[str]) -> str:
            segment = int(match.group(1)) - 1
            if not 0 <= segment < len(self.owners):
                return match.group(0)
            row = self.owners[segment]
            number = f"line {first_line + row}"
            if len(self.paragraphs[row].segments) == 1:
                return number
            return f"{number}, sentence {segment - self.firsts[row] + 1}"

        return UserError(re.sub(r"^line (\d+)", line, str(err), count=1))


def split_lines(
    translator: Translator,
    lines: Sequence[str],
    request: Request,
    src_lang: str | None = None,
    sentences: bool = True,
) -> Split:
    """`lines` split as `translator` reads them for `request` (its target language, the terms
    and prefix of each line): each line into its sentences of `src_lang` (the model's first
    source language if None; `sentences=False`: the line whole), every one cut to the model's
    input limit. A line with terms or a prefix stays whole; one longer than the limit, or a
    blank one, is refused, naming the line (numbered from `request.first_line`)."""
    lang = src_lang or translator.config.data.directions()[0][0]
    tag = len(translator.language_prefix(request.tgt_lang))
    # Translator.encode cuts a line at the model's limit: a segment of fewer pieces is whole.
    limit = translator.max_input_len - tag - 1

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [ids[tag:] for ids in translator.encode(texts, request.tgt_lang, warn=False)]

    terms = request.constraints or [()] * len(lines)
    prefixes = request.prefixes or [None] * len(lines)
    paragraphs = []
    for row, line in enumerate(lines):
        if terms[row] or prefixes[row]:
            paragraphs.append(steered_paragraph(line, request.first_line + row, limit, encode))
        else:
            paragraphs.append(split_paragraph(line, lang if sentences else None, limit, encode))
    return Split(paragraphs)


def _joined(
    paragraph: Paragraph, parts: list[Translation], alignment: bool, line_breaks: bool
) -> ParagraphTranslation:
    """One entry of a paragraph from one entry of each of its segments (`parts`)."""
    if not paragraph.segments:  # a blank line: blank, as the translator gives it
        return ParagraphTranslation("", 0.0, [], [] if alignment else None)

    def spacing(index: int) -> str:
        gap = paragraph.gap(index)
        return gap if line_breaks else BREAKS.sub(" ", gap)

    text, tokens, pairs = spacing(0), [], []
    for index, (segment, part) in enumerate(zip(paragraph.segments, parts, strict=True)):
        source_first = _word_number(paragraph.text, segment.start)
        target_first = _word_number(text, len(text))
        pairs += [(i + source_first, j + target_first) for i, j in part.alignment or []]
        text += part.text + spacing(index + 1)
        tokens += part.tokens
    return ParagraphTranslation(
        text,
        sum(part.score for part in parts) / len(parts),
        tokens,
        pairs if alignment else None,
        [
            (paragraph.text[s.start : s.end], p)
            for s, p in zip(paragraph.segments, parts, strict=True)
        ],
    )


def _word_number(text: str, index: int) -> int:
    """The number (from 0) in `text`'s words of the word that starts, or goes on, at `index`."""
    before = len(WORD.findall(text, 0, index))
    return before - 1 if before and not text[index - 1].isspace() else before


class ParagraphTranslator(Translator):
    """A Translator whose `translate_nbest` takes paragraphs: each line split into sentences
    (`split_lines`), the sentences of all lines translated as one call, each line's joined
    (`Split.join`); one line in, one line out. It shares its models with the Translator it
    is made from (`splitting`)."""

    src_lang: str | None = None  # the language sentences are split by (None: the model's)

    @classmethod
    def splitting(cls, translator: Translator, src_lang: str | None = None) -> ParagraphTranslator:
        """`translator` (its models, not a copy of them) translating paragraphs."""
        made = cls(
            translator.models,
            translator.config,
            translator.src_tokenizer,
            translator.tgt_tokenizer,
            translator.device,
            translator.dtype,
            translator.checkpoints,
        )
        made.src_lang = src_lang
        return made

    def translate_nbest(
        self, lines: Sequence[str], request: Request | None = None, **options
    ) -> list[list[Translation]]:
        """As `Translator.translate_nbest`, a line's entries joined from its sentences'; the
        callbacks `on_line` and `on_batch` hear of lines, once all their sentences are done."""
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate: give a list of paragraphs (e.g. [text]), not one str")
        request = request or Request(**options)
        split = split_lines(self, list(lines), request, self.src_lang)
        progress = _Progress(split, request)
        inner = replace(
            request,
            constraints=split.per_segment(request.constraints),
            prefixes=split.per_segment(request.prefixes),
            first_line=1,
            on_line=progress.segment_done,
            on_batch=progress.batch_done,
        )
        progress.start()
        try:
            found = super().translate_nbest(split.texts, inner)
        except UserError as err:
            raise split.user_error(err, request.first_line) from None
        joined = split.join(found, request.nbest, request.alignment)
        return [[*entries] for entries in joined]


class _Progress:
    """The callbacks of a request over lines, called as a split's segments finish."""

    def __init__(self, split: Split, request: Request):
        self.split, self.request = split, request
        self.left = [len(p.segments) for p in split.paragraphs]  # segments to go, per line
        self.done: dict[int, list[Translation]] = {}  # finished segments' entries
        self.finished = 0  # lines finished since on_batch was last called

    def start(self) -> None:
        """Blank lines are done before any search."""
        for row, left in enumerate(self.left):
            if not left:
                self._line_done(row)

    def segment_done(self, segment: int, entries: list[Translation]) -> None:
        self.done[segment] = entries
        row = self.split.owners[segment]
        self.left[row] -= 1
        if not self.left[row]:
            self._line_done(row)

    def batch_done(self, _segments: int) -> None:
        if self.request.on_batch is not None and self.finished:
            self.request.on_batch(self.finished)
        self.finished = 0

    def _line_done(self, row: int) -> None:
        self.finished += 1
        if self.request.on_line is not None:
            segments = range(self.split.firsts[row], self.split.firsts[row + 1])
            found = [self.done[s] for s in segments]
            entries = self.split.line_entries(
                row, found, self.request.nbest, self.request.alignment
            )
            self.request.on_line(row, list(entries))
