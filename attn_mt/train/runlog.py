"""What a training run writes as it goes: the human log (train.log), TensorBoard events and
metrics.jsonl (`RunLog`, which opens them all together and closes them together; on ranks other
than 0 it writes nothing), and the `Monitor` a front end follows the run through (the CLI draws
it on a terminal). The lines themselves are `loglines.py`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attn_mt.config.schema import Config
from attn_mt.decode.translator import Translator
from attn_mt.scores import figures_line

log = logging.getLogger("attn_mt")


@dataclass
class Validation:
    """What one validation measured (`validate.validate`), as the run log writes it."""

    metrics: dict[str, float]  # loss, ppl, the scores (bleu, chrf, ...), sentences
    samples: list[tuple[str, str, str]]  # (source, hypothesis, reference) to show
    seconds: dict[str, float] = field(default_factory=dict)  # per phase: loss, search, score
    hypotheses: list[str] = field(default_factory=list)  # every output, in order
    pairs: dict[str, dict[str, float]] = field(default_factory=dict)  # per direction (multilingual)
    general: dict[str, float] = field(default_factory=dict)  # data.valid_general's, if given


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

    def scalars(
        self, step: int, split: str, metrics: dict[str, float], record: str | None = None
    ) -> None:
        """Write `metrics` as `split/name` TensorBoard scalars and a metrics.jsonl line whose
        split is `record` (default: `split`)."""
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.tb.add_scalar(f"{split}/{name}", value, step)
        self.jsonl.write(json.dumps({"step": step, "split": record or split, **metrics}) + "\n")
        self.jsonl.flush()

    def direction(self, step: int, pair: str, metrics: dict[str, float]) -> None:
        """One direction's validation figures: a log line, `valid/PAIR/name` TensorBoard
        scalars and a metrics.jsonl line with `"pair": PAIR` (the mean's line has none)."""
        off_target = metrics.get("off_target")
        log.info(
            "  %s: loss %.3f  %s%s",
            pair,
            metrics["loss"],
            figures_line(metrics),
            f"  off-target {off_target:.1f}%" if off_target is not None else "",
        )
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.tb.add_scalar(f"valid/{pair}/{name}", value, step)
        self.jsonl.write(json.dumps({"step": step, "split": "valid", "pair": pair, **metrics}))
        self.jsonl.write("\n")

    def general(
        self, step: int, metrics: dict[str, float], start: dict[str, float], metric: str
    ) -> None:
        """data.valid_general's figures: a log line, with the change in `metric` since the
        run's start where it was measured there (`start`: how much a fine-tuned model forgot),
        `valid_general/name` TensorBoard scalars and a metrics.jsonl line of split
        "valid_general" (written before the run's own "valid" line of the step)."""
        change = ""
        if metric in start and metric in metrics:
            change = f"  ({metric} {metrics[metric] - start[metric]:+.2f} since step 0)"
        log.info(
            "  general: loss %.3f  ppl %.2f  %s%s",
            metrics["loss"],
            metrics["ppl"],
            figures_line(metrics),
            change,
        )
        self.scalars(step, "valid_general", metrics)

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
                self.tb._get_file_writer().add_summary(summary)

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
        general_start: dict[str, float] | None = None,
    ) -> None:
        """A validation's line and samples to the log, its figures and samples to TensorBoard
        and metrics.jsonl; `best` is the selection metric and its best score so far,
        `general_start` data.valid_general's figures at the run's start (`general`)."""
        m, (metric, best_score) = result.metrics, best
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in result.seconds.items())
        log.info(
            "valid step %d%s: loss %.3f  ppl %.2f  %s%s%s",
            step,
            share,
            m["loss"],
            m["ppl"],
            figures_line(m),
            "  (best)" if improved else f"  (best {metric} {best_score:.2f})",
            f"  {sum(result.seconds.values()):.1f} s: {phases}" if phases else "",
        )
        if result.general:
            self.general(step, result.general, general_start or {}, metric)
        for pair, figures in result.pairs.items():
            self.direction(step, pair, figures)
        for src, hyp, ref in result.samples:
            log.info("  src: %s\n  hyp: %s\n  ref: %s", src, hyp, ref)
        self.scalars(step, "valid", m)
        self.text(
            "valid/samples",
            "\n\n".join(f"src: {s}  \nhyp: {h}  \nref: {r}" for s, h, r in result.samples),
            step,
        )

    def validation_loss(
        self, step: int, metrics: dict[str, float], seconds: float, share: str
    ) -> None:
        """A loss-only check's line to the log; its figures to TensorBoard's valid/ curves and
        to metrics.jsonl as split "valid_loss" (a record no checkpoint was saved for)."""
        log.info(
            "valid step %d%s: loss %.3f  ppl %.2f  (loss only)  %.1f s",
            step,
            share,
            metrics["loss"],
            metrics["ppl"],
            seconds,
        )
        self.scalars(step, "valid", metrics, record="valid_loss")

    def attention(
        self, step: int, translator: Translator, sentences: list[str], tgt_lang: str | None
    ) -> None:
        """Cross-attention heatmap of the first non-empty sentence (translated into `tgt_lang`)
        to TensorBoard; a failed plot is a warning, never the end of a run."""
        sentence = next((line for line in sentences if line.strip()), None)
        if not self.enabled or sentence is None:
            return
        from attn_mt import viz  # matplotlib: only where a run plots

        try:
            figure = viz.validation_attention_figure(translator, sentence, tgt_lang)
            self.figure("valid/attention", figure, step)
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


class Monitor(Protocol):
    """Follows a run as it goes (the CLI's display draws it on a terminal)."""

    def training(self, line: str, elapsed: float, eta: float | None) -> None:
        """After each update: the training line, as the log writes it every log_every steps,
        made at the run's `elapsed` seconds with `eta` seconds left (None: not known)."""

    def validating(self, phase: str, done: int, total: int) -> None:
        """Validation's `phase` ("loss" by teacher forcing, then "search"; of a multilingual
        run with the direction: "search de-en") has done `done` of its `total` sentences."""


class QuietMonitor:
    """The `Monitor` of a run nothing follows: it shows nothing."""

    def training(self, line: str, elapsed: float, eta: float | None) -> None:
        """Shows nothing."""

    def validating(self, phase: str, done: int, total: int) -> None:
        """Shows nothing."""
