"""The Translator's side of `decode.recase` and `decode.protect` (`attn_mt.text.form`): the rules
made for a model (`text_rules`, from its config, casing tables and source vocabulary), and a
batch's outputs given back as their lines were written (`given_back`).

A line whose best output lost a number of its source (`lost_numbers`) is read again with its
numbers taken out as spans (`read_again`) and searched again as the model reads it then, with
the other such lines of the input after the rest (one batch, not one per batch), its numbers
put back as written (docs/decoding.md says why not as constraints). The lines whose spans or
capitals go back by the word alignment get it (the alignment `--alignment` gives); then each
entry is written back (`TextRules.write`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from attn_mt.config.schema import Config
from attn_mt.data.tokenizer import Tokenizer
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

    def spelled(number: str) -> bool:  # more than one piece (a bare "▁" aside)
        return len([p for p in src_tokenizer.sp.encode(number, out_type=str) if p != "▁"]) > 1

    return TextRules(recase, protect, tables, sources, known, spelled)


def lost_numbers(forms: Sequence[LineForm], rows: list[int], found: Entries) -> list[int]:
    """The lines of `rows` whose best entry in `found` lost a number of its source."""
    return [
        row
        for row, entries in zip(rows, found, strict=True)
        if entries and forms[row].numbers and missing(forms[row].numbers, entries[0].text)
    ]


def read_again(
    rules: TextRules, forms: list[LineForm], lines: list[str], rows: list[int], tgt_lang: str | None
) -> None:
    """The lines `rows` read again with their numbers taken out as spans: their `forms` and the
    model's text `lines` replaced (a line of numbers alone: empty text, its form `kept`)."""
    read = rules.read([forms[row].line for row in rows], tgt_lang, numbers=True)
    for row, form in zip(rows, read, strict=True):
        forms[row], lines[row] = form, form.text


def given_back(
    translator: Searcher,
    forms: Sequence[LineForm],
    lines: Sequence[str],
    ids: Sequence[list[int]],
    rows: list[int],
    found: Entries,
    request: Request,
) -> Entries:
    """The entries `found` of the lines `rows` (the model's text `lines`, its source `ids`)
    written back as `forms` say."""
    rules = translator.text
    assert rules is not None, "a translator with text rules"
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
