"""The training loop: updates, validation, checkpoints and the rules that stop a run.

The pieces it drives live in modules of their own: the loss (`loss.py`), the learning rate
(`schedule.py`), devices and autocast (`precision.py`), the batches (`batches.py`) and what a
run writes as it goes (`runlog.py`). `Trainer.run` reads top to bottom on one screen.

Exact resume rests on three facts: the batch source's position is a function of (seed, epoch,
index), the learning rate a function of the step, and last.pt holds every RNG and optimizer
state; validation runs under `torch.random.fork_rng`, so it never moves the training RNG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import viz
from attn_mt.checkpoint import (
    checkpoint_config,
    config_differences,
    load_checkpoint,
    load_weights,
    make_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    tokenizers_from,
    translation_weights,
)
from attn_mt.config import Config, TrainConfig, save_config
from attn_mt.data.batching import ShardSource, collate, length_batches
from attn_mt.data.prepare import training_data, valid_subset
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.evaluate import score
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.precision import DTYPES, autocast_context, resolve_device, resolve_precision
from attn_mt.train import distributed
from attn_mt.train.ema import WeightEMA
from attn_mt.train.loss import label_smoothed_loss
from attn_mt.train.runfolder import lock_run_folder
from attn_mt.train.runlog import Monitor, RunLog, TrainWindow, stage, train_line
from attn_mt.train.schedule import learning_rate

log = logging.getLogger("attn_mt")

# train.select_metric -> whether a higher value is better
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}
# Config keys a resumed run must share with its checkpoint (the rest may change, and so may
# the subword sampling, which changes no piece).
RESUME_KEYS = ("model", "tokenizer", "data.src_lang", "data.tgt_lang")
SAMPLING_KEY = "tokenizer.sampling_alpha"
# Model and tokenizer keys a run started from a checkpoint (train.init_from) may change: none
# shapes a weight or a piece.
INIT_FREE_KEYS = ("model.dropout", "model.attention_dropout", "model.fused_attention", SAMPLING_KEY)


class TrainingDiverged(UserError):
    """The loss stayed NaN/inf for `train.max_nonfinite` updates in a row."""


@dataclass
class TrainProgress:
    """Where training stands; saved whole in last.pt (`asdict`) and read back whole."""

    step: int = 0  # updates done
    best_score: float | None = None  # best validation figure of train.select_metric so far
    bad_evals: int = 0  # validations in a row without a better score
    elapsed: float = 0.0  # seconds of training before this process
    last_valid_step: int = -1
    kept_checkpoints: list[str] = field(default_factory=list)  # step_N.pt names, oldest first

    def record(self, score: float, higher_is_better: bool) -> bool:
        """Count one validation score; True when it beats the best so far."""
        improved = self.best_score is None or (
            score > self.best_score if higher_is_better else score < self.best_score
        )
        if improved:
            self.best_score, self.bad_evals = score, 0
        else:
            self.bad_evals += 1
        return improved


@dataclass
class Update:
    """What one optimizer update did, summed over all processes."""

    loss: float  # summed label-smoothed loss
    nll: float  # summed negative log-likelihood
    tokens: int  # target tokens
    grad_norm: float
    finite: bool  # False: NaN/inf somewhere, the update was skipped


@dataclass
class Validation:
    """What one validation measured."""

    metrics: dict[str, float]  # loss, ppl, bleu, chrf
    samples: list[tuple[str, str, str]]  # (source, hypothesis, reference) to show


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
    """One training run: `__init__` prepares everything (and holds nothing that needs
    releasing), `run()` trains until a stopping rule fires."""

    def __init__(
        self,
        cfg: Config,
        world: distributed.World = distributed.World(),
        device: torch.device = torch.device("cpu"),
        resume: bool = False,
        monitor: Monitor | None = None,
    ):
        self.cfg, self.world, self.device = cfg, world, device
        self.monitor = monitor or Monitor()
        self.out = Path(cfg.train.out_dir)
        self.ckpt_dir = self.out / "checkpoints"
        # Rank 0 alone looks at the run folder and sends last.pt on: no rank can see a folder
        # rank 0 has begun to write, and other machines need not share it to resume.
        state = distributed.from_main(lambda: check_run_folder(self.out, cfg, resume), world)
        # A new run may start from a checkpoint's weights; a resumed one keeps its own record.
        init = None if state else distributed.from_main(lambda: init_checkpoint(cfg), world)
        if state or init:
            started_from = init[0] if init else state["config"]["train"].get("init_from")
            cfg = self.cfg = with_init_from(cfg, started_from)
        self.precision = resolve_precision(cfg.train.precision, device)
        self.dtype = DTYPES[self.precision]
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        checkpoint = state or (init[1] if init else None)  # its SentencePiece models are kept
        self.src_tok, self.tgt_tok, corpus = training_data(
            cfg, tokenizers_from(checkpoint) if checkpoint else None, world
        )
        self.valid_total = len(corpus.valid_src)
        self.corpus = valid_subset(corpus, cfg.train.valid_max_sentences, cfg.train.seed)
        with stage("building the model"):
            self.model: Transformer = build_model(
                cfg, self.src_tok.vocab_size, self.tgt_tok.vocab_size
            )
            self.model.to(device)
        if init:
            load_weights(self.model, translation_weights(init[1]), init[0])
        self.ema = WeightEMA(self.model, cfg.train.ema_decay) if cfg.train.ema_decay else None
        self.optimizer = make_optimizer(self.model, cfg.train)
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        self.source = ShardSource.from_config(cfg, self.corpus.shards, world)
        self.progress = TrainProgress()
        self.resumed = state is not None
        if state:
            self._restore(state)
        if world.is_main:  # created only once the config, data and last.pt are known to be good
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
        self.train_model = self._wrap(self.model)
        self.runlog = RunLog(self.out, enabled=False, resume_step=None)  # opened by run()
        self.stop_signal: str | None = None
        self.nonfinite = 0  # non-finite updates in a row

    def _wrap(self, model: Transformer) -> torch.nn.Module:
        """The module the updates run: DDP across processes, compiled if asked."""
        wrapped: torch.nn.Module = model
        if self.world.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # No buffer broadcasts: the only buffers are the fixed positional tables, equal on
            # every rank, and they grow on demand (a rank's longer batch would change the shape).
            wrapped = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        return torch.compile(wrapped) if self.cfg.train.compile else wrapped

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train until max_steps / max_minutes / max_epochs / early stopping / a signal."""
        t = self.cfg.train
        with self._session():
            self._log_start()
            start = time.monotonic() - self.progress.elapsed
            window = TrainWindow()
            while not (stopped_by := self._stop_reason(start)):
                step = self.progress.step + 1
                lr = self._set_learning_rate(step)
                update = self.update()
                if not self._accept(update, step):
                    continue
                self.progress.step = step
                if self.ema:
                    self.ema.update()
                window.add(update.loss, update.nll, update.tokens, update.grad_norm)
                self.monitor.training(self._train_line(step, window, lr, start)[0])
                if step % t.log_every == 0:
                    self._log_train(step, *self._train_line(step, window, lr, start))
                    window = TrainWindow()
                if step % t.eval_every == 0:
                    began = time.monotonic()
                    self.progress.elapsed = began - start
                    self._validate_and_save()
                    window.pause(time.monotonic() - began)  # tokens/s counts training only
            self.progress.elapsed = time.monotonic() - start
            self._finish(stopped_by)
        return TrainResult(
            self.progress.step,
            self.progress.best_score,
            t.select_metric,
            stopped_by,
            self.out,
            self.stop_signal,
        )

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """What a run holds while it trains, released however it ends: the signal handlers,
        and on rank 0 train.log, TensorBoard and metrics.jsonl."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        resume_step = self.progress.step if self.resumed else None
        try:
            with RunLog(self.out, self.world.is_main, resume_step) as self.runlog:
                yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_signal = signal.Signals(signum).name

    def _stop_reason(self, start: float) -> str:
        """Which stopping rule fires before the next update ('' if none); agreed by all ranks."""
        t = self.cfg.train
        rules = {
            "early stopping": bool(t.patience) and self.progress.bad_evals >= t.patience,
            "signal": self.stop_signal is not None,
            "max_steps": t.max_steps > 0 and self.progress.step >= t.max_steps,
            "max_minutes": bool(t.max_minutes) and time.monotonic() - start >= t.max_minutes * 60,
            "max_epochs": bool(t.max_epochs) and self.source.epochs_done >= t.max_epochs,
        }
        fired = distributed.any_each(list(rules.values()), self.world, self.device)
        return next((name for name, hit in zip(rules, fired, strict=True) if hit), "")

    def _set_learning_rate(self, step: int) -> float:
        lr = learning_rate(step, self.cfg.train)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def update(self) -> Update:
        """One optimizer update over `accumulate` batches on every rank.

        The loss is normalised by the target tokens of all batches on all ranks, so the update
        does not depend on how a batch is split (DDP averages gradients, hence `* world size`).
        """
        t = self.cfg.train
        batches = [self.source.next().to(self.device) for _ in range(t.accumulate)]
        tokens = distributed.sum_all(
            sum(b.num_tgt_tokens for b in batches), self.world, self.device
        )
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync = contextlib.nullcontext()
            if self.world.distributed and i < len(batches) - 1:
                sync = self.train_model.no_sync()  # gradients are reduced once, after the last
            with sync:
                with autocast_context(self.device, self.dtype):
                    logits = self.train_model(batch.src, batch.tgt_in)
                loss, nll = label_smoothed_loss(logits, batch.tgt_out, t.label_smoothing)
                scaled = loss * (self.world.size / tokens)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm or float("inf"))
        sums = torch.stack([loss_sum, nll_sum]).double()
        if self.world.distributed:
            torch.distributed.all_reduce(sums)
        finite = bool(torch.isfinite(sums).all() and torch.isfinite(norm))
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step itself on inf gradients
            self.scaler.update()
            finite = bool(torch.isfinite(sums).all())
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return Update(float(sums[0]), float(sums[1]), int(tokens), float(norm), finite)

    def _accept(self, update: Update, step: int) -> bool:
        """False for a skipped (non-finite) update; too many in a row end the run."""
        if update.finite:
            self.nonfinite = 0
            return True
        self.nonfinite += 1
        log.warning(
            "step %d: non-finite loss or gradient; update skipped (%d in a row)",
            step,
            self.nonfinite,
        )
        if self.nonfinite >= max(self.cfg.train.max_nonfinite, 1):
            last = self.ckpt_dir / "last.pt"
            kept = (
                f"the last good checkpoint is kept: {last}"
                if last.is_file()
                else "no checkpoint had been written yet"
            )
            raise TrainingDiverged(
                f"the loss was NaN/inf for {self.nonfinite} updates in a row at step {step}; "
                f"lower train.lr or check the data ({kept})"
            )
        return False

    def _finish(self, stopped_by: str) -> None:
        """End a run: a stopped run saves last.pt; a finished one validates unless it just did."""
        step = self.progress.step
        if stopped_by == "signal":
            self._save(best=False)
            log.info(
                "stopped by %s at step %d; last.pt written, resume with --resume",
                self.stop_signal,
                step,
            )
        elif self.progress.last_valid_step != step:
            self._validate_and_save()
        else:
            self._save(best=False)
        distributed.barrier(self.world)  # no rank leaves before rank 0 has written last.pt
        if stopped_by == "early stopping":
            log.info(
                "early stopping: no better %s in %d validations",
                self.cfg.train.select_metric,
                self.cfg.train.patience,
            )
        best = self.progress.best_score
        log.info(
            "finished at step %d (%s); best valid %s %s%s",
            step,
            stopped_by,
            self.cfg.train.select_metric,
            "-" if best is None else f"{best:.2f}",
            self._valid_share(),
        )

    # -- validation and checkpoints -------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> Validation:
        """Validation loss/perplexity (teacher forcing) and BLEU/chrF of search output."""
        c, t = self.corpus, self.cfg.train
        model = self.eval_model
        model.eval()
        loss = nll = 0.0
        tokens = 0
        lengths = [
            (len(s) + 1, len(r) + 1) for s, r in zip(c.valid_src_ids, c.valid_tgt_ids, strict=True)
        ]
        with autocast_context(self.device, self.dtype):
            for rows in length_batches(lengths, t.batch_tokens):
                batch = collate(c.valid_src_ids, c.valid_tgt_ids, rows).to(self.device)
                logits = model(batch.src, batch.tgt_in)
                batch_loss, batch_nll = label_smoothed_loss(
                    logits, batch.tgt_out, t.label_smoothing
                )
                loss, nll = loss + float(batch_loss), nll + float(batch_nll)
                tokens += batch.num_tgt_tokens
        done = 0

        def advance(count: int) -> None:
            nonlocal done
            done += count
            self.monitor.validating(done, len(c.valid_src))

        hyps = self._translator(self.dtype).translate(
            c.valid_src, beam=t.eval_beam, on_batch=advance
        )
        scores = score(hyps, c.valid_ref)
        self.model.train()
        metrics = {
            "loss": loss / max(tokens, 1),
            "ppl": math.exp(min(nll / max(tokens, 1), 50)),
            "bleu": scores.bleu,
            "chrf": scores.chrf,
            "sentences": len(c.valid_src),
        }
        samples = list(zip(c.valid_src, hyps, c.valid_ref, strict=True))[: t.samples]
        return Validation(metrics, samples)

    @property
    def eval_model(self) -> Transformer:
        """The weights that validate, go into best.pt and translate: the EMA when kept."""
        return self.ema.model if self.ema else self.model

    def _translator(self, dtype: torch.dtype | None = None) -> Translator:
        return Translator(self.eval_model, self.cfg, self.src_tok, self.tgt_tok, self.device, dtype)

    def _validate_and_save(self) -> None:
        """Validate on rank 0, log it, and write the checkpoints (best.pt if it improved)."""
        step, metric = self.progress.step, self.cfg.train.select_metric
        result: Validation | None = None
        improved = False
        if self.world.is_main:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                result = self.validate()
                self._log_attention(step)
            improved = self.progress.record(result.metrics[metric], HIGHER_IS_BETTER[metric])
            self._log_validation(step, result, improved)
        self.progress.last_valid_step = step
        self._save(best=improved, metrics=result.metrics if result else None)

    def _save(self, best: bool, metrics: dict[str, float] | None = None) -> None:
        """Write last.pt (with the training state), and best.pt / step_N.pt as configured.

        Called on every rank (it gathers their RNG states); only rank 0 writes.
        """
        # Each rank's generators: dropout draws differ between ranks, whose batch shapes differ.
        cuda = self.device.type == "cuda"
        rng = distributed.gather(
            (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if cuda else None),
            self.world,
        )
        if not self.world.is_main:
            return
        state = make_checkpoint(
            self.eval_model,
            self.cfg,
            self.progress.step,
            self.source.epoch,
            (self.src_tok, self.tgt_tok),
            metrics or {},
        )
        if best:
            save_checkpoint(state, self.ckpt_dir / "best.pt")
        keep = self.cfg.train.keep_checkpoints
        if keep and metrics is not None:
            name = f"step_{self.progress.step}.pt"
            save_checkpoint(state, self.ckpt_dir / name)
            self.progress.kept_checkpoints.append(name)
            while len(self.progress.kept_checkpoints) > keep:
                (self.ckpt_dir / self.progress.kept_checkpoints.pop(0)).unlink(missing_ok=True)
        if self.ema:  # last.pt resumes from the raw weights; the average translates
            state["model"], state["ema"] = self.model.state_dict(), state["model"]
        state["train_state"] = {
            "progress": asdict(self.progress),
            "data": self.source.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": rng,  # (cpu, cuda) per rank
        }
        save_checkpoint(state, self.ckpt_dir / "last.pt")

    def _restore(self, state: dict[str, Any]) -> None:
        """Read back what `_save` wrote into last.pt: weights, optimizer, scaler, RNG states,
        the data position and the training progress; a damaged state is one UserError."""
        try:
            self._restore_parts(state)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            reason = "; ".join([type(err).__name__, *lines[:2]])[:200]
            raise UserError(
                f"{self.ckpt_dir / 'last.pt'}: its training state is damaged ({reason}); "
                "resume from a copy of the run or start a new train.out_dir"
            ) from None

    def _restore_parts(self, state: dict[str, Any]) -> None:
        ts = state["train_state"]
        self.model.load_state_dict(state["model"])
        if self.ema:  # a run that kept no average starts one from its weights
            self.ema.load_state_dict(translation_weights(state))
        self.optimizer.load_state_dict(ts["optimizer"])
        if self.scaler is not None and ts["scaler"]:
            self.scaler.load_state_dict(ts["scaler"])
        # The same processes each take their own streams back; otherwise all take rank 0's.
        rng = ts["rng"]
        rng_cpu, rng_cuda = rng[self.world.rank] if len(rng) == self.world.size else rng[0]
        torch.set_rng_state(rng_cpu)
        if self.device.type == "cuda" and rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda, self.device)
        self.source.load_state_dict(ts["data"])
        self.progress = TrainProgress(**ts["progress"])

    # -- logging --------------------------------------------------------------------------------

    def _log_start(self) -> None:
        c, cfg = self.corpus, self.cfg
        params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        threads = torch.get_num_threads() if self.device.type == "cpu" else None
        log.info(
            "attn-mt: %s -> %s, %s parameters, device %s%s, precision %s, %d process(es)",
            cfg.data.src_lang,
            cfg.data.tgt_lang,
            f"{params:,}",
            self.device,
            f" ({threads} threads)" if threads else "",
            self.precision,
            self.world.size,
        )
        log.info(
            "data: %d training pairs kept, %d empty dropped, %d longer than %d tokens dropped, "
            "%d over the length ratio dropped; %d validation pairs",
            c.stats.kept,
            c.stats.empty,
            c.stats.too_long,
            cfg.data.max_len,
            c.stats.bad_ratio,
            len(c.valid_src),
        )
        for line in c.describe():  # each training corpus, its share of an epoch
            log.info("data: %s", line)
        log.info(
            "vocabulary: %s SentencePiece %s, %d / %d pieces; %s",
            "joint" if self.src_tok is self.tgt_tok else "separate",
            cfg.tokenizer.model_type,
            self.src_tok.vocab_size,
            self.tgt_tok.vocab_size,
            self.source.describe(),
        )
        if cfg.train.init_from and not self.resumed:
            log.info("weights and SentencePiece models from %s; a new run", cfg.train.init_from)
        if self.ema:
            log.info("weight EMA, decay %g: validation and best.pt use the average", self.ema.decay)
        if self.resumed:
            position = self.source.state_dict()
            log.info(
                "resumed at step %d (epoch %d, batch %d)",
                self.progress.step,
                position["epoch"],
                position["index"],
            )
        self.runlog.hparams(cfg, params)

    def _train_line(
        self, step: int, window: TrainWindow, lr: float, start: float
    ) -> tuple[str, dict[str, float]]:
        """The training line of the updates in `window`, and its figures."""
        metrics = window.metrics(lr, self.source.epoch)
        elapsed = time.monotonic() - start
        return train_line(step, metrics, self.cfg.train, elapsed, self.source.epochs_run), metrics

    def _log_train(self, step: int, line: str, metrics: dict[str, float]) -> None:
        log.info("%s", line)
        self.runlog.scalars(step, "train", metrics)

    def _valid_share(self) -> str:
        """' (on N of M validation sentences)' when validating on a subset, else ''."""
        n = len(self.corpus.valid_src)
        return (
            f" (on {n} of {self.valid_total} validation sentences)" if n < self.valid_total else ""
        )

    def _log_validation(self, step: int, result: Validation, improved: bool) -> None:
        m, metric = result.metrics, self.cfg.train.select_metric
        log.info(
            "valid step %d%s: loss %.3f  ppl %.2f  BLEU %.2f  chrF %.2f%s",
            step,
            self._valid_share(),
            m["loss"],
            m["ppl"],
            m["bleu"],
            m["chrf"],
            "  (best)" if improved else f"  (best {metric} {self.progress.best_score:.2f})",
        )
        for src, hyp, ref in result.samples:
            log.info("  src: %s\n  hyp: %s\n  ref: %s", src, hyp, ref)
        self.runlog.scalars(step, "valid", m)
        self.runlog.text(
            "valid/samples",
            "\n\n".join(f"src: {s}  \nhyp: {h}  \nref: {r}" for s, h, r in result.samples),
            step,
        )

    def _log_attention(self, step: int) -> None:
        """Cross-attention heatmap of the first validation sentence to TensorBoard; a failed
        plot is a warning, never the end of a run."""
        sentence = next((line for line in self.corpus.valid_src if line.strip()), None)
        if not self.runlog.enabled or sentence is None:
            return
        try:
            figure = viz.validation_attention_figure(self._translator(), sentence)
            self.runlog.figure("valid/attention", figure, step)
        except Exception as err:  # whatever broke, training goes on
            log.warning(
                "valid step %d: attention plot skipped (%s: %s)", step, type(err).__name__, err
            )
        finally:
            self.model.train()


def make_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices (not biases, norms)."""
    params = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel updates every tensor in one pass: the per-tensor loop it replaces
    # took ~10% of a CPU step.
    return torch.optim.AdamW(
        groups, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, fused=True
    )


