"""`attn-mt distill`: the teacher's translations of the student config's training sources in
`OUT_DIR/distilled/`, the student trained on them; a distill interrupted mid-translation and
started again continues and ends with the files of an uncut one; the options shape the corpus;
mistakes refused in one line before any translation.

The teacher is the hostile cases' tiny run (`world`): its translations are poor, which does not
matter here. The students train on the first 60 pairs of its corpus and a blank pair.
Everything runs in this process (`run_cli`, stdin closed: a forked `prepare` worker closes
stdin, which a stand-in could not).
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from helpers.clirun import assert_user_error
from helpers.workspace import World, run_cli, tiny_config

from attn_mt.decode.translator import Translator
from attn_mt.jobs import io

LINES = 61  # the students' training pairs


@pytest.fixture(scope="module")
def folder(world: World) -> Iterator[Path]:
    """The students' folder: their training corpus (train.src, train.tgt), configs and runs."""
    made = Path(tempfile.mkdtemp(dir=world.root, prefix="distill."))
    for side in ("src", "tgt"):
        pairs = world.corpus[f"train.{side}"].read_text().splitlines()[: LINES - 1]
        (made / f"train.{side}").write_text("\n".join([*pairs[:30], "", *pairs[30:]]) + "\n")
    yield made
    shutil.rmtree(made, ignore_errors=True)


def student(world: World, folder: Path, name: str) -> Path:
    """A student config of the folder's corpus training 3 updates into `folder/name`."""
    corpus = world.corpus | {f"train.{side}": folder / f"train.{side}" for side in ("src", "tgt")}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(corpus, folder / name)))
    return path


def distill(world: World, config: Path, *extra: Any) -> subprocess.CompletedProcess[bytes]:
    """`attn-mt distill` of the world's run as the teacher, in this process, reading its input
    in chunks of 10 lines (so that an interruption can fall between chunks)."""
    args = ["distill", "--teacher", world.run, "--config", config, "--device", "cpu", *extra]
    chunks = functools.partial(io.line_chunks, max_lines=10)
    with mock.patch.object(io, "line_chunks", chunks):
        return run_cli(args, None, world.env())


def lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as text:
        return text.read().splitlines()


@pytest.fixture(scope="module")
def uncut(world: World, folder: Path) -> Path:
    """The run folder of a distill that ran through."""
    result = distill(world, student(world, folder, "uncut"))
    assert result.returncode == 0, result.stderr.decode()
    return folder / "uncut"


