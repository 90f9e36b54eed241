"""What a run says as it goes, in train.log and on the live display: the start-up lines (the
model, the device, the data, the vocabulary and batching: `log_start`), the training line over a
`TrainWindow` of updates (one format for both, so their labels agree), and the closing lines
with the command that continues the run and where this process's time went. `runlog.RunLog`
writes them with the figures; this module never writes control characters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch

from attn_mt.config.schema import TrainConfig
from attn_mt.data.corpus import Corpus
from attn_mt.data.epochs import ShardBatches
from attn_mt.model.loss import perplexity
from attn_mt.model.transformer import parameter_count
from attn_mt.runfolder import continue_command
from attn_mt.train.clock import RunClock, clock
from attn_mt.train.memory import peak_gib
from attn_mt.train.runlog import RunLog
from attn_mt.train.state import TrainState

log = logging.getLogger("attn_mt")


def log_start(
    runlog: RunLog, state: TrainState, corpus: Corpus, precision: str, resumed: bool
) -> None:
    """The start-up lines: the model and device, the data kept, the vocabulary and batching,
    where the weights come from; the hyper-parameters to TensorBoard."""
    params = parameter_count(state.model)
    _log_model(state, precision, params)
    _log_data(state, corpus)
    _log_weights(state, params, resumed)
    runlog.hparams(state.cfg, params)


def _log_model(state: TrainState, precision: str, params: int) -> None:
    """The language pair, the model's size, the device, threads, precision and processes."""
    cfg = state.cfg
    threads = torch.get_num_threads() if state.device.type == "cpu" else None
    stream = cfg.train.bf16_stream
    notes = {  # said after the precision where they hold
        ", float32 products through oneDNN": state.progress.matmul_backend == "onednn",
        ", bf16 residual stream": stream and precision == "bf16",
        " (train.bf16_stream: no effect outside bf16)": stream and precision != "bf16",
    }
    log.info(
        "attn-mt: %s, %s parameters, device %s%s, precision %s, %d process(es)",
        cfg.data.in_words(),
        f"{params:,}",
        state.device,
        f" ({threads} threads)" if threads else "",
        precision + "".join(note for note, holds in notes.items() if holds),
        state.world.size,
    )


def _log_data(state: TrainState, corpus: Corpus) -> None:
    """The pairs kept and dropped, each corpus's share, the augmentation, the vocabulary and
    the batching."""
    cfg, stats, (src_tok, tgt_tok) = state.cfg, corpus.stats, state.tokenizers
    general = corpus.general
    log.info(
        "data: %d training pairs kept, %s; %d validation pairs%s",
        stats.kept,
        stats.describe(),
        len(corpus.valid_src),
        f" and {len(general.valid_src)} of data.valid_general" if general else "",
    )
    for line in corpus.describe():  # each training corpus: what its rules dropped, its share
        log.info("data: %s", line)
    if cfg.data.augment.any():  # changed in the shards, the same way every epoch
        shares = dataclasses.asdict(cfg.data.augment)
        log.info(
            "data: pairs changed as data.augment says (drawn from train.seed %d): %s",
            cfg.train.seed,
            ", ".join(f"{key} {100 * share:g}%" for key, share in shares.items() if share),
        )
    log.info(
        "vocabulary: %s SentencePiece %s, %d / %d pieces; %s",
        "joint" if src_tok is tgt_tok else "separate",
        cfg.tokenizer.model_type,
        src_tok.vocab_size,
        tgt_tok.vocab_size,
        state.source.describe(),
    )


def _log_weights(state: TrainState, params: int, resumed: bool) -> None:
    """Where the weights come from (a checkpoint to start from, a resumed run), which train
    (train.freeze) and whether an average of them is kept (EMA)."""
    cfg = state.cfg
    if cfg.train.init_from and not resumed:
        log.info(
            "weights and SentencePiece models from %s; a new run (the model, tokenizer and "
            "decode keys its config leaves out are the checkpoint's)",
            cfg.train.init_from,
        )
    if cfg.train.freeze:
        trained = sum(p.numel() for p in state.model.parameters() if p.requires_grad)
        log.info(
            "frozen (train.freeze): %s; %s of the %s parameters train",
            ", ".join(cfg.train.freeze),
            f"{trained:,}",
            f"{params:,}",
        )
    if state.ema:
        log.info("weight EMA, decay %g: validation and best.pt use the average", state.ema.decay)
    if resumed:
        position = state.source.state_dict()
        log.info(
            "resumed at step %d (epoch %d, batch %d)",
            state.progress.step,
            position["epoch"],
            position["index"],
        )