def init_checkpoint(cfg: Config) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint `train.init_from` names (its absolute path and contents), once its model
    and tokenizer keys are known to equal `cfg`'s (but for INIT_FREE_KEYS); None without one."""
    if cfg.train.init_from is None:
        return None
    path = resolve_checkpoint(cfg.train.init_from).resolve()
    state = load_checkpoint(path)
    old, new = state["config"], cfg.to_dict()
    differ = config_differences(old, new, ("model", "tokenizer"))
    if keys := [key for key in differ if key not in INIT_FREE_KEYS]:
        values = ", ".join(f"{k} ({_value(new, k)!r} here, {_value(old, k)!r} there)" for k in keys)
        raise UserError(
            f"{path}: cannot start from this checkpoint, the config differs in {values}; a run "
            "started from it keeps its model and SentencePiece models (only model.dropout, "
            "model.attention_dropout, tokenizer.sampling_alpha and train.* may change)"
        )
    return str(path), state


def _value(config: dict[str, Any], key: str) -> Any:
    """The value of a dotted `section.key` in a plain config (None when missing)."""
    section, name = key.split(".")
    return config.get(section, {}).get(name)


def with_init_from(cfg: Config, init_from: str | None) -> Config:
    """`cfg` with train.init_from set: config.yaml records the checkpoint a run started from."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=init_from))


def check_run_folder(out: Path, cfg: Config, resume: bool) -> dict[str, Any] | None:
    """Refuse to overwrite a run; on resume, return last.pt once it is known to fit `cfg`."""
    last = out / "checkpoints" / "last.pt"
    started = out.exists() and any(
        (out / name).exists() for name in ("checkpoints", "config.yaml", "metrics.jsonl")
    )
    if started and not last.is_file():  # neither resumable nor ours to overwrite
        raise UserError(
            f"{out}: holds a run that stopped before its first checkpoint "
            "(no checkpoints/last.pt); delete that folder or choose another train.out_dir"
        )
    if not resume:
        if started:
            raise UserError(
                f"{out}: already holds a run; continue it with `attn-mt train --resume`, "
                "or choose another train.out_dir"
            )
        return None
    if not last.is_file():
        raise UserError(
            f"{out}: nothing to resume (no checkpoints/last.pt); start without --resume"
        )
    state = load_checkpoint(last)
    if not isinstance(state.get("train_state"), dict):
        raise UserError(f"{last}: holds no training state, so it cannot be resumed")
    old = checkpoint_config(state, last).to_dict()  # validated like a config file
    diff = [k for k in config_differences(old, cfg.to_dict(), RESUME_KEYS) if k != SAMPLING_KEY]
    if diff:
        raise UserError(
            f"{out}: cannot resume with a changed config ({', '.join(diff)} differ "
            "from the checkpoint); restore them or start a new train.out_dir"
        )
    return state
