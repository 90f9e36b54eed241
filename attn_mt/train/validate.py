"""Validation during training: the loss and perplexity by teacher forcing, BLEU and chrF of the
search output, and a few samples to show.

The caller runs it under `torch.random.fork_rng`, so validation never moves the training RNG.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attn_mt.config import TrainConfig
from attn_mt.data.batching import collate, length_batches
from attn_mt.decode.translator import Translator
from attn_mt.precision import autocast_context
from attn_mt.scores import score
from attn_mt.train.corpus import Corpus
from attn_mt.train.loss import label_smoothed_loss, perplexity

# train.select_metric -> whether a higher value is better
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}


@dataclass
class Validation:
    """What one validation measured."""

    metrics: dict[str, float]  # loss, ppl, bleu, chrf, sentences
    samples: list[tuple[str, str, str]]  # (source, hypothesis, reference) to show
    seconds: dict[str, float] = field(default_factory=dict)  # per phase: loss, search, score


@torch.no_grad()
def validate(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None] = lambda phase, done, total: None,
) -> Validation:
    """Validate `translator.model` on the corpus's validation split (in the translator's device
    and dtype); `on_progress(phase, done, total)` follows the sentences scored ("loss") and
    translated ("search"). Leaves the model in eval mode.
    """
    model = translator.model
    # Summed on the device in float64 (as Python floats would be), read once at the end: a
    # read per batch would make the CPU wait for a GPU each time.
    start = time.perf_counter()
    sums = torch.zeros(2, dtype=torch.float64, device=translator.device)  # loss, nll
    tokens = 0
    lengths = [
        (len(s) + 1, len(r) + 1)
        for s, r in zip(corpus.valid_src_ids, corpus.valid_tgt_ids, strict=True)
    ]
    scored = 0
    with autocast_context(translator.device, translator.dtype):
        for rows in length_batches(lengths, t.batch_tokens):
            batch = collate(corpus.valid_src_ids, corpus.valid_tgt_ids, rows)
            batch = batch.to(translator.device)
            logits = model(batch.src, batch.tgt_in)
            batch_loss, batch_nll = label_smoothed_loss(logits, batch.tgt_out, t.label_smoothing)
            sums += torch.stack([batch_loss, batch_nll]).double()
            tokens += batch.num_tgt_tokens
            scored += len(rows)
            on_progress("loss", scored, len(lengths))
    loss, nll = sums.tolist()
    seconds = {"loss": time.perf_counter() - start}
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        on_progress("search", done, len(corpus.valid_src))

    start = time.perf_counter()
    hyps = translator.translate(corpus.valid_src, beam=t.eval_beam, on_batch=advance)
    seconds["search"] = time.perf_counter() - start
    start = time.perf_counter()
    scores = score(hyps, corpus.valid_ref)
    seconds["score"] = time.perf_counter() - start
    metrics = {
        "loss": loss / max(tokens, 1),
        "ppl": perplexity(nll, tokens),
        "bleu": scores.bleu,
        "chrf": scores.chrf,
        "sentences": len(corpus.valid_src),
    }
    samples = list(zip(corpus.valid_src, hyps, corpus.valid_ref, strict=True))[: t.samples]
    return Validation(metrics, samples, seconds)
