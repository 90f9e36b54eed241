"""The Translator's side of `decode.recase` and `decode.protect` (`attn_mt.text.form`): the rules
made for a model (`text_rules`, from its config, casing tables and source vocabulary), and a
batch's outputs given back as their lines were written (`given_back`).

A line whose best output lost a number of its source is read again with its numbers taken out
as spans (`TextRules.read(..., numbers=True)`) and searched again as the model reads it then,
its numbers put back as written. (Searched again with the lost numbers as terms, the steered
search of `--constraints`, a 1,500-update Multi30k model kept 70% of them, and the words around
a number it had never seen suffered.) The lines whose spans or capitals go back by the word
alignment get it (the alignment `--alignment` gives); then each entry is written back
(`TextRules.write`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from attn_mt.config.schema import Config
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.controls import Controls
from attn_mt.decode.request import Request
from attn_mt.errors import CheckpointError
from attn_mt.model.vocab import UNK_ID
from attn_mt.text.casing import tables_from_dict
from attn_mt.text.form import LineForm, TextRules
from attn_mt.text.spans import missing

Entries = list[list[Any]]  # per line, its `Translation`s (text, score, tokens, alignment)


class Searcher(Protocol):
    """What giving outputs back uses of the `Translator` (whose module imports this one)."""

    text: TextRules | None

    def language_prefix(self, tgt_lang: str | None) -> list[int]: ...

    def encode(
        self,
        lines: Sequence[str],
        tgt_lang: str | None = None,
        first_line: int = 1,
        warn: bool = True,
    ) -> list[list[int]]: ...

    def _search(
        self,
        lines: list[str],
        ids: list[list[int]],
        rows: list[int],
        controls: list[Controls | None],
        request: Request,
    ) -> Entries: ...

    def _align(
        self, lines: list[str], src: list[list[int]], entries: Entries, lead: int
    ) -> None: ...


def text_rules(
    config: Config, casing: dict[str, Any] | None, src_tokenizer: Tokenizer, path: Any = ""
) -> TextRules | None:
    """The rules of config's decode.recase and decode.protect for a model with the casing
    tables `casing` (a checkpoint's entry, or None) and the source vocabulary `src_tokenizer`;
    None with both off: lines go to the model as given."""
    recase, protect = config.decode.recase == "auto", config.decode.protect == "auto"
    if not (recase or protect):
        return None
    try:
        tables = tables_from_dict(casing) if casing is not None else None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path}: its casing table is damaged ({err})") from None
    sources: dict[str | None, list[str]] = {}
    for src, tgt in config.data.directions():
        sources.setdefault(tgt, []).append(src)
    if len(sources) == 1:  # a model of one target language is asked for none
        sources[None] = next(iter(sources.values()))

    def known(char: str) -> bool:
        return src_tokenizer.sp.piece_to_id(char) != UNK_ID

    return TextRules(recase, protect, tables, sources, known)


def given_back(
    translator: Searcher,
    forms: Sequence[LineForm],
    lines: Sequence[str],
    ids: Sequence[list[int]],
    rows: list[int],
    controls: Sequence[Controls | None],
    found: Entries,
    request: Request,
) -> Entries:
    """The entries `found` of the lines `rows` (the model's text `lines`, its source `ids`,
    each line's `controls`) written back as `forms` say, numbers kept."""
    rules = translator.text
    assert rules is not None, "a translator with text rules"
    forms, lines, ids = list(forms), list(lines), list(ids)
    lost = [k for k, row in enumerate(rows) if found[k] and _lost(forms[row], found[k][0].text)]
    if lost:
        again = [rows[k] for k in lost]
        read = rules.read([forms[row].line for row in again], request.tgt_lang, numbers=True)
        for row, form in zip(again, read, strict=True):
            forms[row], lines[row] = form, form.text
        new_ids = translator.encode([lines[row] for row in again], request.tgt_lang, warn=False)
        for row, seq in zip(again, new_ids, strict=True):
            ids[row] = seq
        searched = [row for row in again if ids[row]]  # not a line of numbers alone (kept)
        if searched:
            steering = [controls[row] for row in searched]
            again_found = translator._search(lines, ids, searched, steering, request)
            for row, row_entries in zip(searched, again_found, strict=True):
                found[rows.index(row)] = row_entries
    need = [k for k, row in enumerate(rows) if forms[row].aligned and not request.alignment]
    if need:
        lead = len(translator.language_prefix(request.tgt_lang))
        translator._align(
            [lines[rows[k]] for k in need],
            [ids[rows[k]] for k in need],
            [found[k] for k in need],
            lead,
        )
    for row, entries in zip(rows, found, strict=True):
        for entry in entries:
            entry.text, alignment = rules.write(forms[row], entry.text, entry.alignment)
            entry.alignment = alignment if request.alignment else None
    return found


def _lost(form: LineForm, text: str) -> bool:
    """Whether the output `text` of `form` lost a number of its source."""
    return bool(form.numbers) and bool(missing(form.numbers, text))
