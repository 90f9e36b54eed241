"""scripts/noise_corpus.py: the noise it mixes in is of the kind its label says, about the share
asked for, a repeat after what it repeats; its score counts per rule what `clean` dropped."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("noise_corpus", ROOT / "scripts/noise_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_noise_is_what_its_label_says(script):
    rng = random.Random(0)
    de = [f"Satz {i} mit {rng.randrange(99)} Wörtern hier" for i in range(400)]
    en = [f"sentence {i} with words here" for i in range(400)]
    fr = [f"phrase {i} avec des mots" for i in range(400)]
    lines = list(script.noised(de, en, [fr], share=0.25, seed=1))
    kinds = [kind for kind, _, _ in lines]
    assert [(s, t) for k, s, t in lines if k == "clean"] == list(zip(de, en, strict=True))
    assert 0.2 < 1 - kinds.count("clean") / len(lines) < 0.3
    assert set(kinds) == {"clean", *script.KINDS}
    seen: set[tuple[str, str]] = set()
    for kind, src, tgt in lines:
        pair = (src, tgt)
        assert kind != "repeat" or pair in seen  # after the pair it repeats
        assert kind != "copy" or src == tgt
        assert kind != "swapped" or (src in en and tgt in de)
        assert kind != "wrong_lang" or tgt in fr
        assert kind != "misaligned" or (en.index(tgt) != de.index(src))
        if kind == "truncated":  # one side cut short: a prefix of its sentence
            cut, whole = (src, de) if tgt in en else (tgt, en)
            assert cut not in whole and any(line.startswith(cut + " ") for line in whole)
        seen.add(pair)
    many = list(script.noised(de, en, [fr], share=0.25, seed=1, lines=1200))
    assert len(many) == 1200 and many[: len(lines)] == lines  # a second pass, marked (1)
    assert many[len(lines)][1:] == (de[0] + " (1)", en[0] + " (1)")


def test_score_counts_each_rules_catch_per_kind(script, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("clean\nrepeat\nclean\ncopy\nrepeat\nclean\nclean\n")
    dropped = tmp_path / "dropped.tsv"
    dropped.write_text("1\t2\tdedup\ta\tb\n1\t4\tcopy\ta\ta\n1\t6\tratio\tlong\tx\n")
    figures = script.score(labels, dropped)
    assert figures["dedup"]["repeat"] == 50 and figures["copy"]["copy"] == 100
    assert figures["ratio"]["clean"] == 25 and figures["all"]["clean"] == 25
    assert figures["all"]["repeat"] == 50 and list(figures) == ["dedup", "copy", "ratio", "all"]


def test_thresholds_give_each_kinds_share_under_each_score_min(script, tmp_path):
    """The score rule's catch per score_min, from `attn-mt score --normalize` lines (the mean
    log-probability first): exp(-H) alone, and the dual H with a second file."""
    import math

    labels = tmp_path / "labels.txt"
    labels.write_text("clean\nclean\nmisaligned\nclean\nmisaligned\n")
    forward = tmp_path / "fwd.txt"  # exp(-H): 0.5, 0.04, 0.01, 0.06, 0.025
    forward.write_text(
        "".join(f"{math.log(p):.6f}\t-1 -2\n" for p in (0.5, 0.04, 0.01, 0.06, 0.025))
    )
    figures = script.thresholds(labels, forward)
    assert figures["< 0.05"]["clean"] == pytest.approx(100 / 3)
    assert figures["< 0.05"]["misaligned"] == 100 and figures["< 0.02"]["misaligned"] == 50
    assert figures["< 0.1"]["clean"] == pytest.approx(200 / 3) and figures["< 0.01"]["clean"] == 0
    # dual: |H_f - H_b| + (H_f + H_b) / 2; an equal backward file leaves the scores as they were
    assert script.thresholds(labels, forward, forward) == figures
    backward = tmp_path / "bwd.txt"  # the first pair only one way likely: H_f 0.69, H_b 4.6
    backward.write_text(f"{math.log(0.01):.6f}\n" + forward.read_text().split("\n", 1)[1])
    assert script.thresholds(labels, forward, backward)["< 0.01"]["clean"] == pytest.approx(100 / 3)
    short = tmp_path / "short.txt"
    short.write_text("-1.0\n")
    with pytest.raises(SystemExit, match="1 scores for 5 labels"):
        script.thresholds(labels, short)
