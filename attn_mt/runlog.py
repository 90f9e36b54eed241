"""What a training run writes as it goes: the human log (train.log), TensorBoard events,
metrics.jsonl, and the one-line progress display on a terminal.

`RunLog` opens all of them together and closes them together (a context manager); on ranks
other than 0 it writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_mt.config import Config

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


class Progress:
    """A one-line progress display on a terminal; nothing otherwise (the log has the lines)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled and sys.stderr.isatty()
        self.last = 0.0

    def update(self, step: int, window: TrainWindow, lr: float) -> None:
        """Redraw the line, at most twice a second."""
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        figures = window.metrics(lr, 0)
        total = f"/{self.total}" if self.total else ""
        sys.stderr.write(
            f"\r\033[Kstep {step}{total}  loss {figures['loss']:.3f}  lr {lr:.2e}  "
            f"{figures['tokens_per_sec']:,.0f} tok/s"
        )
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the line before a log line is printed."""
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
