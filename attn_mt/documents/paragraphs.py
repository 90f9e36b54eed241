"""Paragraphs translated as sentences: lines split into their segments (`sentences.py`), the
segments of every line translated as one batch, and each line's translations joined with its
own spacing, so a paragraph is translated exactly as its sentences would be one by one.

`ParagraphTranslator` is a Translator whose `translate_nbest` takes paragraphs (`attn-mt
translate` and `evaluate`, unless `--no-split-sentences`: then each line is one segment); the
server calls `split_lines` and `Split.join` around its batcher. Both split by default, so a
line of several sentences is translated alike by the command line and the server.

A segment whose best output is much shorter than its source (`short_outputs`) is warned about,
naming its line: the search may have ended after the first of its sentences.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from attn_mt.data.ids import target_ids
from attn_mt.decode.request import Request
from attn_mt.decode.translator import Translation, Translator
from attn_mt.documents.sentences import (
    BREAKS,
    WORD,
    Paragraph,
    sentence_count,
    split_paragraph,
    steered_paragraph,
)
from attn_mt.errors import UserError

T = TypeVar("T")
# An output of fewer target pieces than this share of its source's is "much shorter": a source
# of several sentences translated whole may end after its first. On Multi30k de -> en, 0.1% of
# the reference pairs of 10 pieces or more fall under it.
SHORT_SHARE = 0.5
SHORTER_SHARE = 0.8  # where the output holds fewer sentences than its source
SHORT_FROM = 10  # source pieces: a shorter source is not judged
NAMED_SHORT = 5  # lines cut short a ParagraphTranslator names (a weak model's are many)


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
            return self.where(segment, first_line)

        return UserError(re.sub(r"^line (\d+)", line, str(err), count=1))

    def where(self, segment: int, first_line: int) -> str:
        """Segment `segment` (from 0) as the user's lines show it: "line N" (numbered from
        `first_line`), with "sentence K" where its line has several segments ("part K" where
        one of them is a sentence longer than the model reads, cut in pieces)."""
        row = self.owners[segment]
        number = f"line {first_line + row}"
        segments = self.paragraphs[row].segments
        if len(segments) == 1:
            return number
        # A line holding a sentence cut at the model's limit: its segments are parts of it.
        kind = "part" if any(s.part for s in segments) else "sentence"
        return f"{number}, {kind} {segment - self.firsts[row] + 1}"

    def is_part(self, segment: int) -> bool:
        """Whether segment `segment` is a piece of a sentence longer than the model reads."""
        row = self.owners[segment]
        return self.paragraphs[row].segments[segment - self.firsts[row]].part


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
    lang = split_language(translator, src_lang)
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


def split_language(translator: Translator, src_lang: str | None) -> str:
    """The language a line is split into sentences by: `src_lang`, else the model's first
    source language."""
    return src_lang or translator.config.data.directions()[0][0]


def _joined(
    paragraph: Paragraph, parts: list[Translation], alignment: bool, line_breaks: bool
) -> ParagraphTranslation:
    """One entry of a paragraph from one entry of each of its segments (`parts`)."""
    if not paragraph.segments:  # blank: as the translator gives it, or a document's own spacing
        text = paragraph.text if line_breaks else ""
        return ParagraphTranslation(text, 0.0, [], [] if alignment else None)

    def spacing(index: int) -> str:
        gap = paragraph.gap(index)
        if line_breaks:
            return gap
        # A line's own ends are not kept (the Translator strips a line): a line of one
        # sentence gives what the Translator gives it.
        return BREAKS.sub(" ", gap) if 0 < index < len(paragraph.segments) else ""

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
    (`split_lines`; `sentences` False: each line whole, cut only at the model's limit), the
    sentences of all lines translated as one call, each line's joined (`Split.join`); one line
    in, one line out, an output much shorter than its source warned about. It shares its
    models with the Translator it is made from (`splitting`)."""

    src_lang: str | None = None  # the language sentences are split by (None: the model's)
    sentences: bool = True  # False: a line is not split into sentences
    named_short = 0  # outputs cut short warned about so far (at most NAMED_SHORT)

    @classmethod
    def splitting(
        cls, translator: Translator, src_lang: str | None = None, sentences: bool = True
    ) -> ParagraphTranslator:
        """`translator` (its models, not a copy of them) translating paragraphs (`sentences`
        False: lines whole)."""
        made = cls(
            translator.models,
            translator.config,
            translator.src_tokenizer,
            translator.tgt_tokenizer,
            translator.device,
            translator.dtype,
            translator.checkpoints,
            text=translator.text,
        )
        made.src_lang, made.sentences = src_lang, sentences
        return made

    def translate_nbest(
        self, lines: Sequence[str], request: Request | None = None, **options
    ) -> list[list[Translation]]:
        """As `Translator.translate_nbest`, a line's entries joined from its sentences'; the
        callbacks `on_line` and `on_batch` hear of lines, once all their sentences are done."""
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate: give a list of paragraphs (e.g. [text]), not one str")
        request = request or Request(**options)
        split = split_lines(self, list(lines), request, self.src_lang, self.sentences)
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
        self._warn_short(split, found, request)
        joined = split.join(found, request.nbest, request.alignment)
        return [[*entries] for entries in joined]

    def _warn_short(
        self, split: Split, found: Sequence[list[Translation]], request: Request
    ) -> None:
        """A warning for each line with a segment whose best output looks cut short
        (`short_outputs`), naming the line and its first such segment: the first NAMED_SHORT
        lines of this translator's."""
        if self.named_short == NAMED_SHORT:
            return
        langs = (split_language(self, self.src_lang), request.tgt_lang or self.target_languages[0])
        named: set[int] = set()  # the lines named in this call: each once, by its first
        for short in short_outputs(self, split, found, request.tgt_lang, langs):
            if self.named_short == NAMED_SHORT:
                return
            if split.owners[short.segment] in named:
                continue
            named.add(split.owners[short.segment])
            self.named_short += 1
            sizes = f"{short.output} pieces for a source of {short.source}"
            if short.sentences is not None:
                given, held = short.sentences
                sizes = f"{sizes}, {given} sentence(s) for its {held}"
            whole = not self.sentences and sentence_count(split.texts[short.segment], langs[0]) > 1
            advice = "; --split-sentences translates them one by one" if whole else ""
            if split.is_part(short.segment):
                advice += (
                    "; the line holds a sentence longer than the model reads "
                    "(decode.max_input_len), translated in parts cut between words"
                )
            if self.named_short == NAMED_SHORT:
                advice += f" (no more than {NAMED_SHORT} such lines are named)"
            warnings.warn(
                f"{split.where(short.segment, request.first_line)}: an output of {sizes}: the "
                f"translation may have stopped early{advice}",
                stacklevel=3,
            )


