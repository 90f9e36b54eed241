"""The agreement check of `export --format ct2`: the folder, loaded by CTranslate2 as a user
loads it, against attn-mt's greedy search on the fixed sample of the parity checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attn_mt.decode.generate import max_output_lengths
from attn_mt.decode.translator import Translator
from attn_mt.export.hf_parity import models_only, random_sources
from attn_mt.model.vocab import EOS_ID

# The share of the sample's greedy outputs that must be identical. A wrong mapping of a weight
# agrees on next to none; rounding (int8, float16 weights, or float32 products summed in another
# order) changes a few outputs where two pieces are nearly tied.
AGREEMENT_BAR = 0.75


@dataclass
class Agreement:
    """How many of the sample's greedy outputs CTranslate2 and attn-mt share."""

    sentences: int
    same: int

    @property
    def needed(self) -> int:
        """The fewest identical outputs that pass: AGREEMENT_BAR of the sample."""
        return math.ceil(AGREEMENT_BAR * self.sentences)

    @property
    def ok(self) -> bool:
        return self.same >= self.needed

    def __str__(self) -> str:
        return (
            f"greedy {self.same}/{self.sentences} outputs identical to attn-mt's "
            f"(at least {self.needed} needed)"
        )


@torch.no_grad()
def check_agreement(
    engine_module, translator: Translator, folder: Path, options: dict[str, Any]
) -> Agreement:
    """Load `folder` with `engine_module` (the ctranslate2 package) on the CPU and translate
    the parity checks' random sources greedily with `options` (`translate_batch` keywords that
    search as ours), each under its own output limit (ours, a * S + b with <eos>;
    CTranslate2's `max_decoding_length` counts no </s>); compare the pieces with
    `Translator.translate_nbest`'s at beam 1.

    Both read the ids `Translator.encode` gives each text (a multilingual model's with the tag
    of its first target language): the exported source.model is our own SentencePiece model.
    """
    translator = models_only(translator)
    engine = engine_module.Translator(str(folder), device="cpu")
    cfg, lang = translator.config.decode, translator.target_languages[0]
    texts = random_sources(translator)
    sample = [(t, ids) for t, ids in zip(texts, translator.encode(texts, lang), strict=True) if ids]
    same = 0
    for text, ids in sample:
        src = torch.tensor([ids + [EOS_ID]])  # (1, S)
        limits = max_output_lengths(src, cfg.max_len_a, cfg.max_len_b, translator.max_output_len)
        [[ours]] = translator.translate_nbest([text], beam=1, tgt_lang=lang)
        [theirs] = engine.translate_batch(
            [translator.src_tokenizer.pieces(ids)],
            beam_size=1,
            max_decoding_length=max(int(limits[0]) - 1, 1),  # no </s>
            **options,
        )
        same += theirs.hypotheses[0] == translator.tgt_tokenizer.pieces(ours.tokens)
    return Agreement(len(sample), same)
