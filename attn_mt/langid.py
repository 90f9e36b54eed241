"""Language identification with py3langid (langid.py's model, shipped with the package): the
off-target rate of a multilingual model, the probability of a language for many lines at
once (`LanguageScores`, the `langid` rule of `data.filters`), and the languages a server's text
may be in (`identify`).

A text is judged on its first `JUDGED_CHARS` characters: the evidence py3langid needs is in
far fewer, and the time and memory of a judgment stay bounded whatever the line (the byte
grid of `LanguageScores` grows with a batch's longest line).

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

JUDGED_CHARS = 1000  # of a text, the characters judged: its first ones


def judged_part(text: str) -> str:
    """The part of `text` its language is judged on: its first `JUDGED_CHARS` characters."""
    return text[:JUDGED_CHARS]


def identify(text: str) -> list[tuple[str, float]]:
    """Every language py3langid knows, with its probability for `text` (judged on its first
    `JUDGED_CHARS` characters), likeliest first."""
    identifier = _identifier(None)
    return [(lang, float(p)) for lang, p in identifier.rank(judged_part(text))]


def base_code(lang: str) -> str:
    """The ISO 639-1 code py3langid knows a language by: `pt_BR` -> `pt`."""
    return lang.split("_")[0]


def known(lang: str) -> bool:
    """Whether py3langid knows the language `lang` (a code such as de or pt_BR)."""
    return base_code(lang) in _identifier(None).nb_classes


@lru_cache(maxsize=8)
def _identifier(languages: tuple[str, ...] | None) -> Any:
    """py3langid's identifier with normalized probabilities, among `languages` (None: all)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if languages is not None:
        identifier.set_languages([lang for lang in languages if lang in identifier.nb_classes])
    return identifier


def off_target_rate(outputs: Sequence[str], lang: str, languages: Sequence[str]) -> float | None:
    """Percent of the non-blank `outputs` identified as another of `languages` than `lang`;
    None when there is nothing to judge or py3langid does not know `lang`."""
    codes = tuple(sorted({base_code(x) for x in [*languages, lang]}))
    identifier = _identifier(codes)
    if base_code(lang) not in identifier.nb_classes or len(identifier.nb_classes) < 2:
        return None
    judged = [line for line in outputs if line.strip()]
    if not judged:
        return None
    wrong = sum(identifier.classify(judged_part(line))[0] != base_code(lang) for line in judged)
    return 100 * wrong / len(judged)


class LanguageScores:
    """py3langid's naive Bayes run over many lines at once, among all its languages.

    py3langid walks a line's UTF-8 bytes through an automaton whose states emit n-gram
    features, then scores sum(log(1 + count_f) * log P(f | lang)) + log P(lang). Here the walk
    steps every line of a batch together (one numpy step per byte position) and the sums are
    one weighted bag of table rows per line (torch's `embedding_bag`): the same scores as
    `classify`, several times faster.
    `probability` normalizes them as py3langid's `norm_probs` does (scores / sqrt(bytes),
    then softmax).
    """

    def __init__(self) -> None:
        import torch  # embedding_bag sums a line's table rows, far faster than numpy's gather + sum
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        model = LanguageIdentifier.from_model_file(MODEL_FILE)
        self.languages = list(model.nb_classes)  # a language may own two columns (scripts)
        row_start = np.asarray(model.tk_row, dtype=np.int32) << 8  # a state's 256 moves
        next_state = np.frombuffer(model.tk_nextmove, dtype=np.uint32)
        self._first = int(row_start[0])  # the start state's row
        self._next_start = row_start[next_state]  # the move's target, as its row start
        self._next_feature = np.asarray(model.tk_output, dtype=np.int32)[next_state]
        self._feature_scores = torch.from_numpy(np.asarray(model.nb_ptc, dtype=np.float32))
        self._prior = np.asarray(model.nb_pc, dtype=np.float32)  # (L,)

    def knows(self, lang: str) -> bool:
        """Whether py3langid has the language `lang` (a code such as de or pt_BR)."""
        return base_code(lang) in self.languages

    def probability(self, lines: Sequence[str], langs: Sequence[str]) -> np.ndarray:
        """(N,) the probability py3langid gives language `langs[i]` for line `lines[i]`, judged
        on its first `JUDGED_CHARS` characters (the same for every language where a line has
        no features, e.g. an empty one)."""
        if not lines:
            return np.zeros(0, dtype=np.float32)
        data = [_bytes(judged_part(line)) for line in lines]
        scores = self._scores(data)  # (N, L)
        scores /= np.sqrt(np.maximum([len(d) for d in data], 1))[:, None]
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        asked = sorted(set(langs))
        columns = np.array([[name == base_code(lang) for name in self.languages] for lang in asked])
        return (probs * columns[np.searchsorted(asked, langs)]).sum(axis=1)

    def _scores(self, data: list[bytes]) -> np.ndarray:
        """(N, L) naive Bayes log scores of UTF-8 lines; a line without features scores 0."""
        import torch

        count = len(data)
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=count)
        width = int(lengths.max(initial=0))
        grid = np.zeros((width, count), dtype=np.int32)  # (W, N) byte p of line n
        live = np.arange(width)[:, None] < lengths[None, :]  # (W, N)
        grid.T[live.T] = np.frombuffer(b"".join(data), dtype=np.uint8)
        state = np.full(count, self._first, dtype=np.int32)  # each line's state, as its row
        emitted = np.empty((width, count), dtype=np.int32)  # (W, N) feature at byte p, or -1
        for position in range(width):  # a line past its end walks on; what it emits is dropped
            move = state + grid[position]
            state = self._next_start[move]
            emitted[position] = self._next_feature[move]
        hits = live & (emitted >= 0)
        feature_count = self._feature_scores.shape[0]
        keys = np.nonzero(hits)[1].astype(np.int64) * feature_count + emitted[hits]
        pairs, counts = np.unique(keys, return_counts=True)  # sorted by line
        line, feature = pairs // feature_count, pairs % feature_count
        # sum_f log(1 + count_f) * log P(f | lang) of each line: a weighted bag of table rows,
        # on one thread (a batch is small: more threads only wait on each other)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            bags = torch.nn.functional.embedding_bag(
                torch.from_numpy(feature),
                self._feature_scores,
                torch.from_numpy(np.searchsorted(line, np.arange(count))),
                mode="sum",
                per_sample_weights=torch.from_numpy(np.log1p(counts.astype(np.float32))),
            ).numpy()  # (N, L)
        finally:
            torch.set_num_threads(threads)
        has_features = np.zeros(count, dtype=bool)
        has_features[line] = True
        return np.where(has_features[:, None], bags + self._prior, np.float32(0))


def _bytes(line: str) -> bytes:
    """A line as py3langid reads it: an all-capitals line lower-cased, NFC, UTF-8."""
    line = line.lower() if line.isupper() else line
    return unicodedata.normalize("NFC", line).encode("utf-8", errors="surrogatepass")


@lru_cache(maxsize=1)
def language_scores() -> LanguageScores:
    """The one `LanguageScores` of this process (its tables take a second to load)."""
    return LanguageScores()
