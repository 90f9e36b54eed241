"""How a line becomes ids: the one rule that translation (`Translator.encode`), validation (its
loss and its search), forced decoding, the steering and the alignment benchmark share.

A source line is stripped, segmented, cut to decode.max_input_len less the tag (with a warning),
and led by the `<2xx>` tag of the target language asked for, put in by id (`source_ids`,
`language_prefix`); a blank line gives [] (nothing to translate). A target line is stripped and
segmented (`target_ids`). The training shards put the same tags before their sources
(`tag_ids`) but keep their text as read: data.max_len drops an over-long pair instead of
cutting it. No line gets `<bos>`/`<eos>` here: a batch adds them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from attn_mt.config.data import DataConfig, language_tag
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError


def tag_ids(tokenizer: Tokenizer, tags: Sequence[str]) -> list[int]:
    """The ids of the pieces `tags` (a target-language tag, a corpus's tag), which lead a source
    by id: their strings in a sentence are text (`Tokenizer.encode`)."""
    return [tokenizer.sp.piece_to_id(tag) for tag in tags]


def language_prefix(data: DataConfig, tokenizer: Tokenizer, tgt_lang: str | None) -> list[int]:
    """The ids put before each source to ask for `tgt_lang` (the `<2xx>` tag of a model of
    several target languages; none for one), checked against `data`'s target languages."""
    languages = data.target_languages()
    if not data.language_tags():
        if tgt_lang is not None and tgt_lang != languages[0]:
            raise UserError(
                f"--tgt-lang {tgt_lang}: this model translates into {languages[0]} only"
            )
        return []
    if tgt_lang is None:
        raise UserError(
            "--tgt-lang: this multilingual model needs the language to translate into; "
            f"its target languages: {', '.join(languages)}"
        )
    if tgt_lang not in languages:
        raise UserError(
            f"--tgt-lang {tgt_lang}: not a target language of this model; its target "
            f"languages: {', '.join(languages)}"
        )
    return tag_ids(tokenizer, [language_tag(tgt_lang)])


def input_limit(max_input_len: int, positions: int | None) -> int:
    """The source pieces a model reads: decode.max_input_len, within a positional table of
    `positions` rows (None: unbounded), as the source gets one <eos>."""
    return min(max_input_len, positions - 1) if positions else max_input_len


def source_ids(
    tokenizer: Tokenizer,
    lines: Sequence[str],
    prefix: Sequence[int],
    limit: int,
    first_line: int = 1,
    warn: bool = True,
) -> list[list[int]]:
    """The source ids of each line: stripped and segmented, its pieces cut to `limit` less the
    `prefix` (the tag, from `language_prefix`), after the prefix; a blank line gives [].

    Each line cut is warned about, numbered from `first_line`, unless `warn` is False.
    """
    ids = tokenizer.encode([line.strip() for line in lines])
    room = limit - len(prefix)
    for number, seq in enumerate(ids, start=first_line):
        if len(seq) > room:
            if warn:
                warnings.warn(
                    f"line {number}: {len(seq)} source tokens, truncated to {room} "
                    "(decode.max_input_len)",
                    stacklevel=3,  # the caller of `Translator.encode`
                )
            del seq[room:]
    return [[*prefix, *seq] if seq else seq for seq in ids]


def target_ids(tokenizer: Tokenizer, lines: Sequence[str]) -> list[list[int]]:
    """The target ids of each line (a reference, a term, a forced prefix): stripped and
    segmented, never cut (a reference longer than the model's positions is the caller's
    error to name)."""
    return tokenizer.encode([line.strip() for line in lines])
