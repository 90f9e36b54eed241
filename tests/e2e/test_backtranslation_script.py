"""scripts/backtranslation.sh runs from start to end: its data split, its three configs, and the
order of its commands, with a stand-in for `attn-mt` (training for real takes an hour)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

from attn_mt.config.file import load_config

SCRIPT = REPO / "scripts" / "backtranslation.sh"
HALF = 14500  # the script's split point

# Stands in for `attn-mt`: checks each config with the real loader and that the files it names
# exist, "translates" by tagging each input line, and logs every call.
STUB = """\
import sys
from pathlib import Path
from attn_mt.config.file import load_config
args = sys.argv[1:]
with open("calls.txt", "a") as log:
    log.write(" ".join(args) + "\\n")
if args[0] == "train":
    config = load_config(args[args.index("--config") + 1])
    for corpus in config.data.train:
        assert Path(corpus.src).is_file() and Path(corpus.tgt).is_file(), corpus
    Path(config.train.out_dir).mkdir()
elif args[0] == "translate":
    assert Path(args[args.index("--model") + 1]).is_dir(), "translating with an untrained model"
    for line in sys.stdin:
        sys.stdout.write("synthetic " + line)
elif args[0] == "evaluate":
    print("BLEU 1.0")
"""


def _write_gz(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def test_backtranslation_script_runs_to_the_end(tmp_path: Path):
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    corpus = {lang: [f"{lang} train {i}" for i in range(2 * HALF)] for lang in ("de", "en")}
    for lang, lines in corpus.items():
        _write_gz(data / f"train.{lang}.gz", lines)
        for split in ("val", "test_2016_flickr"):
            _write_gz(data / f"{split}.{lang}.gz", [f"{lang} {split} {i}" for i in range(5)])
    stub = tmp_path / "attn-mt-stub"
    stub.write_text(f"#!/usr/bin/env bash\nexec {sys.executable} -c '{STUB}' \"$@\"\n")
    stub.chmod(0o755)
    work = tmp_path / "work"
    env = dict(os.environ, ATTN_MT_DATA=str(tmp_path / "data"), ATTN_MT=str(stub))

    result = subprocess.run(
        ["bash", str(SCRIPT), str(work), "40"], env=env, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr
    read = lambda name: (work / "data" / name).read_text().splitlines()  # noqa: E731
    assert read("real.de") == corpus["de"][:HALF]
    assert read("real.en") == corpus["en"][:HALF]
    assert read("mono.en") == corpus["en"][HALF:]
    assert read("bt.de") == ["synthetic " + line for line in corpus["en"][HALF:]]
    calls = [line.split()[:3] for line in (work / "calls.txt").read_text().splitlines()]
    assert calls == [
        ["train", "--config", "en_de.yaml"],
        ["translate", "--model", "en_de"],
        ["train", "--config", "de_en.yaml"],
        ["train", "--config", "de_en_bt.yaml"],
        ["evaluate", "--model", "de_en"],
        ["evaluate", "--model", "de_en_bt"],
    ]
    bt = load_config(work / "de_en_bt.yaml")
    assert [c.tag for c in bt.data.train] == [None, "<bt>"]
    assert (bt.train.max_steps, bt.data.src_lang, bt.data.tgt_lang) == (40, "de", "en")
    assert "de_en: BLEU 1.0" in result.stdout and "de_en_bt: BLEU 1.0" in result.stdout
