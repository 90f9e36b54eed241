"""The training loop: `Trainer` runs a run that `setup.py` built: its updates (`UpdateStep`),
validations and saves at intervals (`validate.Validator`), until a stopping rule fires
(torchtune's recipe shape: `setup`, then `train`). Beside it: the run's set-up (`setup.py`),
state and checkpoints (`state.py`), the learning rate (`schedule.py`), the run's time
(`clock.py`), the stopping rules (`stopping.py`), skipped updates (`skips.py`), logs
(`runlog.py`, `loglines.py`), validation (`validate.py`), what the updates run through
(`speed.py`); the loss is the model's (`model/loss.py`).

Exact resume rests on three facts: the batch source's position is a function of (seed, epoch,
index), the learning rate a function of the step (and with a time-driven schedule of the
run's time, which last.pt keeps), and last.pt holds every RNG and optimizer state;
validation runs under `torch.random.fork_rng`, so it never moves the training RNG.
The run's clock is wall time (validations included, and earlier processes' time on resume):
max_minutes bounds the whole run, and a time-driven schedule anneals exactly as it ends.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.config.schema import TrainConfig
from attn_mt.data.batching import Batch
from attn_mt.data.corpus import Corpus
from attn_mt.model.loss import SmoothedObjective
from attn_mt.precision import DTYPES
from attn_mt.train import speed
from attn_mt.train.clock import RunClock
from attn_mt.train.loglines import TrainWindow, log_start, window_line
from attn_mt.train.memory import out_of_memory_hint, probe_largest_batch
from attn_mt.train.runlog import Monitor, RunLog
from attn_mt.train.schedule import chosen_lr, learning_rates
from attn_mt.train.skips import SkipRule, Update
from attn_mt.train.state import TrainProgress, TrainState, WeightEMA
from attn_mt.train.stopping import RankAgreement, StopSignals, stop_rules
from attn_mt.train.validate import Validator
from attn_mt.world import World


@dataclass
class TrainResult:
    """How a run ended."""

    step: int
    best_score: float | None  # of `select_metric`
    select_metric: str
    stopped_by: str
    out_dir: Path
    stop_signal: str | None = None  # SIGINT or SIGTERM when stopped_by is "signal"


class Trainer:
    """One training run, its parts built by `setup.setup`: `run` opens the run's log, begins
    (the parts that need it: the start-up lines, the largest batch tried on a GPU, compiled or
    eager, the run's clock, the validator), trains with `update` until a stopping rule fires,
    and has the validator validate and save once more (`Validator.finish`)."""

    def __init__(
        self,
        state: TrainState,
        corpus: Corpus,
        valid_total: int,
        precision: str,
        step: UpdateStep,
        signals: StopSignals,
        skips: SkipRule,
        agreement: RankAgreement,
        monitor: Monitor,
        began: float,
        now: Callable[[], float],
        resumed: bool,
    ):
        self.state, self.cfg, self.world, self.device = state, state.cfg, state.world, state.device
        self.corpus, self.valid_total = corpus, valid_total  # validated on: a subset of the total
        self.precision, self.dtype = precision, DTYPES[precision]
        self.step, self.objective = step, step.objective
        self.signals, self.skips, self.agreement = signals, skips, agreement
        self.monitor, self.resumed = monitor, resumed
        self.began, self.now = began, now  # the run's time counts its set-up; tests fake `now`
        self.out = Path(self.cfg.train.out_dir)
        self.src_tok, self.tgt_tok = state.tokenizers
        self.model, self.ema, self.optimizer = state.model, state.ema, state.optimizer
        self.scaler, self.source = state.scaler, state.source
        self.window, self.taken = TrainWindow(), True  # the updates read since the last log
        self.line: tuple[str, dict[str, float]] = ("", {})  # the last read update's figures

    @property
    def progress(self) -> TrainProgress:
        """Where training stands (saved in last.pt)."""
        return self.state.progress

    def run(self) -> TrainResult:
        """Train until max_steps / max_minutes / max_epochs / early stopping / a signal."""
        t = self.cfg.train
        with self._session() as runlog, out_of_memory_hint(t):
            log_start(runlog, self.state, self.corpus, self.precision, self.resumed)
            probe_largest_batch(self.model, self.source, self.dtype, t.label_smoothing)
            batches = [self._place(b) for b in self.source.first_batches(t.accumulate)]
            self.step.forward = speed.choose_compiled(
                self.step.forward, t.compile, self.progress, batches, self.world
            )
            self.clock = RunClock.of(self.began, self.progress, self.now)
            self.validator = Validator(
                self.state, self.corpus, self.valid_total, self.dtype, self.monitor,
                self.signals, runlog, self.clock,
            )  # fmt: skip
            stopped_by = self._train()
            self.validator.finish(stopped_by)
        p, signal_name = self.progress, self.signals.name
        return TrainResult(p.step, p.best_score, t.select_metric, stopped_by, self.out, signal_name)

    @contextlib.contextmanager
    def _session(self) -> Iterator[RunLog]:
        """What a run holds while it trains, released however it ends: the signal handlers,
        and on rank 0 train.log, TensorBoard and metrics.jsonl."""
        resume_step = self.progress.step if self.resumed else None
        try:
            with (
                self.signals.installed(),
                RunLog(self.out, self.world.is_main, resume_step) as runlog,
            ):
                self.runlog = runlog
                yield runlog
        finally:
            # DDP's reducer holds the process group: let it go with the run, so that
            # `distributed.teardown` really destroys the group (see there).
            self.step.forward = speed.Forward(self.objective, self.objective, self.dtype)

    def _train(self) -> str:
        """Updates until a stopping rule fires (its name is returned), each read one update
        later unless it must be read at once (`read_at_once`)."""
        t = self.cfg.train
        self.source.prepare(t.accumulate, self._place)
        pending: Pending | None = None  # launched, not read yet
        while not (stopped_by := self._stop_reason()):
            self.window.pause(self.validator.loss_if_due())
            lrs = self._set_lr(pending)
            launched = replace(self.update(), lrs=lrs, after_pending=pending is not None)
            if pending is not None:
                self._read(pending)
            pending = launched
            if read_at_once(self.progress.step + 1, t, self.scaler is not None):
                self._read(pending, last=True)
                pending = None
        if pending is not None:
            self._read(pending, last=True)
        if self.window.updates:  # a run shorter than log_every has its curves too
            self.runlog.training(self.progress.step, *self.line)
        self.clock.record(self.progress)
        return stopped_by

    def _stop_reason(self) -> str:
        """Which stopping rule fires before the next update ('' if none); agreed by all ranks
        (`stopping.RankAgreement`: folded into the last update's all-reduce, or one of its own)."""
        rules = self._stop_rules()
        if self.world.distributed:
            rules = self.agreement.settle(rules, self.clock.schedule_seconds(self.cfg.train))
        return next((name for name, hit in rules.items() if hit), "")

    def _stop_rules(self) -> dict[str, bool]:
        signalled, epochs_done = self.signals.name is not None, self.source.epochs_done
        return stop_rules(self.cfg.train, self.progress, signalled, self.clock, epochs_done)

    def _read(self, pending: Pending, last: bool = False) -> None:
        """Read an update launched earlier: count its step (or the skip), follow it in the
        live line and the logs, and validate when due (`Validator.at_step`). `last`: nothing was
        launched after it, so the optimizer's lr becomes this update's as a float."""
        t = self.cfg.train
        update, agreed = pending.read()
        if self.world.distributed:
            self.agreement.take(agreed)
        lr, step = pending.lr(self.taken), self.progress.step + 1
        if last:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.taken = self.skips.accept(update, step)
        if not self.taken:
            self.progress.skipped += 1
            return
        self.progress.step = step
        self.window.add(update.loss, update.nll, update.tokens, update.grad_norm)
        self.line = window_line(step, self.window, lr, t, self.clock, self.source, self.device)
        eta = self.clock.remaining(t, step, self.source.epochs_run)
        self.monitor.training(self.line[0], self.clock.elapsed(), eta)
        if step % t.log_every == 0:
            self.runlog.training(step, *self.line)
            self.window = TrainWindow()
        took = self.validator.at_step()  # None: no validation was due
        if took is not None:
            self.agreement.forget()  # rank 0 alone knows whether a validation improved
            self.window.pause(took)  # tokens/s counts training only

    def _set_lr(self, before: Pending | None) -> tuple[float, float]:
        """Give the optimizer the next update's learning rate; return it for the two cases of
        `before` (the update launched before it, not read yet): taken, skipped."""
        t = self.cfg.train
        makes = self.progress.step + 1 + (before is not None)  # its step, if all are taken
        seconds = self.clock.launch(t, makes % t.eval_every == 0, self.agreement.agreed(t))
        lrs = learning_rates(self.progress.step + 1, t, seconds, before is not None)
        lr = chosen_lr(lrs, before.finite if before else None, self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lrs

    def update(self) -> Pending:
        """One optimizer update over `accumulate` batches on every rank (`UpdateStep`),
        launched and not read (`_read` reads it). Nothing here waits for the GPU: the next
        update's batches are made and copied meanwhile, and under torchrun the stopping rules
        and the clock travel with the update's all-reduce."""
        t = self.cfg.train
        batches = [self._place(self.source.next()) for _ in range(t.accumulate)]  # prepared
        tokens, sums = self.step.backward(batches)
        self.source.prepare(t.accumulate, self._place)  # the next update's, while the GPU works
        shared: list[float] = []
        if self.world.distributed:
            shared = self.agreement.figures(self._stop_rules(), self.clock.schedule_seconds(t))
        return Pending(*self.step.apply(tokens, sums, shared))

    def _place(self, batch: Batch) -> Batch:
        """`batch` on the training device (a batch already there stays as it is)."""
        return batch.to(self.device)


class UpdateStep:
    """One optimizer update over a list of batches, the step `Trainer.update` runs; public so
    that a benchmark times the trainer's own update on its own model and batches:

        step = UpdateStep(SmoothedObjective(model, 0.1), make_optimizer(model, cfg.train))
        figures, taken = step.apply(*step.backward(batches))

    The loss is normalised by the target tokens of all batches on all ranks, so the update does
    not depend on how a batch is split (DDP averages gradients, hence `* world size`); under
    torchrun that count is all-reduced during the first batch's forward pass, which never waits
    for it (why not after the backward: docs/distributed.md). Nothing waits for the GPU: a
    NaN/inf skips the step on the device (the fused optimizer's `found_inf`, and the EMA's).
    """

    def __init__(
        self,
        objective: SmoothedObjective,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None = None,
        ema: WeightEMA | None = None,
        clip_norm: float = 0.0,  # 0: not clipped
        world: World = World(),
        dtype: torch.dtype | None = None,  # autocast's (None: float32)
    ):
        self.objective, self.optimizer, self.scaler, self.ema = objective, optimizer, scaler, ema
        self.clip_norm, self.world = clip_norm, world
        self.device = next(objective.parameters()).device
        self.forward = speed.eager_forward(objective, world, dtype)  # the run may compile it

    def backward(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward and backward passes of one update's `batches` (on the device), their
        gradients accumulated. Returns the target tokens of all ranks (1,) and these batches'
        summed loss and NLL (2,), float64 on the device, not read."""
        tokens = distributed.to_device([sum(b.num_tgt_tokens for b in batches)], self.device)
        counted = distributed.all_reduce_async(tokens, self.world)  # during the forward
        loss_scale = torch.ones((), device=self.device)  # set once the count is in
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if self.world.distributed and i < len(batches) - 1:
                ddp = cast(DistributedDataParallel, self.forward.module)  # or compiled wrapper
                sync = ddp.no_sync()  # gradients are reduced once, after the last batch
            with sync:
                loss, nll = self.forward(batch)
                if i == 0:
                    counted.wait()
                    loss_scale = (self.world.size / tokens[0]).float()
                scaled = loss * loss_scale
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        return tokens, torch.stack([loss_sum, nll_sum]).double()

    def apply(
        self, tokens: torch.Tensor, sums: torch.Tensor, shared: Sequence[float] = ()
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The optimizer step with the accumulated gradients clipped to `clip_norm`, then the
        EMA's and the fp16 scale's, and the gradients zeroed. Under torchrun the loss `sums`
        (with `shared`, figures the ranks agree on) are all-reduced first, so that where they
        or the gradient norm are NaN/inf every rank skips the step, on the device. Returns the
        update's figures (float64: loss, nll, `shared` summed, tokens, gradient norm) and
        whether the step was taken (bool), on the device, not read."""
        if self.world.distributed:
            sums = torch.cat([sums, distributed.to_device(list(shared), self.device)])
            torch.distributed.all_reduce(sums)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # and notes overflowed gradients for update()
        params = self.objective.model.parameters()
        norm = torch.nn.utils.clip_grad_norm_(params, self.clip_norm or float("inf"))
        finite = torch.isfinite(sums[:2]).all() & torch.isfinite(norm)
        self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
        self.optimizer.step()
        del self.optimizer.found_inf  # type: ignore[attr-defined]
        if self.ema:
            self.ema.update(finite)  # a skipped step leaves it as it was
        if self.scaler is not None:
            self.scaler.update()  # halves the scale after an overflow
        self.optimizer.zero_grad(set_to_none=True)
        return torch.cat([sums, tokens, norm.double().view(1)]), finite


@dataclass
class Pending:
    """An update launched and not read yet: the loop queues update k+1 before it reads update
    k's figures, so the host never makes the device wait (nanoGPT and torchtitan read the loss
    only when they log it). What the host cannot know yet is decided on the device: update
    k+1's lr is the next step's if update k was taken, else the same step's again, and the EMA
    follows a step only if it was taken. The loop reads it before anything that needs the exact
    state (a log line, a validation, a checkpoint, a stop): a run trains, validates and resumes
    bit for bit as one that read every update at once."""

    figures: torch.Tensor  # float64: loss, nll, the ranks' agreement figures, tokens, grad norm
    finite: torch.Tensor  # bool: no NaN/inf, so the optimizer took the step
    lrs: tuple[float, float] = (0.0, 0.0)  # its lr: if the update before it was taken, or not
    after_pending: bool = False  # launched before the update before it was read (else lrs[0])

    def lr(self, before_taken: bool) -> float:
        """The learning rate it trained with, once the update before it is read."""
        return self.lrs[0] if before_taken or not self.after_pending else self.lrs[1]

    def read(self) -> tuple[Update, list[float]]:
        """The update's figures on the host (the one wait for the device), and the ranks'
        agreement figures that travelled with them."""
        figures = self.figures.tolist()
        loss, nll, tokens, grad_norm = *figures[:2], figures[-2], figures[-1]
        finite = math.isfinite(loss) and math.isfinite(nll) and math.isfinite(grad_norm)
        return Update(loss, nll, int(tokens), grad_norm, finite), figures[2:-2]


def read_at_once(step: int, train: TrainConfig, fp16: bool) -> bool:
    """Whether the update that makes `step` is read before the next is queued: when that step
    is logged, validated (its loss alone included) or the last of max_steps, and under fp16
    (the loss scale is read with the update); else it is read one update later."""
    logged = step % train.log_every == 0 or step % train.eval_every == 0
    return logged or train.checks_loss_alone(step) or step == train.max_steps or fp16
