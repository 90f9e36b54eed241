"""The training loop: `Trainer` sets a run up, runs its updates, validates and saves at
intervals, and finishes it when a stopping rule fires (torchtune's recipe shape).

The pieces it drives live in modules of their own: the loss (`loss.py`), the learning rate
(`schedule.py`), the training state and checkpoints (`state.py`), validation (`validate.py`),
the batches (`data/batching.py`), the time budget and stopping rules (`budget.py`), and what a
run writes as it goes (`runlog.py`, its lines `loglines.py`).

Exact resume rests on three facts: the batch source's position is a function of (seed, epoch,
index), the learning rate a function of the step (and with a time-driven schedule of the
run's time, which last.pt keeps), and last.pt holds every RNG and optimizer state;
validation runs under `torch.random.fork_rng`, so it never moves the training RNG.
The run's clock is wall time (validations included, and earlier processes' time on resume):
max_minutes bounds the whole run, and a time-driven schedule anneals exactly as it ends.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.checkpoint import tokenizers_from
from attn_mt.config import Config
from attn_mt.configfile import save_config
from attn_mt.data.batching import Batch
from attn_mt.decode.translator import Translator
from attn_mt.precision import (
    DTYPES,
    autocast_context,
    configure_kernels,
    resolve_device,
    resolve_precision,
)
from attn_mt.train.budget import RankAgreement, RunClock, stop_rules
from attn_mt.train.compile import choose_compiled, vary_batch_shape
from attn_mt.train.corpus import training_data, valid_subset
from attn_mt.train.loglines import TrainWindow, log_start, window_line
from attn_mt.train.loss import SmoothedObjective
from attn_mt.train.memory import out_of_memory_hint, probe_largest_batch
from attn_mt.train.onednn import choose_for_run
from attn_mt.train.pending import Pending, chosen_lr, learning_rates, read_at_once
from attn_mt.train.runfolder import lock_run_folder
from attn_mt.train.runlog import Monitor, QuietMonitor, RunLog
from attn_mt.train.signals import StopSignals
from attn_mt.train.skips import SkipRule
from attn_mt.train.state import TrainProgress, build_state, starting_point
from attn_mt.train.validate import Validator

log = logging.getLogger("attn_mt")


@dataclass
class TrainResult:
    """How a run ended."""

    step: int
    best_score: float | None  # of `select_metric`
    select_metric: str
    stopped_by: str
    out_dir: Path
    stop_signal: str | None = None  # SIGINT or SIGTERM when stopped_by is "signal"


def train(
    cfg: Config, resume: bool = False, device: str = "auto", monitor: Monitor | None = None
) -> TrainResult:
    """Train a model as `cfg` describes, in this process or as one rank under torchrun;
    rank 0 holds the run folder's lock for the whole run, `monitor` follows it as it goes."""
    with distributed.process_group(resolve_device(device)) as (world, torch_device):
        lock = lock_run_folder(cfg.train.out_dir) if world.is_main else contextlib.nullcontext()
        with lock:
            return Trainer(cfg, world, torch_device, resume, monitor).run()


