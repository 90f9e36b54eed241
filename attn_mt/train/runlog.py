"""What a training run writes as it goes: the human log (train.log) with its start-up,
training, validation and closing lines, TensorBoard events, metrics.jsonl, the training line
they share, and the `Monitor` a front end follows the run through (the CLI draws it on a
terminal; this module never writes control characters).

`RunLog` opens all of them together and closes them together (a context manager); on ranks
other than 0 it writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attn_mt.config import Config, TrainConfig
from attn_mt.train.memory import peak_gib

if TYPE_CHECKING:
    from attn_mt.data.batching import ShardSource
    from attn_mt.decode.translator import Translator
    from attn_mt.train.corpus import Corpus
    from attn_mt.train.state import TrainState
    from attn_mt.train.validate import Validation

log = logging.getLogger("attn_mt")


class RunLog:
    """train.log, TensorBoard events under OUT/tb and one JSON object a line in metrics.jsonl.

    On resume (`resume_step` given), what the files hold past that step is dropped, so the
    curves continue from the checkpoint without a fork.
    """

    def __init__(self, out_dir: Path, enabled: bool, resume_step: int | None):
        self.out_dir, self.enabled, self.resume_step = out_dir, enabled, resume_step

    def __enter__(self) -> RunLog:
        if not self.enabled:
            return self
        from torch.utils.tensorboard import SummaryWriter

        self.handler = logging.FileHandler(self.out_dir / "train.log", encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(self.handler)
        self.level = log.level
        if log.getEffectiveLevel() > logging.INFO:  # train.log has the INFO lines, CLI or not
            log.setLevel(logging.INFO)
        metrics = self.out_dir / "metrics.jsonl"
        if self.resume_step is not None and metrics.exists():
            kept = [
                ln
                for ln in metrics.read_text(errors="replace").splitlines()
                if (step := _logged_step(ln)) is not None and step <= self.resume_step
            ]  # a line a crash cut short is dropped too
            metrics.write_text("".join(ln + "\n" for ln in kept))
        self.jsonl = open(metrics, "a", encoding="utf-8")  # noqa: SIM115 (closed in __exit__)
        purge = self.resume_step + 1 if self.resume_step is not None else None
        self.tb = SummaryWriter(str(self.out_dir / "tb"), purge_step=purge)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.tb.close()
        self.jsonl.close()
        log.removeHandler(self.handler)
        self.handler.close()
        log.setLevel(self.level)

    def scalars(self, step: int, split: str, metrics: dict[str, float]) -> None:
        """Write `metrics` as `split/name` TensorBoard scalars and a metrics.jsonl line."""
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.tb.add_scalar(f"{split}/{name}", value, step)
        self.jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
        self.jsonl.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        """A TensorBoard text entry."""
        if self.enabled:
            self.tb.add_text(tag, text, step)

    def figure(self, tag: str, figure: Any, step: int) -> None:
        """A matplotlib figure as a TensorBoard image."""
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
            # Not `add_hparams`: it would also write a fake metric point at step 0.
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(flat, {f"valid/{cfg.train.select_metric}": 0.0}):
                self.tb.file_writer.add_summary(summary)

    def training(self, step: int, line: str, metrics: dict[str, float]) -> None:
        """The training line to the log, its figures to TensorBoard and metrics.jsonl."""
        log.info("%s", line)
        self.scalars(step, "train", metrics)

    def validation(
        self,
        step: int,
        result: Validation,
        improved: bool,
        best: tuple[str, float | None],
        share: str,
    ) -> None:
        """A validation's line and samples to the log, its figures and samples to TensorBoard
        and metrics.jsonl; `best` is the selection metric and its best score so far."""
        m, (metric, best_score) = result.metrics, best
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in result.seconds.items())
        log.info(
            "valid step %d%s: loss %.3f  ppl %.2f  BLEU %.2f  chrF %.2f%s%s",
            step,
            share,
            m["loss"],
            m["ppl"],
            m["bleu"],
            m["chrf"],
            "  (best)" if improved else f"  (best {metric} {best_score:.2f})",
            f"  {sum(result.seconds.values()):.1f} s: {phases}" if phases else "",
        )
        for src, hyp, ref in result.samples:
            log.info("  src: %s\n  hyp: %s\n  ref: %s", src, hyp, ref)
        self.scalars(step, "valid", m)
        self.text(
            "valid/samples",
            "\n\n".join(f"src: {s}  \nhyp: {h}  \nref: {r}" for s, h, r in result.samples),
            step,
        )

    def attention(self, step: int, translator: Callable[[], Translator], sentences: list[str]):
        """Cross-attention heatmap of the first non-empty sentence to TensorBoard; a failed
        plot is a warning, never the end of a run."""
        sentence = next((line for line in sentences if line.strip()), None)
        if not self.enabled or sentence is None:
            return
        from attn_mt import viz  # matplotlib: only where a run plots

        try:
            self.figure(
                "valid/attention", viz.validation_attention_figure(translator(), sentence), step
            )
        except Exception as err:  # whatever broke, training goes on
            log.warning(
                "valid step %d: attention plot skipped (%s: %s)", step, type(err).__name__, err
            )


def _logged_step(line: str) -> int | None:
    """The step of a metrics.jsonl line, or None for a line that is not a whole record."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return None
    return step if isinstance(step, int) else None


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
            "ppl": math.exp(min(self.nll / tokens, 50)),
            "lr": lr,
            "grad_norm": self.grad_norm / max(self.updates, 1),
            "tokens_per_sec": self.tokens / max(time.monotonic() - self.start, 1e-9),
            "epoch": epoch,
        }


