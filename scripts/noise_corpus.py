"""Multi30k's training pairs with web-crawl noise mixed in, each line's kind known, and how well
`attn-mt clean` catches each kind (docs/results.md, "Noisy bitext").

    python scripts/noise_corpus.py --out DIR [--share 0.25] [--seed 1] [--lines N]
        writes DIR/train.de, DIR/train.en (the clean pairs in order, noise lines among them),
        DIR/labels.txt (each line's kind: clean or one of KINDS) and DIR/clean.yaml (a config
        that cleans them with the filters docs/bigger-corpora.md gives for a web corpus)
    python scripts/noise_corpus.py --score DIR/labels.txt CLEANED/dropped.tsv [--markdown]
        per rule of `attn-mt clean`, the share of each kind it dropped (clean: the share of
        clean pairs lost), then one JSON line of the figures
    python scripts/noise_corpus.py --thresholds DIR/labels.txt FWD [BWD] [--markdown]
        per score_min, the share of each kind the `score` rule alone would drop, from
        `attn-mt score --normalize` of the noised corpus (FWD) and of its reverse (BWD: the
        dual cross-entropy), one score a line in corpus order
    python scripts/noise_corpus.py --test-variants DIR
        test_2016_flickr as people type it: DIR/{plain,upper,title,nopunct}.{de,en}, both
        sides changed alike (data.augment's own functions), to score with `attn-mt evaluate`

The noise, about `--share` of the lines, in equal parts: repeats of a pair met before,
wrong-language targets (the French or Czech of the same sentence), swapped sides, the source
copied as target, pairs with one side cut to 30-60% of its words, misaligned pairs (another
line's target), and boilerplate (site chrome with markup, URLs or copyright lines, from
templates with random fills). Run with ATTN_MT_DATA set (or the corpus in the cache).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from attn_mt.data.augment import title_case, without_final_punct
from attn_mt.data.corpora import corpus_file
from attn_mt.data.text import read_lines

KINDS = (
    "repeat",
    "wrong_lang",
    "swapped",
    "copy",
    "truncated",
    "misaligned",
    "boilerplate",
)
WRONG_LANGUAGES = ("fr", "cs")
# Site chrome in both languages: {n} a number, {site} a host name, {year} a year.
BOILERPLATE = (
    ("Startseite | Produkte | Über uns | Kontakt", "Home | Products | About us | Contact"),
    ("© {year} {site}. Alle Rechte vorbehalten.", "© {year} {site}. All rights reserved."),
    (
        "Weitere Informationen unter https://www.{site}/info/{n}",
        "More information at https://www.{site}/info/{n}",
    ),
    (
        '<p>Klicken Sie <a href="/seite/{n}">hier</a>, um fortzufahren.</p>',
        '<p>Click <a href="/page/{n}">here</a> to continue.</p>',
    ),
    ("Fragen? Schreiben Sie an info@{site}", "Questions? Write to info@{site}"),
    ("<b>Teilen:</b> Facebook | Twitter | E-Mail", "<b>Share:</b> Facebook | Twitter | Email"),
    (
        "Diese Website verwendet Cookies: www.{site}/datenschutz",
        "This website uses cookies: www.{site}/privacy",
    ),
    ("Seite {n} von {m} <br/>", "Page {n} of {m} <br/>"),
)
# The filters docs/bigger-corpora.md gives for a web corpus (clean.yaml holds them).
SHIPPED_FILTERS = {
    "ratio": 1.8,
    "markup": True,
    "long_words": 40,
    "digits": True,
    "copy": True,
    "script": True,
    "langid": True,
    "dedup": True,
}
SITES = ("example.com", "shop-24.de", "hotel-berlin.net", "news.example.org", "travel.eu")


def noised(
    de: list[str],
    en: list[str],
    others: list[list[str]],
    share: float,
    seed: int,
    lines: int = 0,
) -> Iterator[tuple[str, str, str]]:
    """(kind, source, target) lines: the clean pairs in order with noise lines among them,
    about `share` of all; a repeat always comes after the pair it repeats. With `lines`, that
    many lines: the corpus again and again, each pass's pairs marked " (N)" on both sides so
    that they differ from the last pass's (a synthetic corpus of any size)."""
    rng = random.Random(seed)
    per_clean = share / (1 - share)  # noise lines per clean line
    written = 0
    for cycle in itertools.count():
        mark = f" ({cycle})" if cycle else ""
        for i, pair in enumerate(zip(de, en, strict=True)):
            count = int(per_clean) + (rng.random() < per_clean - int(per_clean))
            kinds = ["clean"] + [rng.choice(KINDS) for _ in range(count)]
            for kind in kinds:
                src, tgt = pair if kind == "clean" else _noise(kind, i, de, en, others, rng)
                yield kind, src + mark, tgt + mark
                written += 1
                if written == lines:
                    return
        if not lines:
            return


