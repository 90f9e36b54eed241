"""Sequence-level knowledge distillation (Kim & Rush 2016): a student trained on its teacher's
translations of the training sources. This module holds what is not translating or training:
the options and their bounds, the student's corpora and the teacher's direction checked, the
files of `OUT_DIR/distilled/`, and the distilled corpus assembled from the teacher's n-best
(the entry closest to the reference by chrF, the worst-scored pairs dropped, a share of the
original pairs added back). `distill/run.py` translates and trains around it. No torch here.

The teacher's n-best of corpus K is `distilled/corpusK.nbest` in Marian's format
(`LINE ||| TEXT ||| SCORE`, LINE counted from 0 in that corpus: `jobs/nbest.py`), the score
the search's: the log-probability divided by the length penalty.
"""

from __future__ import annotations

import contextlib
import gzip
import random
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from attn_mt.config.data import DataConfig, TrainCorpus
from attn_mt.data.corpora import pair_name, train_corpora
from attn_mt.data.text import iter_lines, iter_parallel
from attn_mt.errors import DataError, UserError, named
from attn_mt.fileio import atomic_write
from attn_mt.jobs.nbest import read_nbest


@dataclass(frozen=True)
class DistillOptions:
    """How the teacher's translations become the student's corpus (see docs/training.md,
    "Distillation"; none of the defaults is measured yet)."""

    beam: int | None = None  # None: the teacher's own decode.beam
    keep_original: float = 0.0  # the share of original pairs added back
    drop_worst: float = 0.0  # the share of pairs dropped, those the teacher scored worst
    nbest_chrf: int = 0  # pick the best by chrF against the reference of this n-best (0 = off)
    seed: int = 1  # which original pairs are added back

    def check(self) -> None:
        """Each option within its bounds, or one line saying which and what to give."""
        if not 0 <= self.keep_original <= 1:
            raise UserError(
                f"--keep-original {self.keep_original:g}: a share of the original pairs, "
                "from 0 to 1"
            )
        if not 0 <= self.drop_worst < 1:
            raise UserError(
                f"--drop-worst {self.drop_worst:g}: a share of the pairs, from 0 to below 1"
            )
        if self.nbest_chrf == 1 or self.nbest_chrf < 0:
            raise UserError(
                f"--nbest-chrf {self.nbest_chrf}: the n-best to choose from by chrF, 2 or "
                "more (0 = off: the teacher's best)"
            )

    @property
    def nbest(self) -> int:
        """How many translations the teacher writes per line."""
        return max(1, self.nbest_chrf)

    def record(self) -> dict[str, Any]:
        """The options as the distilled folder's record keeps them."""
        return asdict(self)


def student_pair(data: DataConfig) -> str:
    """The one direction a student config trains ("de-en"); a multilingual one is refused."""
    directions = data.directions()
    if len(directions) != 1:
        raise UserError(
            f"distill: the student config trains {data.in_words()}; distil one direction "
            "per student config"
        )
    return pair_name(*directions[0])


def check_teacher(teacher: DataConfig, pair: str, name: str) -> str | None:
    """A teacher that does not translate the student's direction `pair` is refused; the
    target language a multilingual teacher is asked for (None for a teacher of one)."""
    pairs = [pair_name(*direction) for direction in teacher.directions()]
    if pair not in pairs:
        raise UserError(
            f"--teacher {named(name)}: translates {teacher.in_words()}, the student config "
            f"{pair}; give a teacher of {pair}"
        )
    return pair.split("-", 1)[1] if teacher.language_tags() else None


def student_corpora(data: DataConfig) -> list[TrainCorpus]:
    """The student's training corpora, whose sources the teacher translates; each file, and
    that a corpus's two files hold as many lines, checked here, before any translation."""
    corpora = train_corpora(data)
    for corpus in corpora:
        for side in (corpus.src, corpus.tgt):
            path = Path(str(side))
            if not path.is_file():
                raise DataError(f"data.train: {named(path)}: file not found")
    for corpus in corpora:  # read through: a pair a line, before the teacher translates any
        try:
            deque(iter_parallel(str(corpus.src), str(corpus.tgt)), maxlen=0)
        except DataError as err:
            raise DataError(f"data.train: {err}") from None
    return corpora


