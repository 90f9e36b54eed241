"""The one registry of `data.filters`' rules and the judge of a corpus's pairs.

`FILTERS` holds every rule (`attn_mt.data.rules`, one class each) in the order they are tried,
the cheap ones first; that order gives each rule its code in dropped.tsv, report.json and the
manifest (`rule_names`). A new rule is a class in `attn_mt.data.rules`, its place here, and its
switch in `FilterConfig` (with its row in docs/bigger-corpora.md).

A `PairFilter` holds a corpus's rules that are on and judges a chunk of pairs at once, on a
worker process: each pair gets the code of the first rule that drops it (0: kept). The rules
whose `accept` must see the corpus in order (dedup) are scored there and accepted by the process
that reads the corpus (`attn_mt.data.cleaning`); `score` runs a model, in `attn-mt clean`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from attn_mt.config.data import FilterConfig
from attn_mt.data.rules import (
    ChunkRule,
    Copy,
    Dedup,
    Digits,
    Empty,
    Langid,
    LongWords,
    Markup,
    MaxChars,
    PairRule,
    Ratio,
    Rule,
    Score,
    Script,
)
from attn_mt.data.scripts import base_language
from attn_mt.langid import JUDGED_CHARS

log = logging.getLogger("attn_mt")

# The registry: every rule of data.filters, in the order they are tried (the cheap ones first,
# those of the process that reads the corpus in order last).
FILTERS: tuple[type[Rule], ...] = (
    Empty,
    MaxChars,
    Ratio,
    Markup,
    LongWords,
    Digits,
    Copy,
    Script,
    Langid,
    Dedup,
    Score,
)
# The rules of `prepare` on SentencePiece tokens (data.max_len, data.max_len_ratio), after these.
TOKEN_RULES = ("max_len", "max_len_ratio")


def rule_names() -> tuple[str, ...]:
    """Every rule a pair can be dropped by, in the order they are tried: `FILTERS`, then the
    token rules; a pair's code is its rule's place here + 1 (0: kept)."""
    return (*(rule.name for rule in FILTERS), *TOKEN_RULES)


def rule_code(name: str) -> int:
    """The code of the rule `name` (`rule_names`)."""
    return rule_names().index(name) + 1


class PairFilter:
    """One corpus's rules that are on (`FILTERS`, as its `FilterConfig` sets them), for its
    source and target languages."""

    def __init__(self, config: FilterConfig, src_lang: str, tgt_lang: str):
        self.config = config
        self.langs = (base_language(src_lang), base_language(tgt_lang))
        self.rules = [rule(config, self.langs) for rule in FILTERS if rule.is_on(config)]
        self._pair_rules = [
            (rule_code(r.name), r.score, r.accept) for r in self.rules if isinstance(r, PairRule)
        ]
        self._chunk_rules = [r for r in self.rules if isinstance(r, ChunkRule) and not r.in_order]
        self.in_order = [r for r in self.rules if isinstance(r, ChunkRule) and r.in_order]
        self._cut_said = not any(isinstance(r, Langid) for r in self.rules)  # or no langid

    def judge(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) uint8: the code of the first rule (`rule_names`) that drops each pair, 0 if
        kept; the rules `in_order` are left to the reader of the corpus (`in_order_scores`)."""
        codes = np.zeros(len(src), dtype=np.uint8)
        pair_rules = self._pair_rules
        for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
            for code, score, accept in pair_rules:
                if not accept(score(s, t)):
                    codes[i] = code
                    break
        for rule in self._chunk_rules:
            kept, kept_src, kept_tgt = _kept(src, tgt, codes)
            codes[kept[~rule.accept(rule.score(kept_src, kept_tgt))]] = rule_code(rule.name)
        return codes

    def in_order_scores(
        self, src: Sequence[str], tgt: Sequence[str], codes: np.ndarray
    ) -> list[np.ndarray]:
        """The scores of the pairs `codes` keeps by each rule `in_order` (dedup's hashes): the
        workers' part of those rules."""
        _, kept_src, kept_tgt = _kept(src, tgt, codes)
        return [rule.score(kept_src, kept_tgt) for rule in self.in_order]

    def say_cut(
        self,
        corpus: str,
        lines: Sequence[int],
        src: Sequence[str],
        tgt: Sequence[str],
        codes: np.ndarray,
    ) -> None:
        """Say once (a warning) that langid judges a side over `JUDGED_CHARS` characters on its
        first ones, at the first such pair it judged (`codes`: the workers' codes of a chunk of
        `corpus`, its 0-based `lines`); in the process that reads the corpus."""
        if self._cut_said:
            return
        judged = (codes == 0) | (codes == rule_code(Langid.name))
        for row in np.flatnonzero(judged).tolist():
            if max(len(src[row]), len(tgt[row])) > JUDGED_CHARS:
                self._cut_said = True
                log.warning(
                    "%s line %d: a side over %d characters; data.filters.langid judges it (and "
                    "any other) on its first %d",
                    corpus,
                    lines[row] + 1,
                    JUDGED_CHARS,
                    JUDGED_CHARS,
                )
                return

    def in_order_rules(self) -> list[ChunkRule]:
        """New rules `in_order`, for one pass of the process that reads the corpus in order."""
        return [type(rule)(self.config, self.langs) for rule in self.in_order]


def _kept(
    src: Sequence[str], tgt: Sequence[str], codes: np.ndarray
) -> tuple[np.ndarray, list[str], list[str]]:
    """The pairs `codes` keeps: their rows, their sources, their targets."""
    kept = np.flatnonzero(codes == 0)
    rows = kept.tolist()
    return kept, [src[i] for i in rows], [tgt[i] for i in rows]
