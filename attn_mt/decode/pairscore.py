"""The `score` rule of `data.filters`: how likely a model finds a pair, by the forced decoding of
`attn-mt score` (`attn_mt.decode.forced`), with a model of the opposite direction the dual
conditional cross-entropy of Junczys-Dowmunt (2018), as bicleaner-style pipelines use it.

    H_fwd = -log P(target | source) / target tokens      H_bwd = -log P(source | target) / ...
    H = |H_fwd - H_bwd| + (H_fwd + H_bwd) / 2            (H_fwd alone without a backward model)
    score = exp(-H), in (0, 1]: a pair is dropped under `score_min`

A translation both models find likely scores high; a misaligned pair (another sentence's
target) is unlikely both ways, and a pair only one model likes is penalized by |H_fwd - H_bwd|.

The scale depends on the models: the same clean pairs score lower under a less trained model,
so one `score_min` does not suit every model (docs/results.md#the-score-rules-scale). So
`PairScore` counts the scores it judged in a histogram (bounded memory) and `clean` prints their
quantiles: the `score_min` that would have dropped 1%, 5%, ... of the pairs scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attn_mt.config.data import FilterConfig
from attn_mt.decode.forced import score_lines
from attn_mt.decode.load import load
from attn_mt.errors import UserError

BINS = 1000  # of the score histogram, on [0, 1]: quantiles to 0.001
QUANTILES = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)


def pair_scores(forward: np.ndarray, backward: np.ndarray | None = None) -> np.ndarray:
    """exp(-H) from the cross-entropies per token H_fwd (and H_bwd): the module's formula."""
    if backward is not None:
        forward = np.abs(forward - backward) + (forward + backward) / 2
    return np.exp(-forward)


class PairScore:
    """exp(-H) of pairs under a config's `score` model (and `score_backward`)."""

    def __init__(self, rules: FilterConfig, src_lang: str, tgt_lang: str, device: str = "auto"):
        assert rules.score is not None  # a corpus whose rules score
        self.minimum = rules.score_min
        self.forward = _Direction(rules.score, "score", src_lang, tgt_lang, device)
        self.backward = (
            _Direction(rules.score_backward, "score_backward", tgt_lang, src_lang, device)
            if rules.score_backward
            else None
        )
        self.histogram = np.zeros(BINS, dtype=np.int64)  # the scores `drops` judged, by bin
        self.dropped = 0  # pairs `drops` dropped

    def scores(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) exp(-H) of each pair."""
        backward = None if self.backward is None else self.backward.cross_entropy(tgt, src)
        return pair_scores(self.forward.cross_entropy(src, tgt), backward)

    def quantiles(self, shares: Sequence[float] = QUANTILES) -> list[tuple[float, float]]:
        """(share, threshold): the least score_min (to 1 / BINS) under which at least `share`
        of the pairs `drops` judged fall; [] before any."""
        total = int(self.histogram.sum())
        if not total:
            return []
        below = np.cumsum(self.histogram)  # below[i]: scores under (i + 1) / BINS
        return [(s, (int(np.searchsorted(below, s * total)) + 1) / BINS) for s in shares]

    def summary(self) -> str:
        """One line: the pairs scored, the score_min for each share, the share score_min drops."""
        total = int(self.histogram.sum())
        where = ", ".join(f"{100 * s:g}% under {t:.3f}" for s, t in self.quantiles())
        return (
            f"score: {total:,} pairs scored: {where}; score_min {self.minimum:g} dropped "
            f"{100 * self.dropped / max(total, 1):.1f}% of them"
        )

    def drops(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) bool: the pairs that score under `score_min`; their scores counted for
        `quantiles` and `summary`."""
        scores = self.scores(src, tgt)
        self.histogram += np.bincount(
            np.minimum((scores * BINS).astype(np.int64), BINS - 1), minlength=BINS
        )
        drops = scores < self.minimum
        self.dropped += int(drops.sum())
        return drops


class _Direction:
    """A model that must translate `src_lang` -> `tgt_lang` (one of a multilingual model's)."""

    def __init__(self, path: str, key: str, src_lang: str, tgt_lang: str, device: str):
        self.translator = load(path, device=device)
        data = self.translator.config.data
        if (src_lang, tgt_lang) not in data.directions():
            raise UserError(
                f"data.filters.{key}: {path} translates {data.in_words()}; this corpus needs "
                f"{src_lang} -> {tgt_lang}"
            )
        self.tgt_lang = tgt_lang if data.language_tags() else None

    def cross_entropy(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) -log P(tgt | src) per token (pieces and </s>) of each pair."""
        scored = score_lines(self.translator, src, tgt, tgt_lang=self.tgt_lang)
        return np.array([-pair.normalized for pair in scored])
