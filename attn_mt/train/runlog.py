"""What a training run writes as it goes: the human log (train.log), TensorBoard events,
metrics.jsonl, the training line they share, and the `Monitor` a front end follows the run
through (the CLI draws it on a terminal; this module never writes control characters).

`RunLog` opens all of them together and closes them together (a context manager); on ranks
other than 0 it writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_mt.config import Config, TrainConfig

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

    def validating(self, done: int, total: int) -> None:
        """Validation has translated `done` of its `total` sentences."""


def train_line(
    step: int, metrics: dict[str, float], t: TrainConfig, elapsed: float, epochs: float
) -> str:
    """The training line: train.log's every log_every steps and the live display's after
    every update (one format, so their labels agree). `elapsed` counts the whole run."""
    total = f"/{t.max_steps}" if t.max_steps > 0 else ""
    eta = remaining_seconds(t, step, elapsed, epochs)
    return (
        f"step {step}{total}  elapsed {clock(elapsed)}  ETA {clock(eta)}  "
        f"epoch {metrics['epoch']}  loss {metrics['loss']:.3f}  ppl {metrics['ppl']:.2f}  "
        f"lr {metrics['lr']:.2e}  grad {metrics['grad_norm']:.2f}  "
        f"{metrics['tokens_per_sec']:,.0f} tgt tok/s"
    )


def remaining_seconds(t: TrainConfig, step: int, elapsed: float, epochs: float) -> float | None:
    """Seconds left until the first of max_steps, max_minutes and max_epochs ends the run, at
    the pace so far (`epochs` may be fractional); None without such a budget."""
    left = []
    if t.max_minutes:
        left.append(t.max_minutes * 60 - elapsed)
    if t.max_steps > 0 and step:
        left.append((t.max_steps - step) * elapsed / step)
    if t.max_epochs and epochs:
        left.append((t.max_epochs - epochs) * elapsed / epochs)
    return max(min(left), 0.0) if left else None


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