@dataclass
class TrainWindow:
    """Running sums of the training figures between two log lines."""

    loss: float = 0.0  # summed label-smoothed loss
    nll: float = 0.0  # summed negative log-likelihood
    tokens: int = 0  # target tokens
    grad_norm: float = 0.0  # summed gradient norms
    updates: int = 0
    start: float = field(default_factory=time.monotonic)

    def add(self, loss: float, nll: float, tokens: int, grad_norm: float) -> None:
        """Count one update's figures."""
        self.loss += loss
        self.nll += nll
        self.tokens += tokens
        self.grad_norm += grad_norm
        self.updates += 1

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (a validation) out of the tokens/s."""
        self.start += seconds

    def metrics(self, lr: float, epoch: int) -> dict[str, float]:
        """Per-token loss and perplexity, mean gradient norm and throughput of the window."""
        tokens = max(self.tokens, 1)
        return {
            "loss": self.loss / tokens,
            "ppl": perplexity(self.nll, self.tokens),
            "lr": lr,
            "grad_norm": self.grad_norm / max(self.updates, 1),
            "tokens_per_sec": self.tokens / max(time.monotonic() - self.start, 1e-9),
            "epoch": epoch,
        }


def train_line(
    step: int, metrics: dict[str, float], t: TrainConfig, run: RunClock, epochs: float
) -> str:
    """The training line: train.log's every log_every steps and the live display's after
    every update (one format, so their labels agree). Its times count the whole run."""
    total = f"/{t.max_steps}" if t.max_steps > 0 else ""
    eta = run.remaining(t, step, epochs)
    return (
        f"step {step}{total}  elapsed {clock(run.elapsed())}  ETA {clock(eta)}  "
        f"epoch {metrics['epoch']}  loss {metrics['loss']:.3f}  ppl {metrics['ppl']:.2f}  "
        f"lr {metrics['lr']:.2e}  grad {metrics['grad_norm']:.2f}  "
        f"{metrics['tokens_per_sec']:,.0f} tgt tok/s"
        + (f"  mem {metrics['peak_mem_gib']:.1f} GiB" if "peak_mem_gib" in metrics else "")
    )


def window_line(
    step: int,
    window: TrainWindow,
    lr: float,
    t: TrainConfig,
    run: RunClock,
    source: ShardBatches,
    device: torch.device,
) -> tuple[str, dict[str, float]]:
    """The training line of the updates in `window`, and its figures (on a GPU with the peak
    memory so far)."""
    metrics = window.metrics(lr, source.epoch)
    if (peak := peak_gib(device)) is not None:
        metrics["peak_mem_gib"] = peak
    return train_line(step, metrics, t, run, source.epochs_run), metrics


def valid_share(shown: int, total: int, why: str = "") -> str:
    """' (on N of M validation sentences[, why])' when validating on a subset, else ''."""
    why = f", {why}" if why else ""
    return f" (on {shown} of {total} validation sentences{why})" if shown < total else ""


def log_finish(
    stopped_by: str,
    stop_signal: str | None,
    step: int,
    t: TrainConfig,
    best: float | None,
    share: str,
) -> None:
    """The closing lines: how the run stopped, at which step, with which best score, where the
    run is and the command that continues it."""
    if stopped_by == "signal":
        log.info("stopped by %s at step %d; last.pt written", stop_signal, step)
    if stopped_by == "early stopping":
        log.info("early stopping: no better %s in %d validations", t.select_metric, t.patience)
    log.info(
        "finished at step %d (%s); best valid %s %s%s",
        step,
        stopped_by,
        t.select_metric,
        "-" if best is None else f"{best:.2f}",
        share,
    )
    log.info("run folder: %s; %s", t.out_dir, continue_command(t.out_dir, stopped_by))


def log_general(start: dict[str, float], at_best: dict[str, float], metric: str) -> None:
    """The closing line on data.valid_general (when given): its `metric` where best.pt was,
    and against the run's start where it was measured there (a fine-tuned run's: how much
    of the general domain the model kept)."""
    if metric not in at_best:
        return
    before = f", {start[metric]:.2f} at step 0 ({at_best[metric] - start[metric]:+.2f})"
    log.info(
        "general set (data.valid_general): %s %.2f at best.pt%s",
        metric,
        at_best[metric],
        before if metric in start else "",
    )


def log_timesheet(sheet: dict[str, float]) -> None:
    """Where this process's time went (`RunClock.timesheet`): each part and its share."""
    total = sum(sheet.values())
    parts = ", ".join(
        f"{name} {span(seconds)} ({100 * seconds / max(total, 1e-9):.1f}%)"
        for name, seconds in sheet.items()
    )
    log.info("time in this process %s: %s", span(total), parts)


def span(seconds: float) -> str:
    """Seconds to one decimal under a minute, else as `clock` says them."""
    return f"{seconds:.1f} s" if seconds < 60 else clock(seconds)
