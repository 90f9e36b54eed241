"""The `score` rule of `data.filters`: how likely a model finds a pair, by the forced decoding of
`attn-mt score` (`attn_mt.decode.forced`), with a model of the opposite direction the dual
conditional cross-entropy of Junczys-Dowmunt (2018), as bicleaner-style pipelines use it.

    H_fwd = -log P(target | source) / target tokens      H_bwd = -log P(source | target) / ...
    H = |H_fwd - H_bwd| + (H_fwd + H_bwd) / 2            (H_fwd alone without a backward model)
    score = exp(-H), in (0, 1]: a pair is dropped under `score_min`

A translation both models find likely scores high; a misaligned pair (another sentence's
target) is unlikely both ways, and a pair only one model likes is penalized by |H_fwd - H_bwd|.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attn_mt.configdata import FilterConfig
from attn_mt.decode.forced import score_lines
from attn_mt.decode.translator import load
from attn_mt.errors import UserError


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

    def scores(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) exp(-H) of each pair."""
        entropy = self.forward.cross_entropy(src, tgt)
        if self.backward is not None:
            backward = self.backward.cross_entropy(tgt, src)
            entropy = np.abs(entropy - backward) + (entropy + backward) / 2
        return np.exp(-entropy)

    def drops(self, src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
        """(N,) bool: the pairs that score under `score_min`."""
        return self.scores(src, tgt) < self.minimum


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
