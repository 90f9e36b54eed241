"""Language identification with py3langid (langid.py's model, shipped with the package): the
off-target rate of a multilingual model, and the probability of a language for many lines at
once (`LanguageScores`, the `langid` rule of `data.filters`).

The off-target rate is the share of a model's outputs that are not in the language asked for.
Its identifier chooses among the model's own languages only: the failure it measures is a
model answering in another language it knows (e.g. English asked for French), and short
sentences identified among ~100 languages are too often taken for a third one.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np


def _code(lang: str) -> str:
    """The ISO 639-1 code py3langid knows a language by: `pt_BR` -> `pt`."""
    return lang.split("_")[0]


@lru_cache(maxsize=8)
def _identifier(languages: tuple[str, ...]) -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier.set_languages([lang for lang in languages if lang in identifier.nb_classes])
    return identifier


def off_target_rate(outputs: Sequence[str], lang: str, languages: Sequence[str]) -> float | None:
    """Percent of the non-blank `outputs` identified as another of `languages` than `lang`;
    None when there is nothing to judge or py3langid does not know `lang`."""
    codes = tuple(sorted({_code(x) for x in [*languages, lang]}))
    identifier = _identifier(codes)
    if _code(lang) not in identifier.nb_classes or len(identifier.nb_classes) < 2:
        return None
    judged = [line for line in outputs if line.strip()]
    if not judged:
        return None
    wrong = sum(identifier.classify(line)[0] != _code(lang) for line in judged)
    return 100 * wrong / len(judged)


class LanguageScores:
    """py3langid's naive Bayes run over many lines at once, among all its languages.

    py3langid walks a line's UTF-8 bytes through an automaton whose states emit n-gram
    features, then scores sum(log(1 + count_f) * log P(f | lang)) + log P(lang). Here the walk
    steps every line of a batch together (one numpy step per byte position) and the scores
    are one gather and one sum per batch: the same scores as `classify`, several times faster.
    `probability` normalizes them as py3langid's `norm_probs` does (scores / sqrt(bytes),
    then softmax).
    """

    def __init__(self) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        model = LanguageIdentifier.from_model_file(MODEL_FILE)
        self.languages = list(model.nb_classes)  # a language may own two columns (scripts)
        row_start = np.asarray(model.tk_row, dtype=np.int64) << 8  # a state's 256 moves
        next_state = np.frombuffer(model.tk_nextmove, dtype=np.uint32).astype(np.int64)
        self._first = int(row_start[0])  # the start state's row
        self._next_start = row_start[next_state]  # the move's target, as its row start
        self._next_feature = np.asarray(model.tk_output, dtype=np.int64)[next_state]
        self._feature_scores = np.asarray(model.nb_ptc, dtype=np.float32)  # (F, L)
        self._prior = np.asarray(model.nb_pc, dtype=np.float32)  # (L,)

    def knows(self, lang: str) -> bool:
        """Whether py3langid has the language `lang` (a code such as de or pt_BR)."""
        return _code(lang) in self.languages

    def probability(self, lines: Sequence[str], lang: str) -> np.ndarray:
        """(N,) the probability py3langid gives `lang` for each line (the same for every
        language where a line has no features, e.g. an empty one)."""
        data = [_bytes(line) for line in lines]
        scores = self._scores(data)  # (N, L)
        scores /= np.sqrt(np.maximum([len(d) for d in data], 1))[:, None]
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        columns = [i for i, name in enumerate(self.languages) if name == _code(lang)]
        return probs[:, columns].sum(axis=1)

    def _scores(self, data: list[bytes]) -> np.ndarray:
        """(N, L) naive Bayes log scores of UTF-8 lines; a line without features scores 0."""
        count = len(data)
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=count)
        order = np.argsort(-lengths, kind="stable")  # longest first: live lines lead
        width = int(lengths.max(initial=0))
        grid = np.zeros((width, count), dtype=np.int64)  # (W, N) byte p of line n
        live_at = np.arange(width)[:, None] < lengths[order][None, :]
        grid.T[live_at.T] = np.frombuffer(b"".join(data[i] for i in order), dtype=np.uint8)
        state = np.full(count, self._first, dtype=np.int64)  # each line's state, as its row
        rows, features = [], []
        for position in range(width):
            live = int(live_at[position].sum())  # lines sorted by length: a prefix is live
            move = state[:live] + grid[position, :live]
            state[:live] = self._next_start[move]
            emitted = self._next_feature[move]
            hits = np.flatnonzero(emitted >= 0)
            rows.append(order[hits])
            features.append(emitted[hits])
        feature_count = len(self._feature_scores)
        keys = np.concatenate([np.zeros(0, np.int64), *rows]) * feature_count
        keys += np.concatenate([np.zeros(0, np.int64), *features])
        pairs, counts = np.unique(keys, return_counts=True)  # sorted by line
        line, feature = pairs // feature_count, pairs % feature_count
        weighted = np.log1p(counts.astype(np.float32))[:, None] * self._feature_scores[feature]
        scores = np.zeros((count, len(self.languages)), dtype=np.float32)
        if len(line):
            starts = np.flatnonzero(np.r_[True, line[1:] != line[:-1]])
            scores[line[starts]] = np.add.reduceat(weighted, starts, axis=0) + self._prior
        return scores


def _bytes(line: str) -> bytes:
    """A line as py3langid reads it: an all-capitals line lower-cased, NFC, UTF-8."""
    line = line.lower() if line.isupper() else line
    return unicodedata.normalize("NFC", line).encode("utf-8", errors="surrogatepass")


@lru_cache(maxsize=1)
def language_scores() -> LanguageScores:
    """The one `LanguageScores` of this process (its tables take a second to load)."""
    return LanguageScores()