@dataclass(frozen=True)
class DistilledFolder:
    """`OUT_DIR/distilled/`: the teacher's n-best per corpus, the record of how they were made
    (`distill.json`) and the student's corpus, `train.SRC.gz` and `train.TGT.gz`."""

    root: Path
    src_lang: str
    tgt_lang: str

    @classmethod
    def of_run(cls, out_dir: str | Path, pair: str) -> DistilledFolder:
        """The distilled folder of the run folder `out_dir`, for direction `pair`."""
        src_lang, tgt_lang = pair.split("-", 1)
        return cls(Path(out_dir).absolute() / "distilled", src_lang, tgt_lang)

    def translation(self, index: int) -> Path:
        """The teacher's n-best of the `index`-th (from 0) training corpus."""
        return self.root / f"corpus{index + 1}.nbest"

    @property
    def record(self) -> Path:
        return self.root / "distill.json"

    @property
    def corpus(self) -> tuple[Path, Path]:
        """The student's training files (source, target)."""
        return (
            self.root / f"train.{self.src_lang}.gz",
            self.root / f"train.{self.tgt_lang}.gz",
        )

    def assembled(self) -> bool:
        """Whether the student's corpus is already written (each file appears whole)."""
        return all(path.is_file() for path in self.corpus)


@dataclass(frozen=True)
class Assembled:
    """What went into the student's corpus."""

    lines: int  # the source lines translated
    distilled: int  # pairs of a source and its teacher translation
    dropped: int  # of those left out by --drop-worst
    original: int  # original pairs added back by --keep-original

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"distilled corpus: {self.distilled:,} teacher pairs of {self.lines:,} lines "
            f"({self.dropped:,} worst-scored dropped) + {self.original:,} original pairs"
        )


def assemble(
    corpora: list[TrainCorpus], folder: DistilledFolder, options: DistillOptions
) -> Assembled:
    """Write the student's corpus from the teacher's n-best of each corpus: one pick per line
    (the first entry, or the best by chrF against the reference), the `drop_worst` share with
    the lowest scores left out, a seeded `keep_original` share of original pairs added back,
    each after its distilled pair. Deterministic: the same n-best give the same bytes."""
    picks, scores = _pick(corpora, folder, options)
    lines = len(picks)
    worst = int(options.drop_worst * lines)
    dropped = set(sorted(range(lines), key=lambda i: (scores[i], i))[:worst]) if worst else set()
    originals = round(options.keep_original * lines)
    kept = set(random.Random(options.seed).sample(range(lines), originals))
    line = 0
    with contextlib.ExitStack() as stack:
        src_out, tgt_out = (stack.enter_context(_gzip_text(path)) for path in folder.corpus)
        for index, corpus in enumerate(corpora):
            for source, reference, entries in _aligned(corpus, folder, index, options.nbest):
                if line not in dropped:
                    src_out.write(source + "\n")
                    tgt_out.write(entries[picks[line]][0] + "\n")
                if line in kept:
                    src_out.write(source + "\n")
                    tgt_out.write(reference + "\n")
                line += 1
    return Assembled(lines, lines - len(dropped), len(dropped), len(kept))


def _pick(
    corpora: list[TrainCorpus], folder: DistilledFolder, options: DistillOptions
) -> tuple[array, array]:
    """Per line of all corpora: which entry of its n-best is taken, and that entry's score."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    picks, scores = array("H"), array("d")
    for index, corpus in enumerate(corpora):
        for _, reference, entries in _aligned(corpus, folder, index, options.nbest):
            pick = 0
            if options.nbest_chrf and len(entries) > 1:
                similar = [chrf.sentence_score(text, [reference]).score for text, _ in entries]
                pick = max(range(len(entries)), key=lambda i: (similar[i], -i))
            picks.append(pick)
            scores.append(entries[pick][1])
    return picks, scores


def _aligned(
    corpus: TrainCorpus, folder: DistilledFolder, index: int, nbest: int
) -> Iterator[tuple[str, str, list[tuple[str, float]]]]:
    """The `index`-th corpus's (source, reference, teacher's entries), line by line."""
    translations = folder.translation(index)
    sources, references = iter_lines(str(corpus.src)), iter_lines(str(corpus.tgt))
    try:
        yield from zip(sources, references, read_nbest(translations, nbest), strict=True)
    except ValueError:  # zip's: one ran out first
        raise DataError(
            f"{named(str(corpus.src))}, {named(str(corpus.tgt))} and the teacher's "
            f"{named(translations)} differ in lines; delete {named(translations)} and run "
            "distill again"
        ) from None


@contextlib.contextmanager
def _gzip_text(path: Path) -> Iterator[IO[str]]:
    """A text file written gzip-compressed, whole or not at all, the same bytes for the same
    text (no time stamp or name in the header)."""
    import io

    with (
        atomic_write(path) as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
        io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as text,
    ):
        yield text
