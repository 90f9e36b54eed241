"""The rules of `data.filters`: which sentence pairs of a training corpus are noise.

A `PairFilter` holds one corpus's rules (its `FilterConfig` and its two languages) and judges a
chunk of pairs at once: each pair gets the code of the first rule that drops it (0: kept), the
rules tried in the order of `RULES`, the cheap ones first. py3langid runs on a chunk at once
(`attn_mt.langid.LanguageScores`). `dedup` needs the whole corpus: the judge gives the hash of
each pair it keeps (`pair_hashes`), and the one process that reads the corpus in order drops a
pair whose hash it has seen (`SeenHashes`, 8 bytes a pair). `score` runs a model: `attn-mt
clean` scores the pairs left (`attn_mt.decode.pairscore`).

Short lines and scripts other than Latin are the rules' hard cases: the length ratio judges
no pair whose sides are both under 20 characters, and counts a Han character 3 times and a
kana or Hangul one twice (about the Latin letters each carries); langid judges only sides of
`langid_min_chars` characters or more; a side whose language writes without spaces has no long
words; a side without letters has no script; the digits compared are 1-9 of any script.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from attn_mt.config.data import FilterConfig
from attn_mt.langid import language_scores

log = logging.getLogger("attn_mt")

# Every rule a pair can be dropped by, in the order they are tried; a pair's code is its rule's
# place here + 1 (0: kept). The text rules come first (`attn-mt clean` applies those), then the
# token rules of `prepare` (data.max_len, data.max_len_ratio), which need SentencePiece.
TEXT_RULES = (
    "empty",
    "max_chars",
    "ratio",
    "markup",
    "long_words",
    "digits",
    "copy",
    "script",
    "langid",
    "dedup",
    "score",
)
TOKEN_RULES = ("max_len", "max_len_ratio")
RULES = TEXT_RULES + TOKEN_RULES
CODE = {rule: code for code, rule in enumerate(RULES, start=1)}

# Markup, URLs and site chrome: an HTML/XML tag or comment, a URL, an e-mail address, a
# copyright sign, a menu bar ("Home | About | Contact"). Not an entity (&amp;): clean corpora
# hold them escaped (Multi30k does), and the pair is still a translation.
_MARKUP = re.compile(
    r"<[A-Za-z!/][^<>]{0,200}>"
    r"|\b(?:https?|ftp)://|\bwww\.[\w-]+\."
    r"|[\w.+-]+@[\w-]+\.[A-Za-z]{2,}"
    r"|©"
    r"|\s\|\s.*\s\|\s"
)
# Characters that carry more than a Latin letter: a Han character about three, a kana or Hangul
# one about two (the length ratio counts them so).
_HAN = re.compile("[\u2e80-\u2fdf\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_KANA_HANGUL = re.compile("[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\uac00-\ud7af]")
SHORT_CHARS = 20  # the ratio does not judge a pair whose sides are both shorter
_NOT_LETTER = re.compile(r"[\W\d_]")
_DIGIT = re.compile(r"\d")
_WORD = re.compile(r"\w+")

# Unicode blocks of each script (a block is close to a script and needs no table at run time).
_SCRIPT_BLOCKS = {
    "Latin": "A-Za-z\u00aa\u00ba\u00c0-\u024f\u0250-\u02af\u1d00-\u1dbf\u1e00-\u1eff"
    "\u2c60-\u2c7f\ua720-\ua7ff\uab30-\uab6f\ufb00-\ufb06\uff21-\uff3a\uff41-\uff5a",
    "Cyrillic": "\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f",
    "Greek": "\u0370-\u03ff\u1f00-\u1fff",
    "Armenian": "\u0530-\u058f",
    "Hebrew": "\u0590-\u05ff\ufb1d-\ufb4f",
    "Arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
    "Devanagari": "\u0900-\u097f\ua8e0-\ua8ff",
    "Bengali": "\u0980-\u09ff",
    "Gurmukhi": "\u0a00-\u0a7f",
    "Gujarati": "\u0a80-\u0aff",
    "Oriya": "\u0b00-\u0b7f",
    "Tamil": "\u0b80-\u0bff",
    "Telugu": "\u0c00-\u0c7f",
    "Kannada": "\u0c80-\u0cff",
    "Malayalam": "\u0d00-\u0d7f",
    "Sinhala": "\u0d80-\u0dff",
    "Thai": "\u0e00-\u0e7f",
    "Lao": "\u0e80-\u0eff",
    "Tibetan": "\u0f00-\u0fff",
    "Myanmar": "\u1000-\u109f",
    "Georgian": "\u10a0-\u10ff\u2d00-\u2d2f",
    "Hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "Ethiopic": "\u1200-\u139f",
    "Khmer": "\u1780-\u17ff",
    "Han": "\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\U00020000-\U0003134f",
    "Kana": "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
}
_LATIN = (
    "af az br bs ca cs cy da de en eo es et eu fi fo fr fy ga gd gl hr ht hu id is it jv ku "
    "la lb lt lv mg ms mt nb nl nn no oc pl pt qu ro rw sk sl so sq sv sw tl tr uz vi wa xh yo zu"
)
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    **{lang: ("Latin",) for lang in _LATIN.split()},
    **{
        lang: ("Cyrillic",) for lang in ["be", "bg", "kk", "ky", "mk", "mn", "ru", "tg", "tt", "uk"]
    },
    **{lang: ("Arabic",) for lang in ["ar", "fa", "ps", "sd", "ug", "ur"]},
    **{lang: ("Devanagari",) for lang in ["hi", "mr", "ne", "sa"]},
    "sr": ("Cyrillic", "Latin"),
    "el": ("Greek",),
    "hy": ("Armenian",),
    "he": ("Hebrew",),
    "yi": ("Hebrew",),
    "bn": ("Bengali",),
    "as": ("Bengali",),
    "pa": ("Gurmukhi",),
    "gu": ("Gujarati",),
    "or": ("Oriya",),
    "ta": ("Tamil",),
    "te": ("Telugu",),
    "kn": ("Kannada",),
    "ml": ("Malayalam",),
    "si": ("Sinhala",),
    "th": ("Thai",),
    "lo": ("Lao",),
    "bo": ("Tibetan",),
    "dz": ("Tibetan",),
    "my": ("Myanmar",),
    "ka": ("Georgian",),
    "am": ("Ethiopic",),
    "km": ("Khmer",),
    "ko": ("Hangul", "Han"),
    "zh": ("Han",),
    "ja": ("Han", "Kana"),
}
# Languages written without spaces between words: a line is one long "word".
SPACELESS = frozenset(["zh", "ja", "th", "lo", "km", "my", "bo", "dz"])


def base_language(lang: str) -> str:
    """The language of a code, without its region or script: `pt_BR` -> `pt`."""
    return lang.split("_")[0]


class PairFilter:
    """One corpus's rules (`FilterConfig`) for its source and target languages."""

    def __init__(self, config: FilterConfig, src_lang: str, tgt_lang: str):
        self.config = config
        self.langs = (base_language(src_lang), base_language(tgt_lang))
        self._checks = self._pair_checks()
        self._scores = language_scores() if config.langid else None
        for lang in self.langs:
            if config.script and lang not in LANGUAGE_SCRIPTS:
                log.warning("data.filters.script: no script known for %s; not judged", lang)
            if self._scores and not self._scores.knows(lang):
                log.warning("data.filters.langid: py3langid does not know %s; not judged", lang)

    def _pair_checks(self) -> list[tuple[int, Callable[[str, str], bool]]]:
        """(code, check) of each rule on in the config that looks at one pair at a time."""
        c = self.config
        checks: dict[str, Callable[[str, str], bool] | None] = {
            "empty": lambda s, t: not s.strip() or not t.strip(),
            "max_chars": (lambda s, t: max(len(s), len(t)) > c.max_chars) if c.max_chars else None,
            "ratio": (lambda s, t: _over_ratio(s, t, c.ratio)) if c.ratio else None,
            "markup": (lambda s, t: _has_markup(s) or _has_markup(t)) if c.markup else None,
            "long_words": self._long_words if c.long_words else None,
            "digits": (lambda s, t: _digits(s) != _digits(t)) if c.digits else None,
            "copy": (lambda s, t: _shared_words(s, t) >= c.copy_share) if c.copy else None,
            "script": self._off_script if c.script else None,
        }
        return [(CODE[rule], check) for rule, check in checks.items() if check is not None]

    def judge(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) uint8: the code of the first rule (`RULES`) that drops each pair, 0 if kept;
        dedup is left to the reader of the corpus (`pair_hashes`, `SeenHashes`)."""
        codes = np.zeros(len(src), dtype=np.uint8)
        for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
            for code, check in self._checks:
                if check(s, t):
                    codes[i] = code
                    break
        if self._scores is not None:
            self._judge_languages(src, tgt, codes)
        return codes

    def _long_words(self, src: str, tgt: str) -> bool:
        longest = self.config.long_words
        return any(
            lang not in SPACELESS and max(map(len, side.split()), default=0) > longest
            for side, lang in ((src, self.langs[0]), (tgt, self.langs[1]))
        )

    def _off_script(self, src: str, tgt: str) -> bool:
        """Whether a side's letters are under `script_share` in its language's script."""
        for side, lang in ((src, self.langs[0]), (tgt, self.langs[1])):
            scripts = LANGUAGE_SCRIPTS.get(lang)
            if scripts is None or (side.isascii() and "Latin" in scripts):
                continue  # no script known; or ASCII letters, all Latin
            letters = _NOT_LETTER.sub("", side)
            own = len(_not_script_pattern(scripts).sub("", letters))
            if own < self.config.script_share * len(letters):
                return True
        return False

    def _judge_languages(self, src: Sequence[str], tgt: Sequence[str], codes: np.ndarray) -> None:
        """Give `langid`'s code to the pairs kept so far with a side py3langid finds unlikely
        in its language (a side under `langid_min_chars` non-space characters is not judged)."""
        assert self._scores is not None
        lines, langs, rows = [], [], []
        for side, lang in zip((src, tgt), self.langs, strict=True):
            if self._scores.knows(lang):
                for i in np.flatnonzero(codes == 0).tolist():
                    if len(side[i]) - side[i].count(" ") >= self.config.langid_min_chars:
                        lines.append(side[i])
                        langs.append(lang)
                        rows.append(i)
        for start in range(0, len(lines), 512):  # a batch's scores stay in the cache
            end = start + 512
            prob = self._scores.probability(lines[start:end], langs[start:end])
            off = np.asarray(rows[start:end])[prob < self.config.langid_min_prob]
            codes[off] = CODE["langid"]


def _over_ratio(src: str, tgt: str, limit: float) -> bool:
    """Whether the longer side has over `limit` times the characters of the other (a Han
    character counted 3 times, a kana or Hangul one twice); never when both sides are under
    SHORT_CHARS characters, where the ratio of two short lines says little."""
    if max(len(src), len(tgt)) < SHORT_CHARS:
        return False
    a, b = _weighted_length(src), _weighted_length(tgt)
    return max(a, b) > limit * max(min(a, b), 1)


def _weighted_length(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text) + 2 * len(_HAN.findall(text)) + len(_KANA_HANGUL.findall(text))


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


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def _not_script_pattern(scripts: tuple[str, ...]) -> re.Pattern[str]:
    """One character of none of `scripts` (removing them leaves the scripts' characters)."""
    if scripts not in _PATTERNS:
        _PATTERNS[scripts] = re.compile("[^" + "".join(_SCRIPT_BLOCKS[s] for s in scripts) + "]")
    return _PATTERNS[scripts]


def _has_markup(text: str) -> bool:
    """Whether `text` holds markup, a URL or site chrome (`_MARKUP`); the characters every
    match needs are looked for first, which most lines lack."""
    hinted = any(mark in text for mark in ("<", "://", "www.", "@", "©", " | "))
    return hinted and _MARKUP.search(text) is not None


# ---------------------------------------------------------------------------------------------
# Repeated pairs


def pair_hashes(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """(N,) uint64: a hash of each pair, its spaces collapsed (blake2b: the same on every
    machine and in every process)."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(
                    f"{' '.join(s.split())}\t{' '.join(t.split())}".encode(), digest_size=8
                ).digest(),
                "little",
            )
            for s, t in zip(src, tgt, strict=True)
        ),
        dtype=np.uint64,
        count=len(src),
    )


class SeenHashes:
    """A set of 64-bit hashes, 8 bytes each: sorted arrays of sizes that halve (a log-structured
    merge), so adding N hashes costs O(N log N) in all and a lookup a binary search a level."""

    def __init__(self) -> None:
        self._levels: list[np.ndarray] = []  # sorted, largest first

    def __len__(self) -> int:
        return sum(map(len, self._levels))

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """(N,) bool: which of `hashes` were not seen before (nor earlier in `hashes`); those
        are added."""
        unique, first = np.unique(hashes, return_index=True)
        new = np.ones(len(unique), dtype=bool)
        for level in self._levels:
            found = np.minimum(np.searchsorted(level, unique), len(level) - 1)
            new &= level[found] != unique
        fresh = np.zeros(len(hashes), dtype=bool)
        fresh[first[new]] = True
        level = unique[new]
        while self._levels and len(self._levels[-1]) <= len(level):
            level = np.sort(np.concatenate([self._levels.pop(), level]), kind="stable")
        if len(level):
            self._levels.append(level)
        return fresh