def _noise(
    kind: str, i: int, de: list[str], en: list[str], others: list[list[str]], rng: random.Random
) -> tuple[str, str]:
    """One noise pair of `kind`, drawn around clean line `i`."""
    j = rng.randrange(len(de))
    if kind == "repeat":
        k = rng.randrange(i + 1)  # a pair already written
        return de[k], en[k]
    if kind == "wrong_lang":
        return de[j], rng.choice(others)[j]
    if kind == "swapped":
        return en[j], de[j]
    if kind == "copy":
        return de[j], de[j]
    if kind == "truncated":
        src, tgt = de[j], en[j]
        if rng.random() < 0.5:
            return _cut(src, rng), tgt
        return src, _cut(tgt, rng)
    if kind == "misaligned":
        k = (j + rng.randrange(1, len(de))) % len(de)
        return de[j], en[k]
    src, tgt = rng.choice(BOILERPLATE)
    fill = {
        "n": rng.randrange(1, 500),
        "m": rng.randrange(500, 900),
        "site": rng.choice(SITES),
        "year": rng.randrange(2005, 2025),
    }
    return src.format(**fill), tgt.format(**fill)


def _cut(line: str, rng: random.Random) -> str:
    """`line` cut to 30-60% of its words (at least one)."""
    words = line.split()
    return " ".join(words[: max(1, round(len(words) * rng.uniform(0.3, 0.6)))])


def write(out: Path, share: float, seed: int, lines: int, src_lang: str, tgt_lang: str) -> None:
    """The noised corpus, its labels and a config that cleans it (clean.yaml) in `out`."""
    de, en = (
        read_lines(corpus_file("multi30k", f"train.{lang}.gz")) for lang in (src_lang, tgt_lang)
    )
    others = [read_lines(corpus_file("multi30k", f"train.{lang}.gz")) for lang in WRONG_LANGUAGES]
    out.mkdir(parents=True, exist_ok=True)
    counts: collections.Counter[str] = collections.Counter()
    names = (f"train.{src_lang}", f"train.{tgt_lang}", "labels.txt")
    with contextlib.ExitStack() as stack:
        src, tgt, labels = (
            stack.enter_context(open(out / n, "w", encoding="utf-8")) for n in names
        )
        for kind, s, t in noised(de, en, others, share, seed, lines):
            src.write(s + "\n")
            tgt.write(t + "\n")
            labels.write(kind + "\n")
            counts[kind] += 1
    config = {
        "data": {
            "dataset": "multi30k",
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "train": {"src": names[0], "tgt": names[1]},
            "filters": SHIPPED_FILTERS,
        }
    }
    (out / "clean.yaml").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    print(
        f"{counts.total():,} lines in {out}: " + ", ".join(f"{n:,} {k}" for k, n in counts.items())
    )


def test_variants(out: Path, src_lang: str, tgt_lang: str) -> None:
    """test_2016_flickr as given, in capitals, title-cased and without final punctuation."""
    changes = {
        "plain": lambda line: line,
        "upper": str.upper,
        "title": title_case,
        "nopunct": without_final_punct,
    }
    out.mkdir(parents=True, exist_ok=True)
    for lang in (src_lang, tgt_lang):
        lines = read_lines(corpus_file("multi30k", f"test_2016_flickr.{lang}.gz"))
        for name, change in changes.items():
            text = "".join(change(line) + "\n" for line in lines)
            (out / f"{name}.{lang}").write_text(text, encoding="utf-8")
    print(f"{len(lines):,} lines in each of {', '.join(changes)} in {out}")


