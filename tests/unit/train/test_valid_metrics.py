"""Validation's scores: `train.valid_metrics` adds chrF++ and TER to the rows of metrics.jsonl
and the log line; `train.select_metric: ter` keeps the lowest TER as best.pt (and `info` says
so), as the loss does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.toy import invoke, load_raw, run

from attn_mt.train.runlog import Validation
from attn_mt.train.validate import Validator


def valid_rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == "valid"]


def test_valid_metrics_add_scores_to_the_rows_and_the_log(toy_config) -> None:
    cfg = toy_config(max_steps=2, eval_every=2, valid_metrics=["chrf++", "ter"])
    run(cfg)
    out = Path(cfg.train.out_dir)
    (row,) = valid_rows(out)
    assert {"bleu", "chrf++", "ter"} <= set(row) and "chrf" not in row  # bleu: select_metric's
    assert 0 <= row["chrf++"] <= 100 and row["ter"] >= 0
    log_text = (out / "train.log").read_text()
    assert f"BLEU {row['bleu']:.2f}  chrF++ {row['chrf++']:.2f}  TER {row['ter']:.2f}" in log_text


def test_select_metric_ter_keeps_the_lowest(toy_config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validations at steps 1, 2, 3 score TER 60, 40, 50 (and BLEU rising): best.pt is step 2,
    and two validations without a lower TER stop the run early."""
    figures = iter([(60.0, 10.0), (40.0, 20.0), (50.0, 30.0), (45.0, 40.0)])

    def validate(self: Validator) -> Validation:
        ter, bleu = next(figures)
        return Validation({"loss": 1.0, "ppl": math.e, "bleu": bleu, "ter": ter}, [])

    monkeypatch.setattr(Validator, "validate", validate)
    cfg = toy_config(max_steps=4, eval_every=1, select_metric="ter", patience=2)
    result = run(cfg)
    out = Path(cfg.train.out_dir)
    assert (result.best_score, result.stopped_by) == (40.0, "early stopping")
    assert load_raw(out / "checkpoints" / "best.pt")["step"] == 2
    shown = invoke("info", out)
    assert shown.exit_code == 0, shown.output
    assert "best: valid loss 1.00, ppl 2.72, bleu 20.00, ter 40.00 at step 2" in shown.output