class Monitor:
    """Follows a run as it goes; does nothing here (the CLI draws it on a terminal)."""

    def training(self, line: str) -> None:
        """After each update: the training line, as the log writes it every log_every steps."""

    def validating(self, phase: str, done: int, total: int) -> None:
        """Validation's `phase` ("loss" by teacher forcing, then "search") has done `done` of
        its `total` sentences."""


@dataclass
class RunClock:
    """The run's time: what has passed since it began (start-up included, and on resume the
    earlier processes' time), what validating took, and so what is left of the run."""

    start: float  # now() at the run's beginning, earlier processes' time subtracted
    first_step: int  # the step this process resumed from (0 for a new run)
    last_validation: float = 0.0  # seconds the latest validation took (0: none yet)
    now: Callable[[], float] = time.monotonic  # tests pass a fake clock
    validating: float = 0.0  # seconds this process spent validating
    training_began: float = field(init=False)

    def __post_init__(self) -> None:
        self.training_began = self.now()

    def elapsed(self) -> float:
        """Seconds the run has taken so far."""
        return self.now() - self.start

    def validated(self, seconds: float) -> None:
        """A validation took `seconds`."""
        self.validating += seconds
        self.last_validation = seconds

    def deadline(self, t: TrainConfig) -> float:
        """The run's second at which max_minutes stops training: the budget less the time the
        final validation will take (as long as the latest one took), so the run ends within it."""
        return t.max_minutes * 60 - self.last_validation

    def out_of_time(self, t: TrainConfig) -> bool:
        """Whether training must stop for max_minutes."""
        return bool(t.max_minutes) and self.elapsed() >= self.deadline(t)

    def schedule_seconds(self, t: TrainConfig) -> float:
        """The run's time as a time-driven lr schedule reads it: stretched so the budget's end
        falls on the deadline, where training stops, so the last update's lr is the floor."""
        if not t.max_minutes:
            return self.elapsed()
        return self.elapsed() * t.max_minutes * 60 / max(self.deadline(t), 1e-9)

    def remaining(self, t: TrainConfig, step: int, epochs: float) -> float | None:
        """Seconds left until the run ends, its final validation included: the first of
        max_steps, max_minutes and max_epochs, at this process's pace of updates and
        validations (`epochs` may be fractional); None without such a budget."""
        left = []
        if t.max_minutes:
            left.append(t.max_minutes * 60 - self.elapsed())
        steps_left = []
        if t.max_steps > 0:
            steps_left.append(t.max_steps - step)
        if t.max_epochs and epochs:
            steps_left.append(math.ceil((t.max_epochs - epochs) * step / epochs))
        done = step - self.first_step
        if steps_left and done > 0:
            training = self.now() - self.training_began - self.validating
            last = step + min(steps_left)  # the step the run ends at
            validations = last // t.eval_every - step // t.eval_every
            validations += last % t.eval_every != 0  # the final one, unless it falls due anyway
            left.append(min(steps_left) * training / done + validations * self.last_validation)
        return max(min(left), 0.0) if left else None


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


