"""One line's way to the model and back, as `decode.recase` and `decode.protect` ask: `read`
makes the text the model reads (the line normalised, its spans taken out, recased) and keeps
what `write` needs to give the output back as the line was written (cased back, the spans put
back by the alignment, the final punctuation as the source's). A line that none of it
changes reaches the model as it is. A number the source vocabulary spells piece by piece
(`1987`, `250`; not `3`, one piece) is taken out as a span at once: a captions model rarely saw
one, and the words around it suffer. A line whose output lost a number it read is read again
with every number taken out (`read(..., numbers=True)`); numbers go back as written.

The order: normalised (`normalize.py`) first, so the spans and casing see the characters the
model reads; spans out before recasing, so a URL in capitals stays as written; cased back
before the spans go in, for the same reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from attn_mt.text.casing import Casing, CasingTable, case_back, recase
from attn_mt.text.normalize import invisible, typographic, without_final_punct
from attn_mt.text.spans import Picked, Taken, numbers, put_back, take_out

Alignment = list[tuple[int, int]]  # (source word, target word) pairs


@dataclass
class LineForm:
    """A line as the model reads it (`text`) and what gives its output back: the casing to
    restore, the spans to put back, the numbers the output must hold, whether the source ends
    in final punctuation, the line as given (`line`). `kept`: a line with nothing to translate
    but its spans, given back as it is."""

    text: str
    line: str = ""
    casing: Casing = field(default_factory=Casing)
    taken: Taken | None = None
    numbers: list[str] = field(default_factory=list)
    final: bool = True
    kept: str | None = None

    @property
    def aligned(self) -> bool:
        """Whether giving the output back needs its word alignment: spans to place, or words
        in capitals to case back."""
        return bool(self.taken or self.casing.words)


class TextRules:
    """`decode.recase` and `decode.protect` for one model: its casing tables (None: it has
    none), the source languages of each target language it translates into, and which
    characters its source vocabulary holds (`known`) and which numbers it spells piece by piece
    (`spelled`: taken out at once; None: none)."""

    def __init__(
        self,
        recase: bool,
        protect: bool,
        tables: dict[str, CasingTable] | None,
        sources: dict[str | None, list[str]],
        known: Callable[[str], bool],
        spelled: Picked = None,
    ):
        self.recase, self.protect, self.spelled = recase, protect, spelled
        self.tables, self.sources = tables, sources
        self.typographic = typographic(known) if protect else {}
        self.without_table = ""  # why recasing is off, once said

    def read(
        self, lines: Sequence[str], tgt_lang: str | None = None, numbers: bool = False
    ) -> list[LineForm]:
        """Each line's form, as translated into `tgt_lang` (whose source languages pick the
        casing table); with `numbers`, every number taken out among its spans."""
        picked = (lambda number: True) if numbers else self.spelled
        return [self._read(line, tgt_lang, picked) for line in lines]

    def _read(self, line: str, tgt_lang: str | None, numbers_out: Picked) -> LineForm:
        final = without_final_punct(line) != line if self.recase else True
        form = LineForm(line, line, final=final)
        if not line.strip():
            return form
        text = line
        if self.protect:
            text = invisible(text).translate(self.typographic)
            form.taken = take_out(text, numbers_out)
            if form.taken:
                text = form.taken.text
                if not any(c.isalnum() for c in text):
                    return LineForm("", line, kept=line.strip())
            form.numbers = numbers(text)
        if self.recase:
            table = self._table(text, tgt_lang)
            if table is not None:
                text, form.casing = recase(text, table)
        form.text = text
        return form

    def _table(self, text: str, tgt_lang: str | None) -> CasingTable | None:
        """The casing table of the line's language: of the source language that translates
        into `tgt_lang`; of several, the one whose table knows most of the line's words. None
        without tables (said once, when a line in capitals or Title Case comes)."""
        if self.tables is None:
            if not self.without_table and recase(text, CasingTable())[1]:
                self.without_table = (
                    "recasing is off: the checkpoint holds no casing table; make one with "
                    "`attn-mt recase-table --config FILE --model RUN`"
                )
                warnings.warn(self.without_table, stacklevel=4)
            return None
        languages = self.sources.get(tgt_lang) or list(self.tables)
        tables = [self.tables[lang] for lang in languages if lang in self.tables]
        if len(tables) < 2:
            return tables[0] if tables else None
        words = {w.lower() for w in text.split()}
        return max(tables, key=lambda table: len(words & table.words.keys()))

    def write(
        self, form: LineForm, text: str, alignment: Alignment | None
    ) -> tuple[str, Alignment | None]:
        """The output `text` of `form.text` (with its word `alignment` where `form.aligned` or
        the caller asked for one) as the line was written, and the alignment to the line's
        words."""
        if form.kept is not None:
            return form.kept, [] if alignment is not None else None
        text = case_back(text, form.casing, alignment or [])
        if form.taken is not None:
            text, alignment = put_back(form.taken, text, alignment or [])
        if not form.final:
            text = without_final_punct(text)
            if alignment is not None:
                count = len(text.split())
                alignment = [(s, t) for s, t in alignment if t < count]
        return text, alignment
