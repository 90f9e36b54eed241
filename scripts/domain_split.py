"""Two domains of Multi30k for a fine-tuning experiment: captions of people, and captions of
animals, objects and scenes, each with its own training, validation and test files.

The rule reads the English side of each pair (every Multi30k pair has one): a caption is
**people** when one of its words (lower-cased runs of letters) is in PEOPLE below, else
**scenes** (animals, objects, places: its words name no person). Multi30k's splits stay apart:
- train: the domain's pairs of Multi30k's `train`;
- valid: the domain's pairs of `val` (validation during training: data.valid, or
  data.valid_general for the other domain);
- test: the domain's pairs of `test_2016_flickr`, and where they are fewer than --test-size,
  training pairs of the domain drawn with a fixed seed to make up that many (and left out of
  its train): a paired test (`attn-mt compare`) wants some hundreds of sentences.
On Multi30k de-en, with the defaults: people 26,320 train, 919 valid, 896 test; scenes 2,284
train, 95 valid, 500 test (104 from test_2016_flickr, 396 held out of train).

    python scripts/domain_split.py                        # data/domains/{people,scenes}/
    python scripts/domain_split.py --src fr --out /tmp/domains

Writes OUT/DOMAIN/{train,valid,test}.{SRC,TGT} and OUT/split.json (the rule, the word list,
the seed and every count); the last line printed is that JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from attn_mt.data.corpora import corpus_file
from attn_mt.data.text import read_lines

ROOT = Path(__file__).resolve().parents[1]
# Words that name a person (or people) in Multi30k's English captions, plurals included.
PEOPLE_WORDS = """man men woman women boy boys girl girls child children kid kids baby babies
    toddler toddlers people person persons guy guys lady ladies gentleman gentlemen adult adults
    teenager teenagers teen teens youngster youngsters youth player players worker workers
    crowd family couple bride groom mother father mom dad son daughter brother sister he she
    his her him they them someone somebody individual individuals brunette blond blonde
    redhead biker bikers cyclist cyclists rider riders skier skiers snowboarder snowboarders
    surfer surfers skateboarder skateboarders dancer dancers musician musicians singer singers
    band drummer guitarist officer officers policeman police soldier soldiers student students
    athlete athletes climber climbers swimmer swimmers runner runners driver drivers tourist
    tourists vendor vendors chef chefs cook cooks cowboy cowboys audience spectators fans team
    teams friends artist artists performer performers male female males females gymnast
    wrestler wrestlers boxer boxers fighter fighters jockey goalie pitcher batter firefighter
    firefighters doctor nurse priest monk nun clown fisherman farmer shopper shoppers
    pedestrian pedestrians racer racers competitor competitors photographer photographers dj
    hiker hikers skater skaters motorcyclist bicyclist kayaker boater member members group
    crew customer customers employee employees staff"""
PEOPLE = frozenset(PEOPLE_WORDS.split())
DOMAINS = ("people", "scenes")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # ours -> Multi30k's
WORD = re.compile(r"[a-z]+")


def domain(english: str) -> str:
    """`people` when a word of the English caption names a person, else `scenes`."""
    return "people" if PEOPLE.intersection(WORD.findall(english.lower())) else "scenes"


def pairs_of(split: str, src: str, tgt: str) -> dict[str, list[tuple[str, str]]]:
    """Multi30k's `split` as (source, target) pairs, by domain (read from the English side)."""
    sides = {lang: read_lines(corpus_file("multi30k", f"{split}.{lang}.gz")) for lang in {src, tgt}}
    english = read_lines(corpus_file("multi30k", f"{split}.en.gz"))
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in DOMAINS}
    for i, caption in enumerate(english):
        found[domain(caption)].append((sides[src][i], sides[tgt][i]))
    return found


def split_domains(src: str, tgt: str, test_size: int, seed: int) -> dict[str, dict]:
    """Each domain's train, valid and test pairs (the module docstring's rule)."""
    read = {ours: pairs_of(theirs, src, tgt) for ours, theirs in SPLITS.items()}
    out: dict[str, dict] = {}
    for name in DOMAINS:
        train, test = list(read["train"][name]), list(read["test"][name])
        missing = max(test_size - len(test), 0)
        held = set(random.Random(seed).sample(range(len(train)), min(missing, len(train))))
        test += [pair for i, pair in enumerate(train) if i in held]
        train = [pair for i, pair in enumerate(train) if i not in held]
        out[name] = {"train": train, "valid": read["valid"][name], "test": test}
        out[name]["held_out_of_train"] = len(held)
    return out


def write(out: Path, src: str, tgt: str, domains: dict[str, dict]) -> None:
    """OUT/DOMAIN/SPLIT.LANG, one sentence a line."""
    for name, splits in domains.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            for side, lang in enumerate((src, tgt)):
                lines = "".join(pair[side] + "\n" for pair in splits[split])
                (folder / f"{split}.{lang}").write_text(lines, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Parse the options, split, write the files and split.json, print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default="de", help="source language (de, fr, cs; default de)")
    parser.add_argument("--tgt", default="en", help="target language (default en)")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "domains")
    parser.add_argument("--test-size", type=int, default=500, help="least test pairs a domain")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    domains = split_domains(args.src, args.tgt, args.test_size, args.seed)
    write(args.out, args.src, args.tgt, domains)
    counts = {
        name: {key: len(v) if isinstance(v, list) else v for key, v in splits.items()}
        for name, splits in domains.items()
    }
    record = {
        "pair": f"{args.src}-{args.tgt}",
        "rule": "people: an English word in PEOPLE; scenes: none (animals, objects, places)",
        "people_words": sorted(PEOPLE),
        "seed": args.seed,
        "test_size": args.test_size,
        "counts": counts,
    }
    (args.out / "split.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for name, count in counts.items():
        print(f"{name}: " + ", ".join(f"{key} {n:,}" for key, n in count.items()))
    print(json.dumps({"out": str(args.out), "pair": record["pair"], "counts": counts}))


if __name__ == "__main__":
    main()
