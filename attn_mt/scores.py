"""Corpus scores with sacreBLEU: BLEU and chrF of detokenized text, with their signatures.

A low module (sacreBLEU and errors only), so that validation (`train/`), the exports' model
card (`decode/`) and `evaluate` score alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF

from attn_mt.errors import UserError


@dataclass
class Scores:
    """Corpus-level figures and the sacreBLEU signatures that make them reproducible."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int

    def to_dict(self) -> dict:
        """Plain dict, for `--json` and metrics.jsonl."""
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  ({self.sentences} sentences)\n"
            f"BLEU signature: {self.bleu_signature}\nchrF signature: {self.chrf_signature}"
        )


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU BLEU (13a tokenizer, cased) and chrF of detokenized hypotheses."""
    if len(hypotheses) != len(references):
        raise UserError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must align"
        )
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(
        bleu=bleu_score.score,
        chrf=chrf_score.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        sentences=len(hypotheses),
    )
