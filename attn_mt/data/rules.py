"""The rules of `data.filters`, one small class a rule in OpusFilter's shape: `score` a pair,
`accept` its score. A rule is built for one corpus, from its `FilterConfig` (its switch is the key
named as the rule, its settings the keys `RULE_*`, read here once) and its two languages;
`attn_mt.data.filters` holds them in order (`FILTERS`) and judges pairs with them.

A `PairRule` looks at one pair at a time; a `ChunkRule` scores the pairs of a chunk kept so far
at once (py3langid runs on a chunk: `attn_mt.langid.LanguageScores`), and one whose `accept`
must see the corpus in order (dedup: the set of its hashes) is accepted by the one process that
reads it. `score` runs a model: `attn-mt clean` builds it (`attn_mt.decode.pairscore`).

Short lines and scripts other than Latin are the rules' hard cases: the length ratio judges
no pair whose sides are both under 20 characters, and counts a Han character 3 times and a
kana or Hangul one twice (about the Latin letters each carries); langid judges only sides of
`langid_min_chars` characters or more, and a side longer than `attn_mt.langid.JUDGED_CHARS` on
its first ones (its time and memory stay bounded whatever the line); a side whose language
writes without spaces has no long words; a side without letters has no script; the digits
compared are 1-9 of any script. Every rule takes time linear in a line's length.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from attn_mt.config.data import FilterConfig
from attn_mt.data.dedup import SeenHashes, pair_hashes
from attn_mt.data.scripts import LANGUAGE_SCRIPTS, SPACELESS, not_script_pattern, weighted_length
from attn_mt.langid import language_scores

log = logging.getLogger("attn_mt")

# Markup, URLs and site chrome: an HTML/XML tag or comment, a URL, an e-mail address, a
# copyright sign, a menu bar ("Home | About | Contact"). Not an entity (&amp;): clean corpora
# hold them escaped (Multi30k does), and the pair is still a translation.
# Every alternative is linear in the line's length: a tag is looked for over at most 200
# characters, and an address's user part only from the start of its run of characters (the
# look-behind), so a run of N word characters before an "@" is read once, not from each of
# its N starts (quadratic: 40,000 of them took seconds).
_MARKUP = re.compile(
    r"<[A-Za-z!/][^<>]{0,200}>"
    r"|\b(?:https?|ftp)://|\bwww\.[\w-]+\."
    r"|(?<![\w.+-])[\w.+-]+@[\w-]+\.[A-Za-z]{2,}"
    r"|©"
    r"|\s\|\s.*\s\|\s"
)
SHORT_CHARS = 20  # the ratio does not judge a pair whose sides are both shorter
_NOT_LETTER = re.compile(r"[\W\d_]")
_DIGIT = re.compile(r"\d")
_WORD = re.compile(r"\w+")
LANGID_BATCH = 512  # lines whose py3langid scores stay in the cache together


class Rule:
    """A rule of `data.filters` as a corpus's `FilterConfig` sets it, for the corpus's source
    and target languages."""

    name: ClassVar[str]  # in dropped.tsv and report.json; the rule's switch in FilterConfig

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        self.langs = langs

    @classmethod
    def is_on(cls, config: FilterConfig) -> bool:
        """Whether `config` turns the rule on."""
        return config.switches()[cls.name]


class PairRule(Rule):
    """A rule that judges one pair at a time."""

    def score(self, src: str, tgt: str) -> Any:
        """What the rule measures of the pair."""
        raise NotImplementedError

    def accept(self, score: Any) -> bool:
        """Whether a pair of this score is kept."""
        raise NotImplementedError


class ChunkRule(Rule):
    """A rule that judges many pairs at once: the pairs of a chunk kept so far."""

    # Whether `accept` must see a corpus's chunks in order: the workers score, the one process
    # that reads the corpus accepts.
    in_order: ClassVar[bool] = False

    def score(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) what the rule measures of each pair."""
        raise NotImplementedError

    def accept(self, scores: np.ndarray) -> np.ndarray:
        """(N,) bool: which pairs of these scores are kept."""
        raise NotImplementedError