def test_the_student_trains_on_the_teachers_translations(world: World, uncut: Path) -> None:
    """One distilled pair per source line: the source as it is, the target what `translate`
    writes for it; the student's run trains on them, validates on the config's valid split."""
    sources = (uncut.parent / "train.src").read_text().splitlines()
    assert lines(uncut / "distilled" / "train.xx.gz") == sources
    translated = run_cli(
        ["translate", "-m", world.run, "-i", uncut.parent / "train.src", "--device", "cpu"],
        None,
        world.env(),
    )
    assert translated.returncode == 0, translated.stderr.decode()
    assert lines(uncut / "distilled" / "train.yy.gz") == translated.stdout.decode().splitlines()
    assert len(sources) == LINES
    config = yaml.safe_load((uncut / "config.yaml").read_text())
    assert config["data"]["train"]["src"] == str(uncut / "distilled" / "train.xx.gz")
    assert config["data"]["valid"]["src"] == str(world.corpus["valid.src"])
    metrics = (uncut / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["step"] == 3 and (uncut / "checkpoints" / "last.pt").is_file()


def test_an_interrupted_distill_continues_to_the_same_files(
    world: World, folder: Path, uncut: Path
) -> None:
    """Ctrl-C after the first chunk: the lines done are kept; the same command translates only
    the others, and the corpus is byte for byte the uncut run's."""
    config = student(world, folder, "cut")
    translate = Translator.translate_nbest
    done: list[int] = []

    def interrupted(self: Translator, sources: list[str], request: Any) -> Any:
        if done:
            raise KeyboardInterrupt
        done.append(len(sources))
        return translate(self, sources, request)

    with mock.patch.object(Translator, "translate_nbest", interrupted):
        result = distill(world, config)
    assert result.returncode == 130, result.stderr.decode()
    assert "the same command continues" in result.stderr.decode()
    assert "--resume" not in result.stderr.decode()  # distill has none: the command continues
    partial = folder / "cut" / "distilled" / "corpus1.nbest.partial.json"
    assert 0 < json.loads(partial.read_text())["done"]["lines"] == done[0] < LINES
    assert not (folder / "cut" / "checkpoints").exists()

    corpus = set((folder / "train.src").read_text().splitlines())
    again: list[str] = []  # the training sources translated (validation's are not among them)

    def counted(self: Translator, sources: list[str], request: Any) -> Any:
        again.extend(source for source in sources if source in corpus)
        return translate(self, sources, request)

    with mock.patch.object(Translator, "translate_nbest", counted):
        result = distill(world, config)
    assert result.returncode == 0, result.stderr.decode()
    assert "continues translating corpus 1/1" in result.stderr.decode()
    assert len(again) == LINES - done[0]
    for name in ("train.xx.gz", "train.yy.gz", "corpus1.nbest"):
        cut, whole = folder / "cut" / "distilled" / name, uncut / "distilled" / name
        assert cut.read_bytes() == whole.read_bytes(), name


def test_options_shape_the_corpus(world: World, folder: Path) -> None:
    """--nbest-chrf 2 takes the closer to the reference of the teacher's two entries,
    --drop-worst 0.1 leaves out the 6 lowest-scored, --keep-original 0.5 adds back 30 original
    pairs (round(30.5), to even)."""
    from sacrebleu.metrics import CHRF

    options = ["--nbest-chrf", "2", "--drop-worst", "0.1", "--keep-original", "0.5"]
    vocabulary = ["--set", "tokenizer.vocab_size=400"]  # the teacher's odd characters and bytes
    result = distill(world, student(world, folder, "options"), *options, *vocabulary)
    assert result.returncode == 0, result.stderr.decode()
    assert "55 teacher pairs of 61 lines (6 worst-scored dropped) + 30 original" in (
        result.stderr.decode()
    )
    out = folder / "options" / "distilled"
    pairs = list(zip(lines(out / "train.xx.gz"), lines(out / "train.yy.gz"), strict=True))
    assert len(pairs) == 55 + 30
    nbest: dict[int, list[tuple[str, float]]] = {}
    for entry in (out / "corpus1.nbest").read_text().splitlines():
        index, text, score = entry.split(" ||| ")
        nbest.setdefault(int(index), []).append((text, float(score)))
    assert all(len(entries) == 2 for entries in nbest.values()) and len(nbest) == LINES
    sources = (folder / "train.src").read_text().splitlines()
    references = (folder / "train.tgt").read_text().splitlines()
    chrf = CHRF()
    picked = []
    for index, (source, reference) in enumerate(zip(sources, references, strict=True)):
        scores = [chrf.sentence_score(text, [reference]).score for text, _ in nbest[index]]
        best = nbest[index][1 if scores[1] > scores[0] else 0]
        picked.append((best[1], index, source, best[0]))
    kept = sorted(sorted(picked)[6:], key=lambda entry: entry[1])  # the 6 worst left out
    originals = set(zip(sources, references, strict=True))
    expected = iter([(source, text) for _, _, source, text in kept])
    want, added = next(expected), 0
    for pair in pairs:  # the teacher's pairs in order, original pairs among them
        if pair == want:
            want = next(expected, None)
        else:
            assert pair in originals, pair
            added += 1
    assert want is None and added == 30


@pytest.mark.parametrize(
    ("case", "extra", "fragments"),
    [
        ("missing", ["--teacher", "nowhere"], ["--teacher nowhere", "not found"]),
        ("pair", ["--set", "data.src_lang=de"], ["translates xx -> yy", "de-yy"]),
        ("share", ["--keep-original", "1.5"], ["--keep-original 1.5", "from 0 to 1"]),
        ("nbest", ["--nbest-chrf", "1"], ["--nbest-chrf 1", "2 or more"]),
    ],
)
def test_mistakes_are_refused_before_translating(
    world: World, folder: Path, case: str, extra: list[str], fragments: list[str]
) -> None:
    """One line, exit 2, and nothing written in the student's run folder."""
    config = student(world, folder, f"refused-{case}")
    if case == "missing":
        args = ["distill", *extra, "--config", config, "--device", "cpu"]
        result = run_cli(args, None, world.env())
    else:
        result = distill(world, config, *extra)
    assert_user_error(result, *fragments)
    assert not (folder / f"refused-{case}").exists()


def test_a_rerun_with_other_settings_is_refused(world: World, uncut: Path) -> None:
    """The distilled folder was made with beam 2: a rerun with --beam 1 would mix two searches."""
    config = uncut.parent / "uncut.yaml"
    before = (uncut / "distilled" / "train.yy.gz").read_bytes()
    assert_user_error(distill(world, config, "--beam", "1"), "decode.beam 2, this run 1")
    assert (uncut / "distilled" / "train.yy.gz").read_bytes() == before
