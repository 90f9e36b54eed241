"""Two systems with the same output, line for line (or outputs the metric scores alike, sentence
for sentence), are identical: p 1, never `*` (sacreBLEU's
paired tests count a resample whose difference is 0 as at least as large and give p 0.001 or
0.0001); a system that differs keeps sacreBLEU's own p."""

from __future__ import annotations

import random

import pytest

from attn_mt.compare import compare

WORDS = [f"w{i}" for i in range(20)]


@pytest.mark.parametrize("paired", ["bs", "ar"])
def test_identical_outputs_are_said_to_be_identical(paired: str) -> None:
    rng = random.Random(3)
    refs = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(30)]
    base = [" ".join(w if rng.random() < 0.6 else "x" for w in r.split()) for r in refs]
    other = [" ".join(w if rng.random() < 0.9 else "x" for w in r.split()) for r in refs]
    found = compare([("base", base), ("copy", list(base)), ("other", other)], refs, paired=paired)
    copy, differs = found.figures[1], found.figures[2]
    assert all(f.identical and f.p == 1.0 for f in copy.values())
    assert all(not f.identical and f.p is not None and f.p < 0.05 for f in differs.values())
    assert [s["metrics"]["bleu"]["p"] for s in found.to_dict()["systems"]][:2] == [None, 1.0]
    rows = found.table().splitlines()
    assert "p 1 identical" in rows[2] and "*" not in rows[2] and "*" in rows[3]
    assert "identical: the baseline's scores, sentence for sentence" in found.table()


def test_outputs_the_metric_reads_alike_are_identical() -> None:
    """A space before the final full stop: BLEU's 13a tokenizer and chrF read it alike."""
    refs = ["a dog runs .", "two men sit on a bench .", "a child plays ."]
    base = ["a dog runs.", "two men sit on the bench.", "a kid plays."]
    spaced = [line[:-1] + " ." for line in base]
    found = compare([("base", base), ("spaced", spaced)], refs, metrics=["bleu", "chrf"])
    assert all(f.identical and f.p == 1.0 for f in found.figures[1].values())
    worded = [*base[:2], "a kid runs."]
    found = compare([("base", base), ("worded", worded)], refs, metrics=["bleu", "chrf"])
    assert not any(f.identical for f in found.figures[1].values())
