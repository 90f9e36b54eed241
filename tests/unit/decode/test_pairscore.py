"""The `score` rule of data.filters: dual conditional cross-entropy from `attn-mt score`'s forced
decoding, applied by `attn-mt clean` to the pairs the other rules kept; a model of the wrong
direction and a `prepare` asked to score are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.clirun import assert_user_error, write_yaml
from helpers.models import random_checkpoint
from helpers.toy import toy_config_dict, toy_pairs, write_lines
from helpers.workspace import run_cli

from attn_mt.checkpoint import save_checkpoint
from attn_mt.config.data import FilterConfig
from attn_mt.config.file import load_config
from attn_mt.data.prepare import prepare_shards
from attn_mt.decode.forced import score_lines
from attn_mt.decode.pairscore import PairScore
from attn_mt.errors import ConfigError


@pytest.fixture(scope="module")
def models(toy_data, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Untrained xx -> yy and yy -> xx checkpoints (the second: the first's weights, relabelled)."""
    folder = tmp_path_factory.mktemp("pairscore")
    forward = random_checkpoint(folder, toy_data)
    state = torch.load(forward, weights_only=True)
    state["config"]["data"].update(src_lang="yy", tgt_lang="xx")
    backward = folder / "backward.pt"
    save_checkpoint(state, backward)
    return forward, backward


@pytest.fixture(scope="module")
def dual(models) -> PairScore:
    forward, backward = models
    rules = FilterConfig(score=str(forward), score_backward=str(backward), score_min=0.5)
    return PairScore(rules, "xx", "yy", device="cpu")


def test_the_score_is_exp_of_minus_the_dual_cross_entropy(dual):
    src, tgt = toy_pairs(20, seed=4)
    scores = dual.scores(src, tgt)
    assert dual.backward is not None
    h_fwd = np.array([-p.normalized for p in score_lines(dual.forward.translator, src, tgt)])
    h_bwd = np.array([-p.normalized for p in score_lines(dual.backward.translator, tgt, src)])
    expected = np.exp(-(np.abs(h_fwd - h_bwd) + (h_fwd + h_bwd) / 2))
    assert scores == pytest.approx(expected, rel=1e-6) and ((scores > 0) & (scores <= 1)).all()
    assert (dual.drops(src, tgt) == (expected < 0.5)).all()
    dual.backward, backward = None, dual.backward
    try:
        assert dual.scores(src, tgt) == pytest.approx(np.exp(-h_fwd), rel=1e-6)  # forward alone
    finally:
        dual.backward = backward


def test_clean_drops_the_pairs_under_score_min(models, dual, toy_data, tmp_path):
    forward, backward = models
    src, tgt = toy_pairs(60, seed=5)
    files = {side: write_lines(tmp_path / f"train.{side}", lines) for side, lines in
             (("src", src), ("tgt", tgt))}  # fmt: skip
    scores = dual.scores(src, tgt)
    threshold = float(np.median(scores))
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["train"] = {"src": str(files["src"]), "tgt": str(files["tgt"])}
    raw["data"]["filters"] = {
        "score": forward.name,  # relative to the config's folder
        "score_backward": str(backward),
        "score_min": threshold,
    }
    config = write_yaml(forward.parent / "score.yaml", raw)
    out = tmp_path / "out"
    result = run_cli(["clean", "-c", config, "--out", out, "--device", "cpu"], None, {})
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads((out / "report.json").read_text())["corpora"][0]
    rows = [line.split("\t") for line in (out / "dropped.tsv").read_text().splitlines()]
    dropped = sorted(int(row[1]) - 1 for row in rows if row[2] == "score")
    assert dropped == np.flatnonzero(scores < threshold).tolist()
    assert report["dropped"]["score"] == len(dropped) and report["kept"] == 60 - len(dropped)
    # prepare cannot score: one line says where it can
    with pytest.raises(ConfigError, match=r"data.filters.score: runs a model, in `attn-mt clean`"):
        prepare_shards(load_config(config, training=False), workers=1)


def test_a_model_of_the_wrong_direction_is_refused(models, toy_data, tmp_path):
    forward, _ = models
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["filters"] = {"score": str(forward), "score_backward": str(forward)}
    config = write_yaml(tmp_path / "wrong.yaml", raw)
    result = run_cli(
        ["clean", "-c", config, "--out", tmp_path / "out", "--device", "cpu"], None, {}
    )
    assert_user_error(
        result, "data.filters.score_backward:", "translates xx -> yy; this corpus needs yy -> xx"
    )
    assert not (tmp_path / "out").exists()


def test_the_quantiles_printed_are_those_of_the_scores_given(models, toy_data, tmp_path):
    """`clean` prints, per score rule, the score_min that would drop each share of the pairs it
    scored (to 1 / BINS) and the share its score_min dropped: read from the scores themselves."""
    from attn_mt.decode.pairscore import BINS, QUANTILES

    forward, _ = models
    src, tgt = toy_pairs(80, seed=6)
    scorer = PairScore(FilterConfig(score=str(forward)), "xx", "yy", device="cpu")
    assert scorer.quantiles() == []
    scores = scorer.scores(src, tgt)  # a query: not counted
    assert scorer.quantiles() == []
    scorer.minimum = minimum = float(np.median(scores))  # half of them dropped
    drops = np.concatenate([scorer.drops(src[:30], tgt[:30]), scorer.drops(src[30:], tgt[30:])])
    assert drops.tolist() == (scores < minimum).tolist()
    assert scorer.drops(src, tgt).tolist() == drops.tolist()  # each pair twice in the histogram
    for share, threshold in scorer.quantiles():
        assert (scores < threshold).mean() >= share > (scores < threshold - 1 / BINS).mean()
    assert [share for share, _ in scorer.quantiles()] == list(QUANTILES)
    line = scorer.summary()
    assert line.startswith("score: 160 pairs scored: 1% under ")
    share = 100 * 2 * drops.sum() / 160
    assert line.endswith(f"score_min {minimum:g} dropped {share:.1f}% of them")
    # and the clean command prints that line
    files = {side: write_lines(tmp_path / f"train.{side}", lines) for side, lines in
             (("src", src), ("tgt", tgt))}  # fmt: skip
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["train"] = {"src": str(files["src"]), "tgt": str(files["tgt"])}
    raw["data"]["filters"] = {"score": str(forward), "score_min": minimum}
    config = write_yaml(tmp_path / "score.yaml", raw)
    command = ["clean", "-c", config, "--out", tmp_path / "out", "--device", "cpu"]
    result = run_cli(command, None, {})
    assert result.returncode == 0, result.stderr.decode()
    printed = [x for x in result.stdout.decode().splitlines() if x.startswith("score: ")]
    quantiles = line.split("scored: ")[1].split(";")[0]  # the same scores, each twice
    dropped = f"score_min {minimum:g} dropped {100 * drops.sum() / 80:.1f}% of them"
    assert printed == [f"score: 80 pairs scored: {quantiles}; {dropped}"]
