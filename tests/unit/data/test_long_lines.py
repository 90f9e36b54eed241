"""A crafted long line costs the rules of data.filters time linear in its length and langid
bounded memory: every pair rule scores lines of 200,000 characters shaped against each of its
patterns in a child process given a minute (a quadratic rule takes minutes: the old e-mail
pattern took 11 s at 40,000, so ~5 min here); the markup rule decides as its old, quadratic
pattern did; langid judges a long side on its first `JUDGED_CHARS` characters, with the same
score and in little memory whatever the line. `scripts/bench_clean_lines.py` times it."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tracemalloc

import pytest

from attn_mt.data.rules import _has_markup
from attn_mt.langid import JUDGED_CHARS, language_scores

# The markup pattern before it was made linear: the reference its decisions are held to.
QUADRATIC_MARKUP = re.compile(
    r"<[A-Za-z!/][^<>]{0,200}>"
    r"|\b(?:https?|ftp)://|\bwww\.[\w-]+\."
    r"|[\w.+-]+@[\w-]+\.[A-Za-z]{2,}"
    r"|©"
    r"|\s\|\s.*\s\|\s"
)

# Each rule scores each crafted line, both sides; prints "done" when all are scored.
LINEAR = """
from attn_mt.config.data import FilterConfig
from attn_mt.data.filters import PairFilter
from attn_mt.data.rules import PairRule

n = 200_000
lines = [
    "a" * n + "@",  # an address's user part, no domain: read from each start before
    "a" * n + "@" + "b" * n,
    "a." * (n // 2) + "@x",
    " | " + "a" * n,  # a menu bar's first bar, none after
    (" | a" + chr(10)) * (n // 5),
    "<a" * (n // 2),
    ("<a" + "b" * 199) * (n // 200),
    "a@" * (n // 2),
    "a@" + "b-" * (n // 2) + "@",
    "www." * (n // 4),
    ("x@" + "a" * 20 + ".") * (n // 24),
    "1" * n,
    "Hund " * (n // 5),
    "я" * n,
    "我" * n,
]
rules = FilterConfig(max_chars=10, ratio=2, markup=True, long_words=40, digits=True, copy=True,
                     script=True)
for langs in (("de", "en"), ("ru", "zh")):
    for rule in PairFilter(rules, *langs).rules:
        if isinstance(rule, PairRule):
            for line in lines:
                rule.accept(rule.score(line, line))
print("done")
"""


def test_every_pair_rule_is_linear_in_the_line_length() -> None:
    """Linear: seconds even on a loaded machine; quadratic: minutes."""
    try:
        found = subprocess.run(
            [sys.executable, "-c", LINEAR], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a rule took over a minute on a line of 200,000 characters: not linear")
    assert found.returncode == 0 and found.stdout.strip() == "done", found.stderr


def test_markup_decides_as_the_quadratic_pattern_did() -> None:
    """On random lines of the characters the patterns turn on, the same decision every time."""
    draw = random.Random(0)
    alphabet = "ab.+-@_<>/!| w:©\t" + "ä"
    for _ in range(20_000):
        line = "".join(draw.choice(alphabet) for _ in range(draw.randint(1, 24)))
        assert _has_markup(line) == (QUADRATIC_MARKUP.search(line) is not None), line
    for line in ("Mail me at a.b+c@example.org!", "x@y.de", "@example.com", "a@b.c"):
        assert _has_markup(line) == (QUADRATIC_MARKUP.search(line) is not None), line


def test_langid_judges_a_long_side_on_its_first_part_in_bounded_memory() -> None:
    """The same probability as its first JUDGED_CHARS characters; a chunk holding one line
    of 300,000 characters costs no more memory than short lines would (before, a byte grid of
    the longest line times the chunk's lines: ~200 MB here, 2.4 GB for 1.3 MB lines)."""
    scores = language_scores()
    german = "Ein Mann fährt mit dem Fahrrad über die Straße. "
    long = (german * (300_000 // len(german)))[:300_000]
    first = long[:JUDGED_CHARS]
    assert (
        scores.probability([long], ["de"]).tolist() == scores.probability([first], ["de"]).tolist()
    )
    chunk = [long, *[german] * 63]
    tracemalloc.start()
    try:
        scores.probability(chunk, ["de"] * len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, f"{peak / 2**20:.0f} MiB for one chunk"
