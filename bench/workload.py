"""The WMT workload without WMT data: a synthetic corpus with WMT's sentence lengths, and the
configs of the model sizes timed on it.

Lengths in subword tokens: the source follows a lognormal of newstest2014 en-de's summary
under a joint 32k BPE vocabulary, a mean of ~27 pieces with a long tail past 100; sigma 0.5 in
log space puts the median at 24, the 99th percentile at 76 and the 99.9th at 111. It is that
summary's curve, not a fit to the newstest file itself (no copy was at hand offline). Targets
are the source length times a lognormal ratio (median 1.05, German a little longer), and
pairs are cleaned as fairseq's `prepare-wmt14en2de.sh` cleans them: 1..250 tokens a side,
length ratio at most 1.5. Token ids are uniform over the vocabulary's non-special ids, drawn
per sentence from (seed, index) when a batch asks for them, so millions of pairs cost only
their lengths.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_mt.config.file import config_from_dict, load_config
from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch, collate, length_batches
from attn_mt.model.vocab import EOS_ID
from attn_mt.train.speed import vary_batch_shape
from bench.common import ROOT, SIZES

MEAN_SOURCE, SIGMA = 27.0, 0.5  # source pieces: mean, log-space spread
RATIO_MEDIAN, RATIO_SIGMA = 1.05, 0.15  # target / source length
MAX_LEN, MAX_RATIO = 250, 1.5  # fairseq's clean-corpus-n.perl settings for WMT14 en-de


def wmt_lengths(pairs: int, seed: int = 0) -> np.ndarray:
    """(pairs, 2) source and target lengths in subword tokens, without <bos>/<eos>."""
    rng = np.random.default_rng(seed)
    mu = np.log(MEAN_SOURCE) - SIGMA**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    src = np.clip(np.rint(rng.lognormal(mu, SIGMA, pairs)), 1, MAX_LEN)  # (N,)
    ratio = np.clip(rng.lognormal(np.log(RATIO_MEDIAN), RATIO_SIGMA, pairs), 1 / MAX_RATIO,
                    MAX_RATIO)  # fmt: skip
    tgt = np.clip(np.rint(src * ratio), 1, MAX_LEN)  # (N,)
    return np.stack([src, tgt], axis=1).astype(np.int64)


class RandomSentences(Sequence):
    """Sentences of given lengths whose ids are uniform over [EOS_ID + 1, vocab), the same
    ids each time sentence i is read."""

    def __init__(self, lengths: np.ndarray, vocab: int, seed: int):
        self.lengths, self.vocab, self.seed = lengths, vocab, seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]  # ints only, no slices
        rng = np.random.default_rng((self.seed, int(i)))
        return rng.integers(EOS_ID + 1, self.vocab, int(self.lengths[i])).tolist()


def timed_batches(
    lengths: np.ndarray, vocab: int, batch_tokens: int, window: int, warmup: int, device
) -> tuple[dict[str, list[Batch]], list[Batch]]:
    """The batches a WMT-workload timing runs, from pairs of `lengths` in attn-mt's length
    buckets of `batch_tokens`: `fixed`, one typical batch (the middle bucket's) `window` times,
    the ceiling; `bucketed`, `window` batches drawn at random, the real figure. Then the
    warm-up's: every timed shape once, then more until `warmup` (a new shape's first step can
    cost far more than a step: kernel choice, allocator growth). The batches' dimensions are
    marked dynamic as a compiled training run marks them: one graph for all."""
    src_ids = RandomSentences(lengths[:, 0], vocab, seed=1)
    tgt_ids = RandomSentences(lengths[:, 1], vocab, seed=2)
    rows = length_batches(lengths, batch_tokens)
    pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
    bucketed = [collate(src_ids, tgt_ids, rows[i]).to(device) for i in pick[:window]]
    middle = collate(src_ids, tgt_ids, rows[len(rows) // 2]).to(device)
    for batch in (middle, *bucketed):
        vary_batch_shape(batch)
    warm = list(itertools.islice(itertools.cycle([middle, *bucketed]),
                                 max(warmup, 1 + len(bucketed))))  # fmt: skip
    return {"fixed": [middle] * window, "bucketed": bucketed}, warm


def wmt_dropout() -> dict[str, float | None]:
    """The WMT workload's dropout keys, configs/wmt14_en_de_base.yaml's: Vaswani et al.'s base
    (0.1 on embeddings and sub-layer outputs only; big en-de used 0.3)."""
    m = load_config(ROOT / "configs" / "wmt14_en_de_base.yaml").model
    return {k: getattr(m, k) for k in ("dropout", "activation_dropout", "attention_dropout")}


def sized_config(path: str | Path, size: str, wmt: bool, **train: Any) -> Config:
    """The config at `path` with its model at `size` (SIZES), the WMT workload's dropout
    where `wmt`, and `train` keys over its own."""
    raw = load_config(path).to_dict()
    raw["model"].update(SIZES[size])
    if wmt:
        raw["model"].update(wmt_dropout())
    raw["train"].update(train)
    return config_from_dict(raw)