class Empty(PairRule):
    """`empty` (always on): a side that is blank."""

    name = "empty"

    @classmethod
    def is_on(cls, config: FilterConfig) -> bool:
        """Always."""
        return True

    def score(self, src: str, tgt: str) -> bool:
        """Whether both sides hold more than spaces."""
        return bool(src.strip() and tgt.strip())

    def accept(self, score: bool) -> bool:
        """Both sides hold text."""
        return score


class MaxChars(PairRule):
    """`max_chars`: a side over N characters."""

    name = "max_chars"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.limit = config.max_chars

    def score(self, src: str, tgt: str) -> int:
        """The characters of the longer side."""
        return max(len(src), len(tgt))

    def accept(self, score: int) -> bool:
        """At most `max_chars`."""
        return score <= self.limit


class Ratio(PairRule):
    """`ratio`: a longer side with over `ratio` times the characters of the other (a Han
    character counted 3 times, a kana or Hangul one twice)."""

    name = "ratio"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.limit = config.ratio

    def score(self, src: str, tgt: str) -> tuple[int, int]:
        """The weighted lengths of the longer side and the shorter; (0, 0) when both sides are
        under SHORT_CHARS characters, where the ratio of two short lines says little."""
        if max(len(src), len(tgt)) < SHORT_CHARS:
            return 0, 0
        a, b = weighted_length(src), weighted_length(tgt)
        return max(a, b), min(a, b)

    def accept(self, score: tuple[int, int]) -> bool:
        """The longer at most `ratio` times the shorter."""
        longer, shorter = score
        return longer <= self.limit * max(shorter, 1)


class Markup(PairRule):
    """`markup`: a side with markup, a URL or site chrome (`_MARKUP`)."""

    name = "markup"

    def score(self, src: str, tgt: str) -> bool:
        """Whether a side holds markup (`_has_markup`)."""
        return _has_markup(src) or _has_markup(tgt)

    def accept(self, score: bool) -> bool:
        """Neither side does."""
        return not score


class LongWords(PairRule):
    """`long_words`: a word over N characters, on a side whose language writes with spaces."""

    name = "long_words"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.limit = config.long_words
        self.spaced = tuple(lang not in SPACELESS for lang in langs)

    def score(self, src: str, tgt: str) -> int:
        """The characters of the longest word of the sides judged (0: none)."""
        longest = 0
        for side, spaced in zip((src, tgt), self.spaced, strict=True):
            if spaced:
                longest = max(longest, max(map(len, side.split()), default=0))
        return longest

    def accept(self, score: int) -> bool:
        """At most `long_words`."""
        return score <= self.limit


class Digits(PairRule):
    """`digits`: sides that hold different digits 1-9 (a misaligned pair)."""

    name = "digits"

    def score(self, src: str, tgt: str) -> tuple[list[int], list[int]]:
        """The digits of each side (`_digits`)."""
        return _digits(src), _digits(tgt)

    def accept(self, score: tuple[list[int], list[int]]) -> bool:
        """The same digits on both sides."""
        return score[0] == score[1]


class Copy(PairRule):
    """`copy`: a target that (nearly) repeats the source."""

    name = "copy"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.share = config.copy_share

    def score(self, src: str, tgt: str) -> float:
        """The share of their distinct words the sides hold in common (`_shared_words`)."""
        return _shared_words(src, tgt)

    def accept(self, score: float) -> bool:
        """Under `copy_share`."""
        return score < self.share