@dataclass(frozen=True)
class Short:
    """A segment whose output looks cut short: the pieces of both sides and, where that was
    the sign, the sentences of both (output, source)."""

    segment: int
    output: int
    source: int
    sentences: tuple[int, int] | None = None


def short_outputs(
    translator: Translator,
    split: Split,
    found: Sequence[list[Translation]],
    tgt_lang: str | None,
    langs: tuple[str, str],
) -> list[Short]:
    """The segments whose best output (`found[segment][0]`) looks cut short: from SHORT_FROM
    source pieces up, fewer target pieces than SHORT_SHARE of its source's, or than
    SHORTER_SHARE where the segment holds several sentences of `langs[0]` and the output fewer
    of `langs[1]` (a line translated whole that ended after its first). Both sides are counted
    in their text as written (kept spans in), so a span the search did not see counts on
    both."""
    tag = len(translator.language_prefix(tgt_lang))
    sources = [len(ids) - tag for ids in translator.encode(split.texts, tgt_lang, warn=False)]
    # The tokens searched are at most the output text's pieces: only those few are encoded.
    judged = [
        k
        for k, (size, entries) in enumerate(zip(sources, found, strict=True))
        if size >= SHORT_FROM and entries and len(entries[0].tokens) < SHORTER_SHARE * size
    ]
    outputs = target_ids(translator.tgt_tokenizer, [found[k][0].text for k in judged])
    short = []
    for k, ids in zip(judged, outputs, strict=True):
        if len(ids) < SHORT_SHARE * sources[k]:
            short.append(Short(k, len(ids), sources[k]))
        elif len(ids) < SHORTER_SHARE * sources[k]:
            held = sentence_count(split.texts[k], langs[0])
            given = sentence_count(found[k][0].text, langs[1])
            if given < held:
                short.append(Short(k, len(ids), sources[k], (given, held)))
    return short


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
