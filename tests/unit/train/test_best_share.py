"""A run whose best score came from a validation on few sentences says so where it reports
that score: the run's closing line (it printed a BLEU on 9 validation sentences as the run's
best with nothing saying how few) and `attn-mt info`'s best line."""

from __future__ import annotations

from pathlib import Path

from helpers.toy import make_config
from helpers.workspace import Stdin, run_cli
from test_budget import BUDGET, FakeTime, timed_run


def test_the_closing_line_says_how_few_sentences_the_best_score_had(
    toy_data: dict[str, Path], tmp_path: Path
) -> None:
    """As test_budget's final validation: 16 of 100 sentences fit what the budget left."""
    budget = {**BUDGET, "max_minutes": 1.0, "eval_every": 100}
    cfg = make_config(toy_data, tmp_path / "run", **budget)
    _, result = timed_run(cfg, FakeTime(now=0.0, update_seconds=[5.0] * 20), search=0.5)
    assert result.stopped_by == "max_minutes"
    log_text = (Path(cfg.train.out_dir) / "train.log").read_text()
    finished = next(line for line in log_text.splitlines() if "finished at step" in line)
    assert finished.endswith("(on 16 of 100 validation sentences, all the time budget held)")
    info = run_cli(["info", cfg.train.out_dir], Stdin(), {})
    best = next(line for line in info.stdout.decode().splitlines() if line.startswith("best: "))
    assert best.endswith("(on 16 validation sentences)"), best