class Script(PairRule):
    """`script`: a side under `script_share` of its letters in its language's script."""

    name = "script"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.share = config.script_share
        self.scripts = tuple(LANGUAGE_SCRIPTS.get(lang) for lang in langs)
        for lang, scripts in zip(langs, self.scripts, strict=True):
            if scripts is None:
                log.warning("data.filters.script: no script known for %s; not judged", lang)

    def score(self, src: str, tgt: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """(letters in its language's script, letters) of the source, then of the target."""
        return _script_letters(src, self.scripts[0]), _script_letters(tgt, self.scripts[1])

    def accept(self, score: tuple[tuple[int, int], tuple[int, int]]) -> bool:
        """Each side at least `script_share` in its script."""
        (own_src, letters_src), (own_tgt, letters_tgt) = score
        return own_src >= self.share * letters_src and own_tgt >= self.share * letters_tgt


class Langid(ChunkRule):
    """`langid`: a side py3langid finds unlikely in its language (a side under
    `langid_min_chars` non-space characters is not judged, one over `langid.JUDGED_CHARS`
    characters is judged on its first ones)."""

    name = "langid"

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.min_chars = config.langid_min_chars
        self.min_prob = config.langid_min_prob
        self.identifier = language_scores()
        for lang in langs:
            if not self.identifier.knows(lang):
                log.warning("data.filters.langid: py3langid does not know %s; not judged", lang)

    def score(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) float32 (the probabilities' own type, compared as they are): the least
        probability py3langid gives a side of a pair for its language (inf: no side judged)."""
        lines, langs, rows = [], [], []
        for side, lang in zip((src, tgt), self.langs, strict=True):
            if self.identifier.knows(lang):
                for i, line in enumerate(side):
                    if len(line) - line.count(" ") >= self.min_chars:
                        lines.append(line)
                        langs.append(lang)
                        rows.append(i)
        least = np.full(len(src), np.inf, dtype=np.float32)
        for start in range(0, len(lines), LANGID_BATCH):
            end = start + LANGID_BATCH
            prob = self.identifier.probability(lines[start:end], langs[start:end])
            np.fmin.at(least, rows[start:end], prob)
        return least

    def accept(self, scores: np.ndarray) -> np.ndarray:
        """At least `langid_min_prob`."""
        return scores >= self.min_prob


class Dedup(ChunkRule):
    """`dedup`: a pair equal (spaces aside) to one kept before in its corpus."""

    name = "dedup"
    in_order = True

    def __init__(self, config: FilterConfig, langs: tuple[str, str]) -> None:
        super().__init__(config, langs)
        self.seen = SeenHashes()  # of the corpus so far, in the process that reads it

    def score(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) uint64: the hash of each pair, its spaces collapsed."""
        return pair_hashes(src, tgt)

    def accept(self, scores: np.ndarray) -> np.ndarray:
        """Hashes not seen before in the corpus (nor earlier in `scores`); they are kept."""
        return self.seen.add_new(scores)


class Score(Rule):
    """`score`: a pair a model finds unlikely. It runs a model, so `attn-mt clean` builds it
    (`attn_mt.decode.pairscore.PairScore`) and calls it on the pairs the others kept."""

    name = "score"


def _digits(text: str) -> list[int]:
    """The digits 1-9 of `text` in order of value (any script's digits; zeros left out, so
    2.00 and 2, 1,000 and 1000 agree)."""
    found = _DIGIT.findall(text)
    return sorted(d for d in (unicodedata.digit(c) for c in found) if d) if found else []


def _shared_words(src: str, tgt: str) -> float:
    """The share of distinct words (case ignored) the two sides have in common, of the side
    with more; two sides without words compare whole."""
    a, b = set(_WORD.findall(src.casefold())), set(_WORD.findall(tgt.casefold()))
    if not a or not b:
        return float(a == b and src.strip() == tgt.strip())
    return len(a & b) / max(len(a), len(b))


def _script_letters(text: str, scripts: tuple[str, ...] | None) -> tuple[int, int]:
    """(letters of `scripts`, letters) of `text`; (0, 0) when it is not judged: its language's
    scripts unknown (None), or ASCII letters, all Latin."""
    if scripts is None or (text.isascii() and "Latin" in scripts):
        return 0, 0
    letters = _NOT_LETTER.sub("", text)
    return len(not_script_pattern(scripts).sub("", letters)), len(letters)


def _has_markup(text: str) -> bool:
    """Whether `text` holds markup, a URL or site chrome (`_MARKUP`); the characters every
    match needs are looked for first, which most lines lack."""
    hinted = any(mark in text for mark in ("<", "://", "www.", "@", "©", " | "))
    return hinted and _MARKUP.search(text) is not None