class Trainer:
    """One training run: `setup` (called by `__init__`) prepares everything and holds nothing
    that needs releasing, `run` trains with `update` until a stopping rule fires, and the
    validator's `finish` validates and saves once more."""

    def __init__(
        self,
        cfg: Config,
        world: distributed.World = distributed.World(),
        device: torch.device = torch.device("cpu"),
        resume: bool = False,
        monitor: Monitor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cfg, self.world, self.device = cfg, world, device
        self.now = clock  # seconds; tests pass a fake one
        self.monitor = monitor or QuietMonitor()
        self.out = Path(cfg.train.out_dir)
        self.began = self.now()  # the run's time counts its start-up
        self.setup(resume)

    def setup(self, resume: bool) -> None:
        """Check the run folder, read the data, build the model, optimizer and batch source,
        and on resume restore them from last.pt."""
        world = self.world
        cfg, last, init = starting_point(self.cfg, resume, world)
        self.cfg = cfg
        log.info("run folder: %s (%s)", cfg.train.out_dir, "resumed" if last else "a new run")
        self.precision = resolve_precision(cfg.train.precision, self.device)
        self.dtype = DTYPES[self.precision]
        configure_kernels(cfg.train.deterministic, cfg.train.tf32)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        checkpoint = last or (init[1] if init else None)  # its SentencePiece models are kept
        self.src_tok, self.tgt_tok, corpus = training_data(
            cfg, tokenizers_from(checkpoint) if checkpoint else None, world
        )
        self.valid_total = len(corpus.valid_src)
        self.corpus = valid_subset(corpus, cfg.train.valid_max_sentences, cfg.train.seed)
        self.state = build_state(
            cfg, (self.src_tok, self.tgt_tok), self.corpus.shards, self.precision, self.device,
            world, init,
        )  # fmt: skip
        state = self.state
        self.model, self.ema, self.optimizer = state.model, state.ema, state.optimizer
        self.scaler, self.source = state.scaler, state.source
        self.resumed = last is not None
        if last:
            self.state.restore(last)
        progress = self.progress
        progress.matmul_backend = choose_for_run(
            self.model, cfg, progress.matmul_backend, self.device, self.dtype, world
        )
        if world.is_main:  # created only once the config, data and last.pt are known to be good
            self.state.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
        self.objective = SmoothedObjective(self.model, cfg.train.label_smoothing)
        self.train_model = wrap_model(self.objective, world, self.device)  # compiled by run()
        self.runlog = RunLog(self.out, enabled=False, resume_step=None)  # opened by run()
        self.signals = StopSignals(abandon=lambda: self.state.writer.abandon())
        self.validator = Validator(
            state, self.corpus, self.valid_total, self._translator, self.dtype, self.monitor,
            lambda: self.signals.name,
        )  # fmt: skip
        self.skips = SkipRule(cfg.train.max_nonfinite, self.scaler, state.ckpt_dir / "last.pt",
                              settle=lambda: self.state.writer.wait())  # fmt: skip
        self.agreement = RankAgreement(world, self.device)  # under torchrun: the ranks' stops
        self.window, self.taken = TrainWindow(), True  # the updates read since the last log
        self.line: tuple[str, dict[str, float]] = ("", {})  # the last read update's figures

    @property
    def progress(self) -> TrainProgress:
        """Where training stands (saved in last.pt)."""
        return self.state.progress

    def _translator(self, dtype: torch.dtype | None = None) -> Translator:
        return Translator(
            self.state.eval_model, self.cfg, self.src_tok, self.tgt_tok, self.device, dtype
        )

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train until max_steps / max_minutes / max_epochs / early stopping / a signal."""
        t = self.cfg.train
        with self._session(), out_of_memory_hint(t):
            log_start(self.runlog, self.state, self.corpus, self.precision, self.resumed)
            probe_largest_batch(self.model, self.source, self.dtype, t.label_smoothing)
            self._choose_compiled()
            p = self.progress
            self.clock = RunClock.of(self.began, p, self.now)
            self.source.prepare(t.accumulate, self._place)
            pending: Pending | None = None  # launched, not read yet
            while not (stopped_by := self._stop_reason()):
                self.window.pause(self.validator.loss_if_due(self.runlog, self.clock))
                lrs = self._set_lr(pending)
                launched = replace(self.update(), lrs=lrs, after_pending=pending is not None)
                if pending is not None:
                    self._read(pending)
                pending = launched
                if self._read_now():
                    self._read(pending, last=True)
                    pending = None
            if pending is not None:
                self._read(pending, last=True)
            if self.window.updates:  # a run shorter than log_every has its curves too
                self.runlog.training(self.progress.step, *self.line)
            self.progress.elapsed = self.clock.elapsed()
            self.validator.finish(stopped_by, self.runlog, self.clock)
        p, signal_name = self.progress, self.signals.name
        return TrainResult(p.step, p.best_score, t.select_metric, stopped_by, self.out, signal_name)

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """What a run holds while it trains, released however it ends: the signal handlers,
        and on rank 0 train.log, TensorBoard and metrics.jsonl."""
        resume_step = self.progress.step if self.resumed else None
        try:
            with (
                self.signals.installed(),
                RunLog(self.out, self.world.is_main, resume_step) as runlog,
            ):
                self.runlog = runlog
                yield
        finally:
            # DDP's reducer holds the process group: let it go with the run, so that
            # `distributed.teardown` really destroys the group (see there).
            self.train_model = self.objective

    def _choose_compiled(self) -> None:
        """Compile the updates as train.compile says (`compile.choose_compiled`), timed for
        `auto` on the epoch's first update's batches, and say which in train.log."""
        batches = [self._place(b) for b in self.source.first_batches(self.cfg.train.accumulate)]
        setting, recorded = self.cfg.train.compile, self.progress.compiled
        self.train_model, choice = choose_compiled(
            setting, recorded, self.train_model, self.objective, batches, self.dtype, self.world
        )
        self.progress.compiled = choice.mode
        log.info("%s", choice.describe(setting))

    def _stop_reason(self) -> str:
        """Which stopping rule fires before the next update ('' if none); agreed by all ranks
        (`budget.RankAgreement`: folded into the last update's all-reduce, or one of its own)."""
        rules = self._stop_rules()
        if self.world.distributed:
            rules = self.agreement.settle(rules, self.clock.schedule_seconds(self.cfg.train))
        return next((name for name, hit in rules.items() if hit), "")

    def _stop_rules(self) -> dict[str, bool]:
        signalled = self.signals.name is not None
        epochs_done = self.source.epochs_done
        return stop_rules(self.cfg.train, self.progress, signalled, self.clock, epochs_done)

    def _read_now(self) -> bool:
        """Whether the update just launched is read before the next is queued."""
        return read_at_once(self.progress.step + 1, self.cfg.train, self.scaler is not None)

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
        window = self.window
        window.add(update.loss, update.nll, update.tokens, update.grad_norm)
        self.line = window_line(step, window, lr, t, self.clock, self.source, self.device)
        self.monitor.training(self.line[0])
        if step % t.log_every == 0:
            self.runlog.training(step, *self.line)
            self.window = TrainWindow()
        took = self.validator.at_step(self.runlog, self.clock)  # None: no validation was due
        if took is not None:
            self.agreement.forget()  # rank 0 alone knows whether a validation improved
            self.window.pause(took)  # tokens/s counts training only

    def _set_lr(self, before: Pending | None) -> tuple[float, float]:
        """Give the optimizer the next update's learning rate; return it for the two cases of
        `before` (the update launched before it, not read yet): taken, skipped."""
        t = self.cfg.train
        seconds = self.agreement.schedule_seconds(self.clock, t)
        lrs = learning_rates(self.progress.step + 1, t, seconds, before)
        lr = chosen_lr(lrs, before, self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lrs

    def update(self) -> Pending:
        """One optimizer update over `accumulate` batches on every rank, launched and not
        read (`_read` reads it).

        The loss is normalised by the target tokens of all batches on all ranks, so the update
        does not depend on how a batch is split (DDP averages gradients, hence `* world size`).
        Under torchrun that count is all-reduced while the first batch's forward pass runs
        (launched before it, waited for only before the backward pass), so the forward never
        waits for it (why not after the backward: docs/distributed.md). Nothing here waits for
        the GPU: the next update's batches are made and copied meanwhile, a NaN/inf skips the
        step on the device (the fused optimizer's `found_inf`, and the EMA's), and the figures
        stay there until `_read` (train/pending.py).
        """
        t = self.cfg.train
        batches = [self._place(self.source.next()) for _ in range(t.accumulate)]  # prepared
        tokens = distributed.to_device([sum(b.num_tgt_tokens for b in batches)], self.device)
        counted = distributed.all_reduce_async(tokens, self.world)  # during the forward
        loss_scale = torch.ones((), device=self.device)  # set once the count is in
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if self.world.distributed and i < len(batches) - 1:
                ddp = cast(DistributedDataParallel, self.train_model)  # or its compiled wrapper
                sync = ddp.no_sync()  # gradients are reduced once, after the last batch
            with sync:
                if self.progress.compiled == "compiled":
                    vary_batch_shape(batch)
                with autocast_context(self.device, self.dtype):
                    self.objective.tokens = batch.num_tgt_tokens
                    loss, nll = self.train_model(batch.src, batch.tgt_in, batch.tgt_out)
                if i == 0:
                    counted.wait()
                    loss_scale = (self.world.size / tokens[0]).float()
                scaled = loss * loss_scale
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        self.source.prepare(t.accumulate, self._place)  # the next update's, while the GPU works
        sums = torch.stack([loss_sum, nll_sum]).double()
        if self.world.distributed:  # the stopping rules and the clock travel with the sums
            mine = self.agreement.figures(self._stop_rules(), self.clock.schedule_seconds(t))
            shared = distributed.to_device(mine, self.device)
            sums = torch.cat([sums, shared])
            torch.distributed.all_reduce(sums)
        norm, finite = self.state.apply_gradients(sums[:2], t.clip_norm)
        figures = torch.cat([sums, tokens, norm.double().view(1)])
        return Pending(figures, finite)

    def _place(self, batch: Batch) -> Batch:
        """`batch` on the training device (a batch already there stays as it is)."""
        return batch.to(self.device)


# No buffer syncs before each forward: the only buffers are the fixed positional tables, equal on
# every rank, and they grow on demand (a rank's longer batch would change the shape). torch 2.13
# names the setting `forward_sync_buffers` (it still syncs once at start-up, where the tables are
# equal) and warns on each rank at the older `broadcast_buffers`.
NO_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def wrap_model(
    objective: SmoothedObjective, world: distributed.World, device: torch.device
) -> torch.nn.Module:
    """The module the updates run eagerly: the objective, in DDP across processes."""
    wrapped: torch.nn.Module = objective
    if world.distributed:
        ids = [device.index] if device.type == "cuda" else None
        # The gradients are views into DDP's buckets: no copy in and out of them per update.
        wrapped = DistributedDataParallel(
            objective, device_ids=ids, gradient_as_bucket_view=True, **NO_BUFFER_SYNC
        )
    return wrapped
