"""Validation during training: the loss and perplexity by teacher forcing, BLEU and chrF of the
search output, and a few samples to show (`validate`); `Validator`, rank 0's validation at
intervals, and the checkpoints written after it.

`Validator` runs it under `torch.random.fork_rng`, so validation never moves the training RNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from attn_mt.config import TrainConfig
from attn_mt.data.batching import collate, length_batches
from attn_mt.decode.translator import Translator
from attn_mt.precision import autocast_context
from attn_mt.scores import score
from attn_mt.train.corpus import Corpus
from attn_mt.train.directions import validate_directions
from attn_mt.train.loglines import valid_share
from attn_mt.train.loss import SmoothedObjective, perplexity
from attn_mt.train.runlog import Monitor, RunLog, Validation
from attn_mt.train.state import TrainState

log = logging.getLogger("attn_mt")

# train.select_metric -> whether a higher value is better
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}


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
    objective = SmoothedObjective(translator.model, t.label_smoothing)
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
            objective.tokens = batch.num_tgt_tokens
            batch_loss, batch_nll = objective(batch.src, batch.tgt_in, batch.tgt_out)
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

    advance(0)  # the search's bar replaces the finished loss bar before its first batch
    start = time.perf_counter()
    hyps = translator.translate(
        corpus.valid_src, beam=t.eval_beam, on_batch=advance, tgt_lang=corpus.valid_tgt_lang
    )
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
    return Validation(metrics, samples, seconds, hypotheses=hyps)


class Interrupted(Exception):
    """A signal came during validation."""


class Validator:
    """Rank 0's validation at intervals during training, its log lines, and the checkpoints
    written after it on every rank (best.pt when the score of train.select_metric improved).

    A signal (`stop_signal()` not None) abandons a validation, so last.pt is written at once:
    torchrun kills its workers 30 s after it forwards a SIGTERM.
    """

    def __init__(
        self,
        state: TrainState,
        corpus: Corpus,
        valid_total: int,
        translator: Callable[[torch.dtype | None], Translator],  # in that dtype (None: default)
        dtype: torch.dtype | None,  # training's, which validation runs in
        monitor: Monitor,
        stop_signal: Callable[[], str | None],
    ):
        self.state, self.corpus, self.valid_total = state, corpus, valid_total
        self.translator, self.dtype = translator, dtype
        self.monitor, self.stop_signal = monitor, stop_signal

    def validate(self) -> Validation:
        """Validation loss/perplexity (teacher forcing) and BLEU/chrF of search output."""
        translator, t = self.translator(self.dtype), self.state.cfg.train
        if self.corpus.pairs:  # multilingual: each direction, and their mean
            result = validate_directions(validate, translator, self.corpus, t, self._follow)
        else:
            result = validate(translator, self.corpus, t, self._follow)
        self.state.model.train()
        return result

    def _follow(self, phase: str, done: int, total: int) -> None:
        if self.stop_signal():
            raise Interrupted
        self.monitor.validating(phase, done, total)

    def validate_and_save(self, runlog: RunLog) -> None:
        """Validate on rank 0, log it, and write the checkpoints (best.pt if it improved)."""
        state, progress = self.state, self.state.progress
        step, metric = progress.step, state.cfg.train.select_metric
        result: Validation | None = None
        improved = False
        if state.world.is_main:
            device = state.device
            try:
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    result = self.validate()
                    start = time.perf_counter()
                    plotted = next(iter(self.corpus.pairs.values()), self.corpus)
                    runlog.attention(
                        step,
                        lambda: self.translator(None),
                        plotted.valid_src,
                        plotted.valid_tgt_lang,
                    )
                    result.seconds["plot"] = time.perf_counter() - start
            except Interrupted:
                log.warning("%s: validation at step %d abandoned", self.stop_signal(), step)
            state.model.train()
        if result is not None:
            improved = progress.record(result.metrics[metric], HIGHER_IS_BETTER[metric])
            best = (metric, progress.best_score)
            runlog.validation(step, result, improved, best, self.share())
        progress.last_valid_step = step
        state.save(best=improved, metrics=result.metrics if result else None)

    def share(self) -> str:
        """Which share of the validation split is validated on, for the log."""
        return valid_share(len(self.corpus.valid_src), self.valid_total)
