"""`attn_mt.scores`: each metric equals sacreBLEU's on fixed files, with its signature; the
names `--metrics` takes; the default output keeps its shape; which way each metric is better."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import TrainConfig
from attn_mt.errors import ConfigError, UserError
from attn_mt.scores import METRICS, check_metrics, parse_metrics, score

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "house",
    "red",
    "Blue",
    "runs",
    "quickly",
    "under",
    "over",
    "big",
    "small",
    ",",
    ".",
]


def fixed_corpus(count: int, seed: int = 7) -> tuple[list[str], list[str]]:
    """Hypotheses and references: random sentences, the hypotheses with words changed,
    dropped and recased, one hypothesis empty."""
    rng = random.Random(seed)
    hyps, refs = [], []
    for _ in range(count):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        hyp = [w if rng.random() < 0.7 else rng.choice(WORDS).upper() for w in ref]
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp[: len(hyp) - rng.randint(0, 2)]))
    hyps[3] = ""
    return hyps, refs


@pytest.mark.parametrize(
    ("name", "metric"),
    [("bleu", BLEU()), ("chrf", CHRF()), ("chrf++", CHRF(word_order=2)), ("ter", TER())],
)
def test_each_metric_equals_sacrebleus_with_its_signature(name: str, metric) -> None:
    hyps, refs = fixed_corpus(50)
    expected = metric.corpus_score(hyps, [refs])
    found = score(hyps, refs, [name])
    assert found.values == {name: expected.score}
    assert found.signatures == {name: str(metric.get_signature())}
    assert found.sentences == 50


def test_the_default_is_bleu_and_chrf_in_todays_shape() -> None:
    hyps, refs = fixed_corpus(20)
    found = score(hyps, refs)
    bleu, chrf = sacrebleu.corpus_bleu(hyps, [refs]), sacrebleu.corpus_chrf(hyps, [refs])
    assert list(found.to_dict()) == [
        "bleu",
        "chrf",
        "bleu_signature",
        "chrf_signature",
        "sentences",
    ]
    assert (found.bleu, found.chrf) == (bleu.score, chrf.score)
    lines = str(found).splitlines()
    assert lines[0] == f"BLEU {bleu.score:.2f}  chrF {chrf.score:.2f}  (20 sentences)"
    assert lines[1:] == [
        f"BLEU signature: {found.signatures['bleu']}",
        f"chrF signature: {found.signatures['chrf']}",
    ]


def test_all_four_in_one_call_are_printed_in_order() -> None:
    hyps, refs = fixed_corpus(20)
    found = score(hyps, refs, ["ter", "chrf++", "bleu"])
    assert list(found.values) == ["ter", "chrf++", "bleu"]
    assert str(found).startswith("BLEU ")  # the first line in METRICS' order
    assert "chrF++ " in str(found).splitlines()[0] and "TER signature: " in str(found)
    assert set(found.to_dict()) >= {"ter", "ter_signature", "chrf++", "chrf++_signature"}


def test_misaligned_or_empty_input_is_a_user_error() -> None:
    with pytest.raises(UserError, match="2 hypotheses but 1 references"):
        score(["a", "b"], ["a"])
    with pytest.raises(UserError, match="nothing to score"):
        score([], [])


def test_metric_names() -> None:
    assert parse_metrics("bleu, CHRF++,ter,bleu") == ("bleu", "chrf++", "ter")
    with pytest.raises(UserError, match=r"--metrics bleu,rouge: unknown metric 'rouge'; use bleu"):
        parse_metrics("bleu,rouge")
    with pytest.raises(UserError, match="name at least one metric"):
        parse_metrics(" , ")
    with pytest.raises(UserError, match="--metrics comet needs --comet-model PATH"):
        check_metrics(["bleu", "comet"], None)
    with pytest.raises(UserError, match="--comet-model is read by --metrics comet only"):
        check_metrics(["bleu"], Path("model"))


def test_ter_alone_is_lower_is_better() -> None:
    assert [name for name, info in METRICS.items() if not info.higher_is_better] == ["ter"]
    better = {m: TrainConfig(select_metric=m).higher_is_better for m in ("bleu", "chrf++")}
    assert better == {"bleu": True, "chrf++": True}
    assert not TrainConfig(select_metric="ter").higher_is_better
    assert not TrainConfig(select_metric="loss").higher_is_better


def test_valid_metrics_are_checked_and_select_metric_always_scored() -> None:
    t = TrainConfig(valid_metrics=["chrf++"], select_metric="ter")
    assert t.scored_metrics() == ("chrf++", "ter")
    assert TrainConfig(select_metric="loss").scored_metrics() == ("bleu", "chrf")
    for bad in (["bleu", "comet"], [], ["rouge"]):
        with pytest.raises(ConfigError, match="train.valid_metrics: .* is invalid; must list"):
            config_from_dict({"train": {"valid_metrics": bad}, "data": {"dataset": "multi30k"}})
