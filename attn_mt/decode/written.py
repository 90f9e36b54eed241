"""The Translator's side of `decode.recase` and `decode.protect` (`attn_mt.text.form`): the rules
made for a model (`text_rules`, from its config, casing tables and source vocabulary), and a
batch's outputs given back as their lines were written (`given_back`).

An output that lost a number of its source is searched again with the lost numbers as terms,
by the steered search of `--constraints` (a beam of at least 2), and the new entries are kept
where they hold them all; sampling draws freely and is left alone. The lines whose spans or
capitals go back by the word alignment get it (the alignment `--alignment` gives); then each
entry is written back (`TextRules.write`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from attn_mt.config.schema import Config
from attn_mt.data.ids import target_ids
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.controls import Controls
from attn_mt.decode.request import Request
from attn_mt.errors import CheckpointError, UserError
from attn_mt.model.vocab import UNK_ID
from attn_mt.text.casing import tables_from_dict
from attn_mt.text.form import LineForm, TextRules
from attn_mt.text.spans import missing

Entries = list[list[Any]]  # per line, its `Translation`s (text, score, tokens, alignment)


class Searcher(Protocol):
    """What giving outputs back uses of the `Translator` (whose module imports this one)."""

    text: TextRules | None
    tgt_tokenizer: Tokenizer

    def language_prefix(self, tgt_lang: str | None) -> list[int]: ...

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
    found = _numbers_kept(translator, forms, lines, ids, rows, controls, found, request)
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


def _numbers_kept(
    translator: Searcher,
    forms: Sequence[LineForm],
    lines: Sequence[str],
    ids: Sequence[list[int]],
    rows: list[int],
    controls: Sequence[Controls | None],
    found: Entries,
    request: Request,
) -> Entries:
    """`found` with the lines whose best entry lost a number of its source searched again,
    the lost numbers as terms, where the new best holds every number."""
    if request.sampling is not None:
        return found
    again: list[tuple[int, Controls]] = []
    for k, row in enumerate(rows):
        lost = missing(forms[row].numbers, found[k][0].text) if found[k] else []
        given = controls[row] or Controls()
        terms = [t for t in _terms(translator.tgt_tokenizer, lost) if t not in given.avoid]
        if terms:
            again.append((k, Controls(given.terms + terms, given.prefix, given.avoid)))
    wider = replace(request, beam=max(request.beam or 1, 2))
    for k, steering in again:  # a line at a time: one line without an output fails alone
        try:
            [entries] = translator._search(list(lines), list(ids), [rows[k]], [steering], wider)
        except UserError:
            continue
        if not missing(forms[rows[k]].numbers, entries[0].text):
            found[k] = entries
    return found


def _terms(tokenizer: Tokenizer, numbers: list[str]) -> list[list[int]]:
    """The target pieces of each number that the vocabulary writes back as given."""
    pieces = target_ids(tokenizer, numbers)
    written = tokenizer.decode(pieces)
    return [p for p, n, w in zip(pieces, numbers, written, strict=True) if p and w == n]