def score(labels_path: Path, dropped_path: Path) -> dict[str, dict[str, float]]:
    """Per rule (and `all`), the percent of each kind's lines it dropped: of a noise kind what
    it caught, of `clean` what it lost."""
    labels = labels_path.read_text(encoding="utf-8").splitlines()
    totals = collections.Counter(labels)
    caught: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(dropped_path, encoding="utf-8") as handle:
        for row in handle:
            corpus, line, rule, _ = row.split("\t", 3)
            if corpus != "1":
                sys.exit(
                    f"{dropped_path}: corpus {corpus}: the noised corpus is data.train's only one"
                )
            kind = labels[int(line) - 1]
            caught[rule][kind] += 1
            caught["all"][kind] += 1
    kinds = ["clean", *KINDS]
    rules = [rule for rule in caught if rule != "all"] + ["all"]
    return {
        rule: {kind: 100 * caught[rule][kind] / max(totals[kind], 1) for kind in kinds}
        for rule in rules
    }


SCORE_MINS = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1)


def thresholds(labels_path: Path, *scored: Path) -> dict[str, dict[str, float]]:
    """Per score_min, the percent of each kind's lines whose exp(-H) falls under it; H from the
    mean log-probabilities `attn-mt score --normalize` wrote (the first column), dual with a
    second file (the score rule's own formula)."""
    import numpy as np

    from attn_mt.decode.pairscore import pair_scores

    labels = np.array(labels_path.read_text(encoding="utf-8").splitlines())
    entropies = []
    for path in scored:
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) != len(labels):
            sys.exit(f"{path}: {len(lines):,} scores for {len(labels):,} labels")
        entropies.append(-np.array([float(line.split("\t")[0]) for line in lines]))
    scores = pair_scores(*entropies)
    return {
        f"< {cut:g}": {
            kind: 100 * float((scores[labels == kind] < cut).mean())
            if (labels == kind).any()
            else 0.0
            for kind in ["clean", *KINDS]
        }
        for cut in SCORE_MINS
    }


def table(figures: dict[str, dict[str, float]], markdown: bool, first: str = "rule") -> str:
    """The figures as rows of rules (or thresholds) and columns of kinds."""
    kinds = ["clean", *KINDS]
    if markdown:
        rows = [f"| {first} | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
        rows += [
            f"| {rule} | " + " | ".join(f"{shares[k]:.1f}%" for k in kinds) + " |"
            for rule, shares in figures.items()
        ]
        return "\n".join(rows)
    rows = [f"{first:<12}" + "".join(f"{k:>12}" for k in kinds)]
    rows += [
        f"{rule:<12}" + "".join(f"{shares[k]:>11.1f}%" for k in kinds)
        for rule, shares in figures.items()
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the noised corpus and labels here")
    parser.add_argument("--share", type=float, default=0.25, help="share of noise lines")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lines", type=int, default=0, help="write this many lines (0: one pass of the corpus)"
    )
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument(
        "--score", nargs=2, type=Path, metavar=("LABELS", "DROPPED"), help="score a clean run"
    )
    parser.add_argument(
        "--thresholds",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="LABELS FWD [BWD]: the score rule's catch per score_min",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="--score, --thresholds: a markdown table"
    )
    parser.add_argument(
        "--test-variants", type=Path, metavar="DIR", help="write the test split's variants"
    )
    args = parser.parse_args()
    if args.test_variants:
        test_variants(args.test_variants, args.src_lang, args.tgt_lang)
    elif args.thresholds:
        if len(args.thresholds) not in (2, 3):
            parser.error("--thresholds: give LABELS FWD [BWD]")
        figures = thresholds(*args.thresholds)
        print(table(figures, args.markdown, first="score"))
    elif args.score:
        figures = score(*args.score)
        print(table(figures, args.markdown))
        print(json.dumps(figures))
    elif args.out:
        if not 0 < args.share < 1:
            parser.error("--share: give a share between 0 and 1")
        write(args.out, args.share, args.seed, args.lines, args.src_lang, args.tgt_lang)
    else:
        parser.error("give --out DIR, --score LABELS DROPPED or --test-variants DIR")


if __name__ == "__main__":
    main()
