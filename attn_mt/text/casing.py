"""Casing: each word's usual form in the training sources (the casing table), and lines
written in capitals or Title Case read in those forms before translation, their output cased
back.

A model trained on ordinary text breaks down on ALL CAPS (a letter a piece) and answers Title
Case in ordinary case; read in its usual forms, such a line translates as well as the line
people would have typed (docs/results.md, "Training for the text people type"). The table
holds, per lower-case word, its most frequent form in the training sources (`Mann`, `iPhone`,
`USA`, `mit`); a sentence's first word is not counted (its capital says nothing of the word),
and whether the sources start a sentence with a capital is kept.

A line is recased when it is ALL CAPS, in Title Case, or holds a run of at least two words in
capitals (`Achtung: HUND IM WASSER`), and only when the table changes it: a line in ordinary
case, or one the table would write as it is, reaches the model untouched. In a Title Case line
the words in capitals stay (acronyms, as `title_case` keeps them), and so do the words of a
run the table does not know (`BBQ USA`); an ALL CAPS line's unknown words take the form most
words seen once in the sources take (`rare_capital`): with a capital in German, where such words
are mostly nouns, in lower case in English.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

FORMAT = "attn-mt-casing/1"
# A sentence ends at a word ending in one of these; the next word starts one (not counted).
SENTENCE_END = ".!?…。！？"
# The most frequent words a language's table keeps: a large corpus's long tail of names and
# typos would otherwise grow the checkpoint by megabytes for lines it will never see.
MAX_WORDS = 200_000


_CORE = re.compile(r"[^\W_](?:.*[^\W_])?", re.DOTALL)  # from the first letter or digit to the last


def word_core(word: str) -> tuple[str, str, str]:
    """`word` as (leading punctuation, core, trailing punctuation): the core runs from the
    first letter or digit to the last (`„Hund“,` -> `„`, `Hund`, `“,`)."""
    found = _CORE.search(word)
    if found is None:
        return word, "", ""
    return word[: found.start()], found.group(), word[found.end() :]


def _sharp_s(low: str) -> list[str]:
    """The forms of a lower-case word with some `ss` written `ß` (upper case writes ß as SS),
    each `ss` either way, at most three of them."""
    parts = low.split("ss")
    if not 1 < len(parts) <= 4:
        return []
    forms = [parts[0]]
    for part in parts[1:]:
        forms = [form + joint + part for form in forms for joint in ("ss", "ß")]
    return [form for form in forms if form != low]


def _cased(core: str) -> bool:
    """Whether `core` holds a letter that has an upper and a lower case."""
    return core.lower() != core.upper()


def _capitals(core: str) -> bool:
    """A word written in capitals: cased letters, every one upper case."""
    return core.isupper()


def _capital_start(core: str) -> bool:
    """A word starting with a capital letter (a core starting with a digit has no case)."""
    return core[:1].isupper()


def title_case(line: str) -> str:
    """Every word's first letter in capitals, the rest untouched (`str.title` would lower
    the rest: 'iPhone' -> 'Iphone', "don't" -> "Don'T")."""
    return " ".join(word[:1].upper() + word[1:] for word in line.split(" "))


@dataclass
class CasingTable:
    """One language's usual forms: lower-case word -> its most frequent form;
    `capital_start`: the sources start a sentence with a capital; `rare_capital`: most words
    seen once start with a capital (the form a word the table lacks takes)."""

    words: dict[str, str] = field(default_factory=dict)
    capital_start: bool = True
    rare_capital: bool = False

    @classmethod
    def build(cls, lines: Iterable[str]) -> CasingTable:
        """The table of `lines` (training sources): each word's most frequent form, the words
        that start a sentence not counted; ties go to the form seen first."""
        forms: collections.Counter[str] = collections.Counter()
        starts = [0, 0]  # sentences starting in lower case, with a capital
        for line in lines:
            first = True
            for word in line.split():
                core = word_core(word)[1]
                if _cased(core):
                    if first:
                        starts[_capital_start(core)] += 1
                    else:
                        forms[core] += 1
                    first = False
                if word.rstrip("\"'”’»)]").endswith(tuple(SENTENCE_END)):
                    first = True
        best: dict[str, tuple[int, str]] = {}
        for form, count in forms.items():  # in order of first sight: the first form wins ties
            low = form.lower()
            if low not in best or count > best[low][0]:
                best[low] = (count, form)
        kept = sorted(best.items(), key=lambda item: -item[1][0])[:MAX_WORDS]
        once = [_capital_start(form) for count, form in best.values() if count == 1]
        rare_capital = 2 * sum(once) > len(once)
        return cls({low: form for low, (_, form) in kept}, starts[1] >= starts[0], rare_capital)

    def usual(self, word: str, unknown: bool = True) -> str:
        """`word` in its usual form, its punctuation kept; a word not in the table in lower
        case (with a capital where `rare_capital`), or as it is with `unknown` False."""
        lead, core, trail = word_core(word)
        low = core.lower()
        guess = (low[:1].upper() + low[1:] if self.rare_capital else low) if unknown else core
        found = self.words.get(low)
        for sharp in _sharp_s(low) if found is None else ():  # STRASSE: the table's Straße
            if (found := self.words.get(sharp)) is not None:
                break
        return lead + (found or guess) + trail

    def to_dict(self) -> dict[str, Any]:
        """Plain data (checkpoint, casing.json)."""
        return {
            "capital_start": self.capital_start,
            "rare_capital": self.rare_capital,
            "words": self.words,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CasingTable:
        return cls(dict(data["words"]), bool(data["capital_start"]), bool(data.get("rare_capital")))


def tables_to_dict(tables: dict[str, CasingTable]) -> dict[str, Any]:
    """Every source language's table as the checkpoint's `casing` entry holds it."""
    return {"format": FORMAT, "languages": {lang: t.to_dict() for lang, t in tables.items()}}


def tables_from_dict(data: dict[str, Any]) -> dict[str, CasingTable]:
    """The tables of a checkpoint's `casing` entry (`tables_to_dict`)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"casing table format {data.get('format')!r}, expected {FORMAT!r}")
    return {lang: CasingTable.from_dict(t) for lang, t in data["languages"].items()}


