"""Validation during training: `Validator`, rank 0's validation at intervals (what it measures:
`measure.py`), its log lines and the checkpoints written after it, the loss alone between
validations, the attention plot within its share of the run's time (`PlotBudget`), and the
end of a run. With data.valid_general a second set is validated beside the run's own, never
selecting best.pt; a run started from a checkpoint then validates once before its first
update too (step 0), so every later line says how much of the general set it kept.

`Validator` runs it under `torch.random.fork_rng`, so validation never moves the training RNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attn_mt import distributed
from attn_mt.data.corpus import Corpus
from attn_mt.decode.translator import Translator
from attn_mt.train.clock import RunClock
from attn_mt.train.loglines import log_finish, log_general, log_timesheet, valid_share
from attn_mt.train.measure import Interrupted, LossSums, validate, validate_directions
from attn_mt.train.runlog import Monitor, RunLog, Validation
from attn_mt.train.state import TrainState, fork_rng
from attn_mt.train.stopping import StopSignals

log = logging.getLogger("attn_mt")

# The validation attention plot takes at most about this share of a run's wall time
# (`PlotBudget`); PLOT_GUESS is what its first drawing in a process, matplotlib's import
# included, is taken to cost before one was timed.
PLOT_SHARE = 0.02
PLOT_GUESS = 1.0


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
        self.valid_total = valid_total
        self.share = valid_share(len(corpus.valid_src), valid_total)  # said in the log lines
        self.best_share = self.share  # the sentences the best score so far was measured on
        self.plots = PlotBudget(PLOT_SHARE)
        self.loss_due = False  # the loss alone is due at the step last read (`loss_if_due`)

    def validate(self) -> Validation | None:
        """Validation loss/perplexity (teacher forcing) and the scores of the search output, of
        each direction and their mean for a multilingual run, then of data.valid_general
        (`Validation.general`), in the time the run's budget allows (`RunClock.allowance`,
        half of it for each set when there are two); on rank 0 (None on the other ranks,
        which search their share of the sentences)."""
        state, allowance = self.state, self.clock.allowance(self.state.cfg.train)
        translator, t, world = translator_of(state, self.dtype), state.cfg.train, state.world
        measure = validate_directions if self.corpus.pairs else validate
        watched = self.corpus.general
        own = allowance.part(2) if allowance and watched else allowance
        result = measure(translator, self.corpus, t, self._follow, world, own)
        if watched is not None:
            part = allowance.part(1) if allowance else None
            general = validate(translator, watched, t, self._follow_general, world, part)
            if result is not None and general is not None:
                result.general = general.metrics
        state.model.train()
        return result

    def _follow(self, phase: str, done: int, total: int) -> None:
        if self.signals.name:
            raise Interrupted
        self.monitor.validating(phase, done, total)

    def _follow_general(self, phase: str, done: int, total: int) -> None:
        self._follow(f"{phase} general", done, total)

    def at_step(self) -> float | None:
        """After an update: a validation at eval_every (`_timed_validation`); the seconds it
        took, None when none was due. The loss alone, when due, waits for `loss_if_due`."""
        t, progress = self.state.cfg.train, self.state.progress
        self.loss_due = t.checks_loss_alone(progress.step)
        if progress.step % t.eval_every:
            return None
        return self._timed_validation()

    def _timed_validation(self) -> float:
        """`validate_and_save`, timed on the run's clock (which then holds back as much time
        for the final one); the seconds it took."""
        progress = self.state.progress
        began = self.clock.now()
        self.clock.record(progress)
        self.validate_and_save()
        took = progress.validation_seconds = self.clock.now() - began
        self.clock.validated(took)
        return took

    def start_due(self) -> bool:
        """Whether the run validates before its first update: a new run from a checkpoint
        (train.init_from) with data.valid_general, whose later lines compare with it."""
        cfg, progress = self.state.cfg, self.state.progress
        new = progress.step == 0 and progress.last_valid_step < 0
        return new and cfg.train.init_from is not None and self.corpus.general is not None

    def loss_if_due(self) -> float:
        """What is due before the next update: the validation of a fine-tuned run's start
        (`start_due`), else the loss alone (`loss_at_interval`) if the update last read was
        due one; the loop asks once it knows the run goes on, as a run that stops there
        validates at that step, its loss included. The seconds it took on this rank (0 when
        nothing was due)."""
        if self.start_due():
            return self._timed_validation()
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
                    sums = LossSums()
                    sums.add(translator, corpus, t, self._follow)
                    figures.append(sums.figures())
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
                share = self._share_of(result)
                self.best_share = share if improved else self.best_share
                if step == 0 and result.general:  # a fine-tuned run's start: the reference
                    progress.general_start = result.general
                if improved:
                    progress.general_at_best = result.general
                start = progress.general_start if step else {}  # no change to say at step 0
                self.runlog.validation(step, result, improved, best, share, start)
        progress.last_valid_step = step
        with self.clock.phase("checkpoints"):
            state.save(best=improved, metrics=result.metrics if result else None)

    def _share_of(self, result: Validation) -> str:
        """What the log line says of the sentences `result` covers: a subset (`share`), or as
        many as max_minutes left time for."""
        validated = int(result.metrics.get("sentences", len(self.corpus.valid_src)))
        if validated >= len(self.corpus.valid_src):
            return self.share
        return valid_share(validated, self.valid_total, "all the time budget held")

    def _validate_and_plot(self, step: int) -> Validation | None:
        """`validate`, then the attention plot when its budget allows (`PlotBudget`); None on
        the ranks but rank 0, and where a signal abandoned the validation itself."""
        result = None
        try:  # on every rank: each searches its share of the sentences
            with fork_rng(self.state.device):
                result = self.validate()
                t = self.state.cfg.train
                if result is not None and self.plots.due() and self.clock.holds(self.plots.cost, t):
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
        log_finish(stopped_by, signal, step, t, progress.best_score, self.best_share)
        log_general(progress.general_start, progress.general_at_best, t.select_metric)
