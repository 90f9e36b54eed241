"""Validation during training: the loss and perplexity by teacher forcing, BLEU and chrF of the
search output, and a few samples to show (`validate`); a multilingual run's directions each on
their own, with their off-target rate, and their mean (`validate_directions`); the search
shared among torchrun ranks (`shared_search`); and `Validator`, rank 0's validation at
intervals and the checkpoints written after it.

`Validator` runs it under `torch.random.fork_rng`, so validation never moves the training RNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attn_mt import distributed
from attn_mt.config import TrainConfig
from attn_mt.data.batching import collate, length_batches
from attn_mt.data.corpus import Corpus
from attn_mt.decode.translator import Translator
from attn_mt.langid import off_target_rate
from attn_mt.model.loss import SmoothedObjective, perplexity
from attn_mt.precision import autocast_context
from attn_mt.scores import STRING_METRICS, score
from attn_mt.train.budget import RunClock, StopSignals
from attn_mt.train.runlog import (
    Monitor,
    RunLog,
    Validation,
    log_finish,
    log_timesheet,
    valid_share,
)
from attn_mt.train.state import TrainState, fork_rng
from attn_mt.world import World

log = logging.getLogger("attn_mt")

# The figures a multilingual run averages over its directions (`sentences` is summed).
MEAN_KEYS = ("loss", "ppl", *STRING_METRICS, "off_target")
# The validation attention plot takes at most about this share of a run's wall time
# (`PlotBudget`); PLOT_GUESS is what its first drawing in a process, matplotlib's import
# included, is taken to cost before one was timed.
PLOT_SHARE = 0.02
PLOT_GUESS = 1.0


class Interrupted(Exception):
    """A signal came during validation."""


@torch.no_grad()
def validate(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
    world: World,
) -> Validation:
    """Validate `translator.model` on the corpus's validation split (in the translator's device
    and dtype); `on_progress(phase, done, total)` follows the sentences scored ("loss") and
    translated ("search"). Leaves the model in eval mode. Under torchrun, on rank 0 while the
    other ranks run `search_share`: each rank searches a slice of the sentences.
    """
    figures, seconds = validation_loss(translator, corpus, t, on_progress)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count * world.size  # about: the ranks go at the same pace
        on_progress("search", min(done, len(corpus.valid_src)), len(corpus.valid_src))

    advance(0)  # the search's bar replaces the finished loss bar before its first batch
    start = time.perf_counter()
    hyps = search_share(translator, corpus, t, advance, world)
    seconds["search"] = time.perf_counter() - start
    start = time.perf_counter()
    scores = score(hyps, corpus.valid_ref, t.scored_metrics())
    seconds["score"] = time.perf_counter() - start
    metrics = figures | scores.values | {"sentences": len(corpus.valid_src)}
    samples = list(zip(corpus.valid_src, hyps, corpus.valid_ref, strict=True))[: t.samples]
    return Validation(metrics, samples, seconds, hypotheses=hyps)


@torch.no_grad()
def validation_loss(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
) -> tuple[dict[str, float], dict[str, float]]:
    """The validation split's loss (label-smoothed, per target token) and perplexity by
    teacher forcing, and the seconds it took ({"loss": s})."""
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
    figures = {"loss": loss / max(tokens, 1), "ppl": perplexity(nll, tokens)}
    return figures, {"loss": time.perf_counter() - start}


def search_share(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_batch: Callable[[int], None],
    world: World,
) -> list[str]:
    """The validation sentences translated, this rank searching its share (`shared_search`)."""

    def search(sentences: list[str]) -> list[str]:
        return translator.translate(
            sentences, beam=t.eval_beam, on_batch=on_batch, tgt_lang=corpus.valid_tgt_lang
        )

    return shared_search(search, corpus.valid_src, world)


def validate_directions(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
    world: World,
) -> Validation:
    """`validate` each direction of a multilingual `corpus.pairs`; the result's metrics are their
    mean (which picks best.pt and stops early as a bilingual run's one figure does) and its
    `pairs` each direction's own figures, with the off-target rate: the share of outputs not in
    the language asked for."""
    languages = translator.config.data.target_languages()
    languages += [src for src, _ in translator.config.data.directions()]
    per_pair: dict[str, dict[str, float]] = {}
    samples: list[tuple[str, str, str]] = []
    seconds: dict[str, float] = {}
    for pair, direction in corpus.pairs.items():
        result = validate(translator, direction, t, on_progress, world)
        tgt_lang = str(direction.valid_tgt_lang)
        rate = off_target_rate(result.hypotheses, tgt_lang, languages)
        per_pair[pair] = result.metrics | ({"off_target": rate} if rate is not None else {})
        samples += result.samples[:1]
        for phase, took in result.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + took
    metrics = {
        name: sum(m[name] for m in per_pair.values()) / len(per_pair)
        for name in MEAN_KEYS
        if all(name in m for m in per_pair.values())
    }
    metrics["sentences"] = sum(m["sentences"] for m in per_pair.values())
    return Validation(metrics, samples[: max(t.samples, 0)], seconds, pairs=per_pair)


def shared_search(
    search: Callable[[list[str]], list[str]], sentences: list[str], world: World
) -> list[str]:
    """`search(sentences)`, each rank searching its slice; the whole output on every rank, in
    order, for rank 0 to score. Rank r takes sentences r, r + size, r + 2 size, ...: sentences
    of every length on every rank, so the ranks finish at about the same time. Greedy and beam
    search translate a sentence the same way whatever else is in its batch (tests/unit/decode
    hold batched == one at a time), so the output is the one a single process would give.

    A search `Interrupted` on one rank is `Interrupted` on every rank, raised after the gather,
    so that the ranks' collectives stay paired (the checkpoint written next gathers too).
    """
    if not world.distributed:
        return search(sentences)
    mine: list[str] | None
    try:
        mine = search(sentences[world.rank :: world.size])
    except Interrupted:
        mine = None
    shares = distributed.gather(mine, world)
    hyps = [""] * len(sentences)
    for rank, share in enumerate(shares):
        if share is None:
            raise Interrupted
        hyps[rank :: world.size] = share
    return hyps


@dataclass
class PlotBudget:
    """When a validation draws the attention plot: when the plot's expected seconds (the last
    plot's, PLOT_GUESS before the first) are at most `share` of the time since the last plot, or
    since the run began. So the plots take about `share` of the wall time at most: a run of
    seconds draws none (a first plot would be a good part of it), while the default run, which
    validates every few minutes, draws one at every validation."""

    share: float
    clock: Callable[[], float] = time.perf_counter
    cost: float = PLOT_GUESS
    since: float = field(init=False)

    def __post_init__(self) -> None:
        self.since = self.clock()

    def due(self) -> bool:
        return self.cost <= self.share * (self.clock() - self.since)

    def spent(self, seconds: float) -> None:
        """A plot was drawn, in `seconds`, ending now."""
        self.since, self.cost = self.clock(), seconds


def translator_of(state: TrainState, dtype: torch.dtype | None = None) -> Translator:
    """A `Translator` of the weights that validate (`TrainState.eval_model`: the EMA when kept),
    in `dtype` (None: float32)."""
    src_tok, tgt_tok = state.tokenizers
    return Translator(state.eval_model, state.cfg, src_tok, tgt_tok, state.device, dtype)


class Validator:
    """Rank 0's validation at intervals during training, its log lines, and the checkpoints
    written after it on every rank (best.pt when the score of train.select_metric improved);
    at the end of a run, the last validation and checkpoints (`finish`). A run builds it once
    its log and clock exist.

    A signal abandons a validation, so last.pt is written at once: torchrun kills its workers
    30 s after it forwards a SIGTERM.
    """

    def __init__(
        self,
        state: TrainState,
        corpus: Corpus,
        valid_total: int,  # sentences of the whole validation split, `corpus` a subset of it
        dtype: torch.dtype | None,  # training's, which validation runs in
        monitor: Monitor,
        signals: StopSignals,
        runlog: RunLog,
        clock: RunClock,
    ):
        self.state, self.corpus, self.dtype = state, corpus, dtype
        self.monitor, self.signals, self.runlog, self.clock = monitor, signals, runlog, clock
        self.share = valid_share(len(corpus.valid_src), valid_total)  # said in the log lines
        self.plots = PlotBudget(PLOT_SHARE)
        self.loss_due = False  # the loss alone is due at the step last read (`loss_if_due`)

    def validate(self) -> Validation | None:
        """Validation loss/perplexity (teacher forcing) and BLEU/chrF of search output, on
        rank 0, of each direction and their mean for a multilingual run (None on the other
        ranks, which search their share of each direction's sentences)."""
        state, result = self.state, None
        translator, t, world = translator_of(state, self.dtype), state.cfg.train, state.world
        if not world.is_main:
            for corpus in list(self.corpus.pairs.values()) or [self.corpus]:
                search_share(translator, corpus, t, self._check_signal, world)
        elif self.corpus.pairs:  # multilingual: each direction, and their mean
            result = validate_directions(translator, self.corpus, t, self._follow, world)
        else:
            result = validate(translator, self.corpus, t, self._follow, world)
        state.model.train()
        return result

    def _follow(self, phase: str, done: int, total: int) -> None:
        self._check_signal()
        self.monitor.validating(phase, done, total)

    def _check_signal(self, _sentences: int = 0) -> None:
        if self.signals.name:
            raise Interrupted

    def at_step(self) -> float | None:
        """After an update: a validation at eval_every (`validate_and_save`, timed on the run's
        clock, which then holds back as much time for the final one); the seconds it took,
        None when none was due. The loss alone, when due, waits for `loss_if_due`."""
        t, progress = self.state.cfg.train, self.state.progress
        self.loss_due = t.checks_loss_alone(progress.step)
        if progress.step % t.eval_every:
            return None
        began = self.clock.now()
        progress.elapsed = self.clock.elapsed()
        self.validate_and_save()
        took = progress.validation_seconds = self.clock.now() - began
        self.clock.validated(took)
        return took

    def loss_if_due(self) -> float:
        """The loss alone (`loss_at_interval`) if the update last read was due one; the loop
        asks once it knows the run goes on, as a run that stops there validates at that step,
        its loss included. The seconds it took on this rank (0 when none was due)."""
        due, self.loss_due = self.loss_due, False
        if not due:
            return 0.0
        with self.clock.phase("loss only"):
            return self.loss_at_interval()

    def loss_at_interval(self) -> float:
        """The validation loss alone, at valid_loss_every between validations: on rank 0 (the
        mean of the directions' for a multilingual run), logged, neither selecting nor saving
        a checkpoint; the other ranks go on and wait for it in the next update's all-reduce.
        Returns its seconds on this rank."""
        began = time.perf_counter()
        if not self.state.world.is_main:
            return 0.0
        translator, t = translator_of(self.state, self.dtype), self.state.cfg.train
        figures = []
        try:
            with fork_rng(self.state.device):
                for corpus in list(self.corpus.pairs.values()) or [self.corpus]:
                    figures.append(validation_loss(translator, corpus, t, self._follow)[0])
        except Interrupted:  # the loop's next check of the signal stops the run
            figures = []
        self.state.model.train()
        took = time.perf_counter() - began
        if figures:
            mean = {key: sum(f[key] for f in figures) / len(figures) for key in figures[0]}
            self.runlog.validation_loss(self.state.progress.step, mean, took, self.share)
        return took

    def validate_and_save(self) -> None:
        """Validate on rank 0, log it, and write the checkpoints (best.pt if it improved);
        each part timed as a `clock.phase`."""
        state, progress = self.state, self.state.progress
        step, metric = progress.step, state.cfg.train.select_metric
        improved = False
        with self.clock.phase("validation"):
            result = self._validate_and_plot(step)
            if result is not None:
                improved = progress.record(result.metrics[metric], state.cfg.train.higher_is_better)
                best = (metric, progress.best_score)
                self.runlog.validation(step, result, improved, best, self.share)
        progress.last_valid_step = step
        with self.clock.phase("checkpoints"):
            state.save(best=improved, metrics=result.metrics if result else None)

    def _validate_and_plot(self, step: int) -> Validation | None:
        """`validate`, then the attention plot when its budget allows (`PlotBudget`); None on
        the ranks but rank 0, and where a signal abandoned the validation itself."""
        result = None
        try:  # on every rank: each searches its share of the sentences
            with fork_rng(self.state.device):
                result = self.validate()
                if result is not None and self.plots.due():
                    start = time.perf_counter()
                    shown = next(iter(self.corpus.pairs.values()), self.corpus)
                    translator = translator_of(self.state)
                    self.runlog.attention(step, translator, shown.valid_src, shown.valid_tgt_lang)
                    result.seconds["plot"] = time.perf_counter() - start
                    self.plots.spent(result.seconds["plot"])
        except Interrupted:  # a plot interrupted keeps its validation
            if self.state.world.is_main:
                log.warning("%s: validation at step %d abandoned", self.signals.name, step)
        self.state.model.train()
        return result

    def finish(self, stopped_by: str) -> None:
        """End a run: a stopped run saves last.pt; a finished one validates unless it just did.
        Returns once the checkpoints are on disk and every rank is here."""
        state, progress, clock = self.state, self.state.progress, self.clock
        step = progress.step
        if progress.skipped:
            log.info("%d updates skipped for NaN/inf so far", progress.skipped)
        if stopped_by != "signal" and progress.last_valid_step != step:
            self.validate_and_save()  # and its checkpoints
        elif stopped_by != "signal" or state.saved_step != step:
            # (a signal's last.pt may be written already, by an interrupted validation)
            with clock.phase("checkpoints"):
                state.save(best=False)
        with clock.phase("checkpoints"):
            state.writer.wait()
        distributed.barrier(state.world)  # no rank leaves before rank 0 has written last.pt
        log_timesheet(clock.timesheet())
        t, signal = state.cfg.train, self.signals.name
        log_finish(stopped_by, signal, step, t, progress.best_score, self.share)