@dataclass
class Casing:
    """How a line was written: `line` "upper" (ALL CAPS), "title" (Title Case) or None, and
    the words (numbers in the line) of its runs in capitals, cased back by the alignment."""

    line: str | None = None
    words: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return self.line is not None or bool(self.words)


def detect(words: Sequence[str]) -> Casing:
    """How a line's words are written: ALL CAPS, Title Case (every cased word starting with a
    capital, at least two of them not in capitals), or in ordinary case with runs of at least
    two words in capitals (a lone word in capitals is an acronym: `BBQ`, `USA`)."""
    cores = [word_core(word)[1] for word in words]
    cased = [core for core in cores if _cased(core)]
    if not cased:
        return Casing()
    if all(_capitals(core) for core in cased):
        return Casing("upper")
    runs: list[list[int]] = [[]]
    for number, core in enumerate(cores):
        if _capitals(core) and sum(c.isalpha() for c in core) >= 2:
            runs[-1].append(number)
        elif _cased(core):
            runs.append([])
    if in_runs := frozenset(n for run in runs if len(run) >= 2 for n in run):
        return Casing(words=in_runs)
    titled = [core for core in cased if not _capitals(core)]  # words in capitals: acronyms
    if len(titled) >= 2 and all(_capital_start(core) for core in cased if core[0].isalpha()):
        return Casing("title")
    return Casing()


def recase(line: str, table: CasingTable) -> tuple[str, Casing]:
    """`line` in its words' usual forms where it is ALL CAPS, Title Case or holds runs in
    capitals (`detect`), and how it was written; the line itself, and no casing, where it is
    in ordinary case or the table would write it as it is."""
    words = line.split()
    casing = detect(words)
    if not casing:
        return line, casing
    if casing.line == "title":  # its words in capitals are acronyms, as title_case keeps them
        chosen = [n for n, word in enumerate(words) if not _capitals(word_core(word)[1])]
    else:
        chosen = sorted(casing.words) if casing.words else list(range(len(words)))
    written = list(words)
    starts = {0} | {n + 1 for n, w in enumerate(words) if w.rstrip("\"'”’»)]")[-1:] in SENTENCE_END}
    for number in chosen:
        usual = table.usual(words[number], unknown=casing.line == "upper")
        if number in starts and table.capital_start:
            lead, core, trail = word_core(usual)
            usual = lead + core[:1].upper() + core[1:] + trail
        written[number] = usual
    if written == words:
        return line, Casing()
    return " ".join(written), casing


def case_back(text: str, casing: Casing, alignment: Sequence[tuple[int, int]]) -> str:
    """The output `text` written as its source was: in capitals, in Title Case, or with the
    output words aligned to a run in capitals in capitals (`alignment`: Pharaoh pairs)."""
    if casing.line == "upper":
        return text.upper()
    if casing.line == "title":
        return title_case(text)
    upper = {target for source, target in alignment if source in casing.words}
    if not upper:
        return text
    words = text.split(" ")
    numbers = [n for n, w in enumerate(words) if w]  # the words as alignments count them
    for target in upper:
        if target < len(numbers):
            words[numbers[target]] = words[numbers[target]].upper()
    return " ".join(words)