def clock(seconds: float | None) -> str:
    """h:mm:ss (m:ss under an hour); '?' for None."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@contextlib.contextmanager
def stage(name: str, announce: bool = True) -> Iterator[None]:
    """Log a start-up stage as it begins, and its time when it took more than a second."""
    if announce:
        log.info("%s ...", name)
    begin = time.monotonic()
    yield
    seconds = time.monotonic() - begin
    if seconds > 1:
        log.info("%s: %.1f s", name, seconds)


def log_start(
    runlog: RunLog, state: TrainState, corpus: Corpus, precision: str, resumed: bool
) -> None:
    """The start-up lines: the model and device, the data kept, the vocabulary and batching,
    where the weights come from; the hyper-parameters to TensorBoard."""
    cfg, stats, (src_tok, tgt_tok) = state.cfg, corpus.stats, state.tokenizers
    params = sum(p.numel() for p in {id(p): p for p in state.model.parameters()}.values())
    threads = torch.get_num_threads() if state.device.type == "cpu" else None
    onednn = state.progress.products == "onednn"
    log.info(
        "attn-mt: %s -> %s, %s parameters, device %s%s, precision %s, %d process(es)",
        cfg.data.src_lang,
        cfg.data.tgt_lang,
        f"{params:,}",
        state.device,
        f" ({threads} threads)" if threads else "",
        precision + (", float32 products through oneDNN" if onednn else ""),
        state.world.size,
    )
    log.info(
        "data: %d training pairs kept, %d empty dropped, %d longer than %d tokens dropped, "
        "%d over the length ratio dropped; %d validation pairs",
        stats.kept,
        stats.empty,
        stats.too_long,
        cfg.data.max_len,
        stats.bad_ratio,
        len(corpus.valid_src),
    )
    for line in corpus.describe():  # each training corpus, its share of an epoch
        log.info("data: %s", line)
    log.info(
        "vocabulary: %s SentencePiece %s, %d / %d pieces; %s",
        "joint" if src_tok is tgt_tok else "separate",
        cfg.tokenizer.model_type,
        src_tok.vocab_size,
        tgt_tok.vocab_size,
        state.source.describe(),
    )
    if cfg.train.init_from and not resumed:
        log.info("weights and SentencePiece models from %s; a new run", cfg.train.init_from)
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
    runlog.hparams(cfg, params)


def window_line(
    step: int,
    window: TrainWindow,
    lr: float,
    t: TrainConfig,
    run: RunClock,
    source: ShardSource,
    device: torch.device,
) -> tuple[str, dict[str, float]]:
    """The training line of the updates in `window`, and its figures (on a GPU with the peak
    memory so far)."""
    metrics = window.metrics(lr, source.epoch)
    if (peak := peak_gib(device)) is not None:
        metrics["peak_mem_gib"] = peak
    return train_line(step, metrics, t, run, source.epochs_run), metrics


def valid_share(shown: int, total: int) -> str:
    """' (on N of M validation sentences)' when validating on a subset, else ''."""
    return f" (on {shown} of {total} validation sentences)" if shown < total else ""


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
    log.info("run folder: %s; %s", t.out_dir, continue_command(t, stopped_by))


def continue_command(t: TrainConfig, stopped_by: str) -> str:
    """What continues a run that stopped so: one command whatever config or `--set` started
    it, since the run folder holds its resolved config."""
    command = f"attn-mt train --resume {shlex.quote(t.out_dir)}"
    if stopped_by == "signal":
        return f"continue it with `{command}`"
    # The budget it reached must grow, or the resumed run ends at once.
    budget = {"max_steps": "N", "max_minutes": "M", "max_epochs": "E"}.get(stopped_by)
    if budget:
        return f"train it further with `{command} --set train.{stopped_by}={budget}`"
    return f"train it further with `{command} --set train.KEY=VALUE` (a larger budget)"
