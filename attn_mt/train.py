"""The training loop: label-smoothed cross-entropy with teacher forcing, AdamW and a warm-up
schedule, mixed precision, gradient accumulation, DDP, validation by BLEU, checkpoints with
exact resume, and TensorBoard / metrics.jsonl logging.

Exact resume rests on three facts: the batch order is a function of (seed, epoch), the
learning rate a function of the step, and the checkpoint holds every RNG and optimizer state;
validation runs under `torch.random.fork_rng`, so it never moves the training RNG.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed, viz
from attn_mt.checkpoint import (
    checkpoint_config,
    load_checkpoint,
    save_checkpoint,
    tokenizers_from,
)
from attn_mt.config import Config, save_config
from attn_mt.data import (
    Batch,
    FilterStats,
    cache_dir,
    clean_pairs,
    collate,
    epoch_batches,
    length_batches,
    padding_fraction,
    read_parallel,
    split_files,
)
from attn_mt.errors import DataError, UserError
from attn_mt.evaluate import score
from attn_mt.model import Transformer, build_model
from attn_mt.runfolder import lock_run_folder
from attn_mt.tokenizer import PAD_ID, Tokenizer, build_tokenizers
from attn_mt.translator import Translator, autocast_context, resolve_device

log = logging.getLogger("attn_mt")

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class TrainingDiverged(UserError):
    """The loss stayed NaN/inf for `train.max_nonfinite` updates in a row."""


# ---------------------------------------------------------------------------------------------
# Pieces a reader can check against the formulas


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over non-pad targets.

    loss = (1 - eps) * -log p(y) + eps * mean_v(-log p(v))  (Szegedy et al., 2016)
    Args: logits (B, T, V); target (B, T) with PAD_ID where there is no token.
    Returns two scalars in float32 (or float64 for float64 logits); only `loss` has a gradient.
    """
    vocab = logits.size(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_loss` with its gradient written out: d loss / d logits =
    softmax - (1 - eps) * onehot(y) - eps / V on real rows, 0 on padding. Autograd's own
    backward through log_softmax, gather and mean took 2x as long on the (N, V) logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_probs = F.log_softmax(logits, dim=-1, dtype=dtype)  # (N, V)
        nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
        smooth = -log_probs.mean(dim=-1)  # (N,)
        pad = target == PAD_ID
        loss = ((1.0 - epsilon) * nll + epsilon * smooth).masked_fill(pad, 0.0).sum()
        nll_sum = nll.masked_fill(pad, 0.0).sum()
        ctx.save_for_backward(log_probs, target)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        log_probs, target = ctx.saved_tensors
        eps = ctx.epsilon
        grad = log_probs.exp().sub_(eps / log_probs.size(-1))  # (N, V) softmax - eps / V
        hit = torch.full((target.numel(), 1), eps - 1.0, dtype=grad.dtype, device=grad.device)
        grad.scatter_add_(-1, target.unsqueeze(-1), hit)  # - (1 - eps) at the target
        grad.mul_((target != PAD_ID).unsqueeze(-1) * grad_loss)
        return grad.to(ctx.logits_dtype), None, None


def learning_rate(step: int, cfg: Config) -> float:
    """The learning rate of update number `step` (1-based).

    inverse_sqrt: lr * min(step / warmup, sqrt(warmup / step))  (peak lr at step = warmup)
    cosine:       linear warm-up, then min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2
    constant:     linear warm-up, then lr
    """
    t = cfg.train
    warmup = max(t.warmup, 1)
    if t.schedule == "inverse_sqrt":
        return t.lr * min(step / warmup, math.sqrt(warmup / step))
    if step < warmup:
        return t.lr * step / warmup
    if t.schedule == "cosine":
        progress = min((step - warmup) / max(t.max_steps - warmup, 1), 1.0)
        return t.min_lr + (t.lr - t.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr


def resolve_precision(requested: str, device: torch.device) -> str:
    """'auto' -> bf16 where the device runs it natively, else fp16 (CUDA) or fp32 (CPU)."""
    if requested == "fp16" and device.type != "cuda":
        raise UserError("train.precision: fp16 needs a CUDA GPU; use bf16 or fp32 on the CPU")
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if torch.backends.mkldnn.is_available() and _cpu_has_bf16() else "fp32"


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class Corpus:
    """Encoded training pairs (filtered) and the validation split."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    lengths: list[tuple[int, int]]  # (source + <eos>, target + <eos>) per kept pair
    stats: FilterStats
    valid_src: list[str]
    valid_ref: list[str]
    valid_src_ids: list[list[int]]
    valid_tgt_ids: list[list[int]]


def prepare_data(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None, world: distributed.World
) -> tuple[Tokenizer, Tokenizer, Corpus]:
    """Read the corpus, train (or reuse) SentencePiece, encode and filter the training pairs."""
    train_files = split_files(cfg.data, "train")
    valid_files = split_files(cfg.data, "valid")
    train_src, train_tgt = read_parallel(*train_files)
    valid_src, valid_ref = read_parallel(*valid_files)
    for name, files, src, tgt in (
        ("training", train_files, train_src, train_tgt),
        ("validation", valid_files, valid_src, valid_ref),
    ):
        if not any(s.strip() and t.strip() for s, t in zip(src, tgt, strict=True)):
            raise DataError(f"{files[0]}: the {name} corpus has no non-empty pairs")
    if tokenizers is None:
        # Rank 0 trains SentencePiece and sends the models: every process must use the same
        # pieces, and machines of a multi-node run need not share a cache folder.
        tokenizers = distributed.from_main(
            lambda: build_tokenizers(cfg.tokenizer, train_src, train_tgt, cache_dir() / "spm"),
            world,
        )
    src_tok, tgt_tok = tokenizers
    src_ids, tgt_ids = src_tok.encode(train_src), tgt_tok.encode(train_tgt)
    keep, stats = clean_pairs(src_ids, tgt_ids, cfg.data.max_len)
    if not keep:
        raise DataError(
            f"every training pair was filtered out ({stats.empty} empty, {stats.too_long} longer "
            f"than data.max_len={cfg.data.max_len} tokens); raise data.max_len"
        )
    src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    corpus = Corpus(
        src_ids=src_ids,
        tgt_ids=tgt_ids,
        lengths=[(len(s) + 1, len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)],
        stats=stats,
        valid_src=valid_src,
        valid_ref=valid_ref,
        valid_src_ids=src_tok.encode(valid_src),
        valid_tgt_ids=tgt_tok.encode(valid_ref),
    )
    return src_tok, tgt_tok, corpus


class BatchStream:
    """This rank's batches, epoch after epoch, from a resumable position (epoch, index)."""

    def __init__(
        self, corpus: Corpus, cfg: Config, world: distributed.World, epoch: int, index: int
    ):
        self.corpus, self.cfg, self.world = corpus, cfg, world
        self.epoch, self.index = epoch, index
        self.batches = self._epoch(epoch)

    def _epoch(self, epoch: int) -> list[list[int]]:
        t = self.cfg.train
        batches = epoch_batches(
            self.corpus.lengths, t.batch_tokens, t.seed, epoch, self.world.rank, self.world.size
        )
        if not batches:
            raise DataError(
                f"the training data makes fewer batches than the {self.world.size} processes; "
                "lower train.batch_tokens or use fewer processes"
            )
        return batches

    @property
    def epochs_done(self) -> int:
        """Whole epochs consumed so far."""
        return self.epoch + (1 if self.index >= len(self.batches) else 0)

    def next(self) -> Batch:
        """The next batch, moving to the next epoch's order at the end of one."""
        if self.index >= len(self.batches):
            self.epoch, self.index = self.epoch + 1, 0
            self.batches = self._epoch(self.epoch)
        rows = self.batches[self.index]
        self.index += 1
        return collate(self.corpus.src_ids, self.corpus.tgt_ids, rows)

    def peek_padding(self, count: int = 50) -> float:
        """Padding share of the first `count` batches of this epoch (for the start-up log)."""
        sample = [
            collate(self.corpus.src_ids, self.corpus.tgt_ids, rows) for rows in self.batches[:count]
        ]
        return padding_fraction(sample)


# ---------------------------------------------------------------------------------------------
# Logging


class RunLog:
    """TensorBoard events under OUT/tb and one JSON object per line in OUT/metrics.jsonl."""

    def __init__(self, out_dir: Path, enabled: bool, resume_step: int | None):
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        metrics = out_dir / "metrics.jsonl"
        if resume_step is not None and metrics.exists():  # forget what came after the checkpoint
            kept = [
                ln
                for ln in metrics.read_text(errors="replace").splitlines()
                if (step := _logged_step(ln)) is not None and step <= resume_step
            ]  # a line a crash cut short is dropped too
            metrics.write_text("".join(ln + "\n" for ln in kept))
        self.jsonl = open(metrics, "a", encoding="utf-8")  # noqa: SIM115
        purge = resume_step + 1 if resume_step is not None else None
        self.tb = SummaryWriter(str(out_dir / "tb"), purge_step=purge)

    def scalars(self, step: int, split: str, metrics: dict[str, float]) -> None:
        """Write `metrics` as `split/name` TensorBoard scalars and a metrics.jsonl line."""
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.tb.add_scalar(f"{split}/{name}", value, step)
        self.jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
        self.jsonl.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        if self.enabled:
            self.tb.add_text(tag, text, step)

    def figure(self, tag: str, figure: Any, step: int) -> None:
        if self.enabled:
            self.tb.add_figure(tag, figure, step)

    def hparams(self, cfg: Config, params: int) -> None:
        """The hyper-parameters as TensorBoard text and hparams."""
        if not self.enabled:
            return
        flat = {
            f"{section}.{key}": value
            for section, values in cfg.to_dict().items()
            for key, value in values.items()
            if isinstance(value, (int, float, str, bool))
        }
        flat["parameters"] = params
        self.tb.add_text("config", "```\n" + json.dumps(cfg.to_dict(), indent=2) + "\n```", 0)
        with contextlib.suppress(Exception):  # hparams is a convenience, never fatal
            # Not `add_hparams`: it would also write a fake valid/bleu = 0 point at step 0.
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(flat, {"valid/bleu": 0.0}):
                self.tb.file_writer.add_summary(summary)

    def close(self) -> None:
        if self.enabled:
            self.tb.close()
            self.jsonl.close()


def _logged_step(line: str) -> int | None:
    """The step of a metrics.jsonl line, or None for a line that is not a whole record."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return None
    return step if isinstance(step, int) else None


class Progress:
    """A one-line progress display on a terminal; nothing otherwise (the log has the lines)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled and sys.stderr.isatty()
        self.last = 0.0

    def update(self, step: int, loss: float, lr: float, tokens_per_sec: float) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        total = f"/{self.total}" if self.total else ""
        sys.stderr.write(
            f"\r\033[Kstep {step}{total}  loss {loss:.3f}  lr {lr:.2e}  {tokens_per_sec:,.0f} tok/s"
        )
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# The trainer


@dataclass
class Progression:
    """Everything about where training stands that a resume must restore."""

    step: int = 0
    epoch: int = 0
    batch_index: int = 0
    best_bleu: float = -1.0
    bad_evals: int = 0
    elapsed: float = 0.0  # seconds of training before this process
    last_valid_step: int = -1
    kept_checkpoints: list[str] = field(default_factory=list)


@dataclass
class TrainResult:
    """How a run ended."""

    step: int
    best_bleu: float
    stopped_by: str
    out_dir: Path
    stop_signal: str | None = None  # SIGINT or SIGTERM when stopped_by is "signal"


def _log_window() -> dict[str, float]:
    """Running sums of the training figures between two log lines, and when they began."""
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "time": time.monotonic(), "norm": 0.0, "n": 0}


class Trainer:
    """One training run; `run()` trains until a stopping rule fires."""

    def __init__(self, cfg: Config, resume: bool = False, device: str = "auto"):
        self.cfg = cfg
        self.out = Path(cfg.train.out_dir)
        self.ckpt_dir = self.out / "checkpoints"
        self.world, self.device = distributed.setup(resolve_device(device))
        # Rank 0 alone looks at the run folder and sends last.pt on: no rank can see a folder
        # rank 0 has begun to write, and other machines need not share it to resume.
        state = distributed.from_main(lambda: self._check_run_folder(resume), self.world)
        self.precision = resolve_precision(cfg.train.precision, self.device)
        self.dtype = DTYPES[self.precision]
        if cfg.train.schedule == "cosine" and cfg.train.max_steps == 0:
            raise UserError("train.schedule: cosine needs train.max_steps > 0 to know its length")
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        self.src_tok, self.tgt_tok, self.corpus = prepare_data(
            cfg, tokenizers_from(state) if state else None, self.world
        )
        self.model: Transformer = build_model(cfg, self.src_tok.vocab_size, self.tgt_tok.vocab_size)
        self.model.to(self.device)
        self.optimizer = self._make_optimizer()
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        self.state = Progression()
        if state:
            self._restore(state)
        # The run folder is created only once the config, data and last.pt are known to be good.
        if self.world.is_main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            self._log_handler = logging.FileHandler(self.out / "train.log", encoding="utf-8")
            self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            log.addHandler(self._log_handler)
            self._log_level = log.level
            if log.getEffectiveLevel() > logging.INFO:  # train.log has the INFO lines, CLI or not
                log.setLevel(logging.INFO)
        self.stream = BatchStream(
            self.corpus, cfg, self.world, self.state.epoch, self.state.batch_index
        )
        self.train_model: torch.nn.Module = self.model
        if self.world.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # No buffer broadcasts: the only buffers are the fixed positional tables, equal on
            # every rank, and they grow on demand (a rank's longer batch would change the shape).
            self.train_model = DistributedDataParallel(
                self.model, device_ids=ids, broadcast_buffers=False
            )
        if cfg.train.compile:
            self.train_model = torch.compile(self.train_model)
        self.runlog = RunLog(self.out, self.world.is_main, self.state.step if state else None)
        self.stop_signal: str | None = None
        self.samples: list[tuple[str, str, str]] = []

    # -- set-up ---------------------------------------------------------------------------------

    def _check_run_folder(self, resume: bool) -> dict[str, Any] | None:
        """Refuse to overwrite a run; on --resume, load last.pt and check it fits the config."""
        last = self.ckpt_dir / "last.pt"
        started = self.out.exists() and any(
            (self.out / name).exists() for name in ("checkpoints", "config.yaml", "metrics.jsonl")
        )
        if started and not last.is_file():  # neither resumable nor ours to overwrite
            raise UserError(
                f"{self.out}: holds a run that stopped before its first checkpoint "
                "(no checkpoints/last.pt); delete that folder or choose another train.out_dir"
            )
        if resume:
            if not last.is_file():
                raise UserError(
                    f"{self.out}: nothing to resume (no checkpoints/last.pt); "
                    "start without --resume"
                )
            state = load_checkpoint(last)
            if not isinstance(state.get("train_state"), dict):
                raise UserError(f"{last}: holds no training state, so it cannot be resumed")
            old = checkpoint_config(state, last).to_dict()
            new = self.cfg.to_dict()
            diff = [
                f"{section}.{key}"
                for section in ("model", "tokenizer")
                for key in new[section]
                if old[section].get(key) != new[section][key]
            ] + [f"data.{k}" for k in ("src_lang", "tgt_lang") if old["data"][k] != new["data"][k]]
            if diff:
                raise UserError(
                    f"{self.out}: cannot resume with a changed config ({', '.join(diff)} differ "
                    "from the checkpoint); restore them or start a new train.out_dir"
                )
            return state
        if started:
            raise UserError(
                f"{self.out}: already holds a run; continue it with `attn-mt train --resume`, "
                "or choose another train.out_dir"
            )
        return None

    def _make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW; weight decay only on matrices (not biases, norms)."""
        t = self.cfg.train
        params = list({id(p): p for p in self.model.parameters()}.values())  # tied once
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": t.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        # The fused kernel updates every tensor in one pass: the per-tensor loop it replaces
        # took ~10% of a CPU step.
        return torch.optim.AdamW(
            groups, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, fused=True
        )

    def _restore(self, state: dict[str, Any]) -> None:
        """Load weights, optimizer, scaler, RNG states and the data position of last.pt."""
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
        self.optimizer.load_state_dict(ts["optimizer"])
        if self.scaler is not None and ts.get("scaler"):
            self.scaler.load_state_dict(ts["scaler"])
        rng_cpu, rng_cuda = ts["rng_cpu"], ts.get("rng_cuda")
        ranks = ts.get("rng_ranks") or []
        if len(ranks) == self.world.size:  # the same processes: each takes its own streams back
            rng_cpu, rng_cuda = ranks[self.world.rank]
        torch.set_rng_state(rng_cpu)
        if self.device.type == "cuda" and rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda, self.device)
        batch_index, saved_world = ts["batch_index"], ts.get("world_size", 1)
        if saved_world != self.world.size:
            # The position counts this process's batches; keep the share of the epoch's global
            # order already seen (rounded up: a few batches may be skipped, none repeated).
            batch_index = -(-batch_index * saved_world // self.world.size)
            log.info(
                "resuming a %d-process run with %d processes: epoch %d continues at batch %d",
                saved_world,
                self.world.size,
                ts["epoch"],
                batch_index,
            )
        self.state = Progression(
            step=state["step"],
            epoch=ts["epoch"],
            batch_index=batch_index,
            best_bleu=ts["best_bleu"],
            bad_evals=ts["bad_evals"],
            elapsed=ts["elapsed"],
            last_valid_step=ts["last_valid_step"],
            kept_checkpoints=list(ts["kept_checkpoints"]),
        )

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train until max_steps / max_minutes / max_epochs / early stopping / a signal."""
        cfg, t = self.cfg, self.cfg.train
        self._log_start()
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        progress = Progress(t.max_steps, self.world.is_main)
        start = time.monotonic() - self.state.elapsed
        window = _log_window()
        nonfinite = 0
        stopped_by = ""
        try:
            while not stopped_by:
                stopped_by = self._stop_reason(start)
                if stopped_by:
                    break
                step = self.state.step + 1
                lr = learning_rate(step, cfg)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                loss, nll, tokens, norm, finite = self._update()
                self.state.epoch, self.state.batch_index = self.stream.epoch, self.stream.index
                if not finite:
                    nonfinite += 1
                    log.warning(
                        "step %d: non-finite loss or gradient; update skipped (%d in a row)",
                        step,
                        nonfinite,
                    )
                    if nonfinite >= max(t.max_nonfinite, 1):
                        last = self.ckpt_dir / "last.pt"
                        kept = (
                            f"the last good checkpoint is kept: {last}"
                            if last.is_file()
                            else "no checkpoint had been written yet"
                        )
                        raise TrainingDiverged(
                            f"the loss was NaN/inf for {nonfinite} updates in a row at step "
                            f"{step}; lower train.lr or check the data ({kept})"
                        )
                    continue
                nonfinite = 0
                self.state.step = step
                window["loss"] += loss
                window["nll"] += nll
                window["tokens"] += tokens
                window["norm"] += norm
                window["n"] += 1
                elapsed = time.monotonic() - window["time"]
                progress.update(
                    step,
                    window["loss"] / max(window["tokens"], 1),
                    lr,
                    window["tokens"] / max(elapsed, 1e-9),
                )
                if step % t.log_every == 0:
                    progress.clear()
                    self._log_train(step, lr, window)
                    window = _log_window()
                if step % t.eval_every == 0:
                    progress.clear()
                    self.state.elapsed = time.monotonic() - start
                    if self._validate_and_save():
                        stopped_by = "early stopping"
                    # tokens/s counts training time only, not the validation just done
                    window["time"] += time.monotonic() - start - self.state.elapsed
            progress.clear()
            self.state.elapsed = time.monotonic() - start
            if stopped_by == "signal":
                self._save(best=False)
                log.info(
                    "stopped by %s at step %d; last.pt written, resume with --resume",
                    self.stop_signal,
                    self.state.step,
                )
            elif self.state.last_valid_step != self.state.step:
                self._validate_and_save()
            else:
                self._save(best=False)
            distributed.barrier(self.world)  # no rank leaves before rank 0 has written last.pt
            log.info(
                "finished at step %d (%s); best valid BLEU %.2f",
                self.state.step,
                stopped_by,
                self.state.best_bleu,
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.runlog.close()
            if self.world.is_main:
                log.removeHandler(self._log_handler)
                self._log_handler.close()
                log.setLevel(self._log_level)
            distributed.teardown(self.world)
        return TrainResult(
            self.state.step, self.state.best_bleu, stopped_by, self.out, self.stop_signal
        )

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_signal = signal.Signals(signum).name

    def _stop_reason(self, start: float) -> str:
        """Which stopping rule fires before the next update ('' if none); agreed by all ranks."""
        t = self.cfg.train
        rules = {
            "signal": self.stop_signal is not None,
            "max_steps": bool(t.max_steps) and self.state.step >= t.max_steps,
            "max_minutes": bool(t.max_minutes) and time.monotonic() - start >= t.max_minutes * 60,
            "max_epochs": bool(t.max_epochs) and self.stream.epochs_done >= t.max_epochs,
        }
        fired = distributed.any_each(list(rules.values()), self.world, self.device)
        return next((name for name, hit in zip(rules, fired, strict=True) if hit), "")

    def _update(self) -> tuple[float, float, int, float, bool]:
        """One optimizer update over `accumulate` batches on every rank.

        The loss is normalised by the target tokens of all batches on all ranks, so the update
        does not depend on how a batch is split (DDP averages gradients, hence `* world size`).
        Returns (summed loss, summed NLL, target tokens, grad norm, finite) over all ranks.
        """
        t = self.cfg.train
        batches = [self.stream.next().to(self.device) for _ in range(t.accumulate)]
        tokens = distributed.sum_all(
            sum(b.num_tgt_tokens for b in batches), self.world, self.device
        )
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext()
            if self.world.distributed and not last:
                sync = self.train_model.no_sync()
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
        return float(sums[0]), float(sums[1]), int(tokens), float(norm), finite

    # -- validation and checkpoints ---------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss/perplexity (teacher forcing) and BLEU/chrF of search output."""
        c = self.corpus
        self.model.eval()
        loss = nll = 0.0
        tokens = 0
        lengths = [
            (len(s) + 1, len(t) + 1) for s, t in zip(c.valid_src_ids, c.valid_tgt_ids, strict=True)
        ]
        with autocast_context(self.device, self.dtype):
            for rows in length_batches(lengths, self.cfg.train.batch_tokens):
                batch = collate(c.valid_src_ids, c.valid_tgt_ids, rows).to(self.device)
                batch_loss, batch_nll = label_smoothed_loss(
                    self.model(batch.src, batch.tgt_in),
                    batch.tgt_out,
                    self.cfg.train.label_smoothing,
                )
                loss, nll, tokens = (
                    loss + float(batch_loss),
                    nll + float(batch_nll),
                    tokens + batch.num_tgt_tokens,
                )
        translator = Translator(
            self.model, self.cfg, self.src_tok, self.tgt_tok, self.device, self.dtype
        )
        hyps = translator.translate(c.valid_src, beam=self.cfg.train.eval_beam)
        scores = score(hyps, c.valid_ref)
        self.model.train()
        self.samples = list(zip(c.valid_src, hyps, c.valid_ref, strict=True))[
            : self.cfg.train.samples
        ]
        return {
            "loss": loss / max(tokens, 1),
            "ppl": math.exp(min(nll / max(tokens, 1), 50)),
            "bleu": scores.bleu,
            "chrf": scores.chrf,
        }

    def _validate_and_save(self) -> bool:
        """Validate on rank 0, write checkpoints; returns True when early stopping fires."""
        step = self.state.step
        stop = improved = False
        metrics: dict[str, float] | None = None
        if self.world.is_main:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                metrics = self.validate()
                self._log_attention(step)
            improved = metrics["bleu"] > self.state.best_bleu
            if improved:
                self.state.best_bleu, self.state.bad_evals = metrics["bleu"], 0
            else:
                self.state.bad_evals += 1
            log.info(
                "valid step %d: loss %.3f  ppl %.2f  BLEU %.2f  chrF %.2f%s",
                step,
                metrics["loss"],
                metrics["ppl"],
                metrics["bleu"],
                metrics["chrf"],
                "  (best)" if improved else f"  (best {self.state.best_bleu:.2f})",
            )
            for src, hyp, ref in self.samples:
                log.info("  src: %s\n  hyp: %s\n  ref: %s", src, hyp, ref)
            self.runlog.scalars(step, "valid", metrics)
            self.runlog.text(
                "valid/samples",
                "\n\n".join(f"src: {s}  \nhyp: {h}  \nref: {r}" for s, h, r in self.samples),
                step,
            )
            patience = self.cfg.train.patience
            stop = bool(patience and self.state.bad_evals >= patience)
            if stop:
                log.info("early stopping: no better BLEU in %d validations", patience)
        self.state.last_valid_step = step
        self._save(best=improved, metrics=metrics)  # the others wait here while rank 0 validates
        return distributed.any_all(stop, self.world, self.device)

    def _log_attention(self, step: int) -> None:
        """Cross-attention heatmap of the first validation sentence to TensorBoard; a failed
        plot is a warning, never the end of a run."""
        sentence = next((line for line in self.corpus.valid_src if line.strip()), None)
        if not self.runlog.enabled or sentence is None:
            return
        translator = Translator(self.model, self.cfg, self.src_tok, self.tgt_tok, self.device)
        try:
            self.runlog.figure(
                "valid/attention", viz.validation_attention_figure(translator, sentence), step
            )
        except Exception as err:  # whatever broke, training goes on
            log.warning(
                "valid step %d: attention plot skipped (%s: %s)", step, type(err).__name__, err
            )
        finally:
            self.model.train()

    def _save(self, best: bool, metrics: dict[str, float] | None = None) -> None:
        """Write last.pt (with training state), and best.pt / step_N.pt as configured.

        Called on every rank (it gathers their RNG states); only rank 0 writes.
        """
        # Each rank's generators: dropout draws differ between ranks, whose batch shapes differ.
        rng_ranks = distributed.gather(
            (
                torch.get_rng_state(),
                torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            ),
            self.world,
        )
        if not self.world.is_main:
            return
        state = {
            "format": "attn-mt/1",
            "model": self.model.state_dict(),
            "config": self.cfg.to_dict(),
            "step": self.state.step,
            "epoch": self.state.epoch,
            "tokenizers": {"src": self.src_tok.model_bytes, "tgt": self.tgt_tok.model_bytes},
            "metrics": metrics or {},
        }
        if best:
            save_checkpoint(state, self.ckpt_dir / "best.pt")
        keep = self.cfg.train.keep_checkpoints
        if keep and metrics is not None:
            name = f"step_{self.state.step}.pt"
            save_checkpoint(state, self.ckpt_dir / name)
            self.state.kept_checkpoints.append(name)
            while len(self.state.kept_checkpoints) > keep:
                (self.ckpt_dir / self.state.kept_checkpoints.pop(0)).unlink(missing_ok=True)
        state["train_state"] = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state(self.device)
            if self.device.type == "cuda"
            else None,
            "rng_ranks": rng_ranks if self.world.distributed else None,
            "world_size": self.world.size,
            "epoch": self.state.epoch,
            "batch_index": self.state.batch_index,
            "best_bleu": self.state.best_bleu,
            "bad_evals": self.state.bad_evals,
            "elapsed": self.state.elapsed,
            "last_valid_step": self.state.last_valid_step,
            "kept_checkpoints": list(self.state.kept_checkpoints),
        }
        save_checkpoint(state, self.ckpt_dir / "last.pt")

    # -- logging ----------------------------------------------------------------------------------

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
            "data: %d training pairs kept, %d empty dropped, %d longer than %d tokens dropped; "
            "%d validation pairs",
            c.stats.kept,
            c.stats.empty,
            c.stats.too_long,
            cfg.data.max_len,
            len(c.valid_src),
        )
        joint = "joint" if self.src_tok is self.tgt_tok else "separate"
        log.info(
            "vocabulary: %s SentencePiece %s, %d / %d pieces; %d batches per epoch%s, "
            "padding %.1f%%",
            joint,
            cfg.tokenizer.model_type,
            self.src_tok.vocab_size,
            self.tgt_tok.vocab_size,
            len(self.stream.batches),
            " per process" if self.world.distributed else "",
            100 * self.stream.peek_padding(),
        )
        if self.state.step:
            log.info(
                "resumed at step %d (epoch %d, batch %d)",
                self.state.step,
                self.state.epoch,
                self.state.batch_index,
            )
        self.runlog.hparams(cfg, params)

    def _log_train(self, step: int, lr: float, window: dict[str, float]) -> None:
        elapsed = max(time.monotonic() - window["time"], 1e-9)
        tokens = max(window["tokens"], 1)
        metrics = {
            "loss": window["loss"] / tokens,
            "ppl": math.exp(min(window["nll"] / tokens, 50)),
            "lr": lr,
            "grad_norm": window["norm"] / max(window["n"], 1),
            "tokens_per_sec": window["tokens"] / elapsed,
            "epoch": self.stream.epoch,
        }
        log.info(
            "step %d  epoch %d  loss %.3f  ppl %.2f  lr %.2e  grad %.2f  %s tgt tok/s",
            step,
            self.stream.epoch,
            metrics["loss"],
            metrics["ppl"],
            lr,
            metrics["grad_norm"],
            f"{metrics['tokens_per_sec']:,.0f}",
        )
        self.runlog.scalars(step, "train", metrics)


def train(cfg: Config, resume: bool = False, device: str = "auto") -> TrainResult:
    """Train a model as `cfg` describes (see `Trainer`); rank 0 holds the run folder's lock."""
    main = int(os.environ.get("RANK", "0")) == 0
    with lock_run_folder(cfg.train.out_dir) if main else contextlib.nullcontext():
        return Trainer(cfg, resume, device).run()
