"""`evaluate_split`: a split or a pair of files -> translate -> score (`attn_mt.scores`) ->
hypotheses file; the checks and files every evaluation shares (`test_set`; the variants of
`attn_mt.evaluate_variants` too)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.errors import UserError
from attn_mt.scores import DEFAULT_METRICS, Scores, check_metrics, score

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translator

SPLITS = ("valid", "test")
# Given the number of sentences, a context that yields the callback of each finished batch.
Progress = Callable[[int], AbstractContextManager[Callable[[int], None]]]


@dataclass
class Evaluation:
    """What `evaluate_split` measured and where it wrote the hypotheses."""

    scores: Scores
    hypotheses: Path
    beam: int
    off_target: float | None = None  # percent of outputs not in the language asked for

    def to_dict(self) -> dict:
        """The scores, the hypotheses file and the beam (and a multilingual model's off-target
        rate): `evaluate --json`."""
        found = {**self.scores.to_dict(), "hypotheses": str(self.hypotheses), "beam": self.beam}
        return found | ({"off_target": self.off_target} if self.off_target is not None else {})


@dataclass(frozen=True)
class TestChoice:
    """What an evaluation reads and how it scores it: a `split` of the translator's corpus
    (default test) or the files `src` and `ref`; a multilingual model's direction (`pair`
    "de-en", the direction of a split, or the `tgt_lang` translated into); the `metrics`
    (`attn_mt.scores.METRICS`; COMET reads its model from `comet_model`); and whether a line
    is split into its sentences as `translate` splits it (`split_sentences`)."""

    split: str | None = None
    src: str | Path | None = None
    ref: str | Path | None = None
    pair: str | None = None
    tgt_lang: str | None = None
    metrics: Sequence[str] = DEFAULT_METRICS
    comet_model: Path | None = None
    split_sentences: bool = True

    @classmethod
    def of(cls, choice: TestChoice | None, fields: dict[str, Any]) -> TestChoice:
        """`choice`, or one made of `fields` (its fields by keyword); not both."""
        if choice is not None and not isinstance(choice, TestChoice):
            raise TypeError(
                f"evaluate: give a TestChoice or its fields (split=...), not {choice!r}"
            )
        if choice is not None and fields:
            raise TypeError("evaluate: give a TestChoice or its fields as keywords, not both")
        return choice if choice is not None else cls(**fields)


def check_evaluation_files(
    split: str | None,
    src: Path | None,
    ref: Path | None,
    pair: str | None = None,
    tgt_lang: str | None = None,
) -> None:
    """Refuse a split together with files, one file without the other, an unknown split, a
    --pair with files or not written SRC-TGT, or a --tgt-lang that contradicts --pair."""
    if pair is not None:
        src_lang, _, pair_tgt = pair.partition("-")
        if not src_lang or not pair_tgt or src_lang == pair_tgt:
            raise UserError(f"--pair {pair}: write it SRC-TGT with two languages, e.g. de-en")
        if src is not None:
            raise UserError(
                "--pair picks a direction of the run's corpus; with --src/--ref "
                "give --tgt-lang instead"
            )
        if tgt_lang is not None and tgt_lang != pair_tgt:
            raise UserError(f"--tgt-lang {tgt_lang} contradicts --pair {pair}; give one of them")
    if (src is None) != (ref is None):
        raise UserError("evaluate: give both --src and --ref, or neither (then --split is used)")
    if src is not None and split is not None:
        raise UserError("evaluate: give either --split or --src/--ref, not both")
    if split is not None and split not in SPLITS:
        raise UserError(f"--split {split}: unknown; use {' or '.join(SPLITS)}")


def evaluate_split(
    translator: Translator,
    choice: TestChoice | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
    **fields: Any,
) -> Evaluation:
    """Translate the test set `choice` names (or its fields by keyword: `split="valid"`,
    `src=`, `ref=`, `metrics=`, ...), score the hypotheses and write them to `out`, atomically.

    A multilingual model's evaluation also measures the off-target rate. `out` defaults to a
    file beside the (first) checkpoint named after the split (or source file), the direction
    and the beam, e.g. `best.test.beam5.hyp.txt`. `progress` shows a bar.
    """
    from attn_mt.fileio import write_output
    from attn_mt.paths import check_output_file

    test = test_set(translator, TestChoice.of(choice, fields))
    data, tgt_lang, beam = translator.config.data, test.tgt_lang, test.beam
    named = f"{test.name}.beam{beam}.hyp.txt"
    out = Path(out) if out is not None else beside_checkpoint(translator, named)
    check_output_file(out, inputs=test.inputs(translator))
    sources, references = test.lines()
    hypotheses = translated(translator, sources, test, progress)
    write_output(out, "".join(h + "\n" for h in hypotheses))  # kept, whatever scoring does
    scores = test.score(hypotheses, references, sources)
    off_target = None
    if len(data.directions()) > 1 and tgt_lang is not None:
        from attn_mt.langid import off_target_rate

        languages = [lang for direction in data.directions() for lang in direction]
        off_target = off_target_rate(hypotheses, tgt_lang, languages)
    return Evaluation(scores, out, beam, off_target)


@dataclass
class TestSet:
    """The files an evaluation reads, checked: `src` and `ref`, the `name` outputs beside the
    checkpoint take, the language translated into and the beam; the `choice` they come of."""

    src: Path
    ref: Path
    name: str
    tgt_lang: str | None
    beam: int
    choice: TestChoice

    def inputs(self, translator: Translator) -> list[tuple[str, Path | None]]:
        """The command's inputs, which no output may be."""
        models: list[tuple[str, Path | None]] = [("--model", p) for p in translator.checkpoints]
        return [*models, ("--src", self.src), ("--ref", self.ref)]

    def lines(self) -> tuple[list[str], list[str]]:
        """The sources and references, line for line; no lines is a UserError."""
        from attn_mt.data.text import read_parallel

        sources, references = read_parallel(self.src, self.ref)
        if not sources:
            raise UserError(f"{self.src}: no lines; there is nothing to evaluate")
        return sources, references

    def score(self, hypotheses: list[str], references: list[str], sources: list[str]) -> Scores:
        """The choice's metrics of `hypotheses` against `references`."""
        return score(hypotheses, references, self.choice.metrics, sources, self.choice.comet_model)


def test_set(translator: Translator, choice: TestChoice) -> TestSet:
    """Every check an evaluation makes before it translates (the options, the metrics, the
    files, the target language), and the files it reads."""
    src, ref, pair = choice.src, choice.ref, choice.pair
    src, ref = (None if src is None else Path(src)), (None if ref is None else Path(ref))
    check_evaluation_files(choice.split, src, ref, pair, choice.tgt_lang)
    check_metrics(choice.metrics, choice.comet_model)
    tgt_lang = choice.tgt_lang or (pair.partition("-")[2] if pair else None)
    src_path, ref_path, name = _files(translator, choice.split, src, ref, pair)
    translator.language_prefix(tgt_lang)  # checked before any translation
    beam = translator.config.decode.beam
    return TestSet(src_path, ref_path, name, tgt_lang, beam, choice)


def _files(
    translator: Translator,
    split: str | None,
    src: Path | None,
    ref: Path | None,
    pair: str | None,
) -> tuple[Path, Path, str]:
    """The source and reference files evaluated (`src`/`ref`, else the files of `split` of
    the run's corpus, test by default) and the name the outputs beside the checkpoint take."""
    from attn_mt.data.corpora import split_files

    data = translator.config.data
    if pair is None and src is None and len(data.directions()) > 1:
        raise UserError(
            "evaluate: this multilingual model needs --pair SRC-TGT with --split (its "
            f"directions: {', '.join('-'.join(d) for d in data.directions())}), or --src/--ref "
            "with --tgt-lang"
        )
    if src is None or ref is None:
        split = split or "test"
        files = split_files(data, split, pair)
        if files is None:
            raise UserError(
                f"--split {split}: the run's config has no data.{split} files; use --src and --ref"
            )
        src, ref = files
    name = (split or src.name) + (f".{pair}" if pair else "")
    return Path(src), Path(ref), name


def beside_checkpoint(translator: Translator, name: str) -> Path:
    """An output beside the (first) checkpoint: `best.` + `name`."""
    if not translator.checkpoints:
        raise UserError("evaluate: the translator has no checkpoint path; give out=FILE")
    checkpoint = translator.checkpoints[0]
    return checkpoint.with_name(f"{checkpoint.stem}.{name}")


def translated(
    translator: Translator, sources: list[str], test: TestSet, progress: Progress | None
) -> list[str]:
    """`sources` of `test` translated as `translate` translates them (each line's sentences one
    by one unless its choice's `split_sentences` is False; a test set of a sentence a line is
    translated alike either way), a bar shown where `progress` is given; torch's threads sized
    to the free cores before each batch, as `translate` sizes them (`cpuenv.ThreadSizer`)."""
    from attn_mt.cpuenv import sized_torch_threads
    from attn_mt.documents.paragraphs import ParagraphTranslator

    pair, tgt_lang = test.choice.pair, test.tgt_lang
    src_lang = pair.partition("-")[0] if pair else None
    splitting = test.choice.split_sentences
    translator = ParagraphTranslator.splitting(translator, src_lang, splitting)
    with sized_torch_threads() as sizer, (progress or _no_bar)(len(sources)) as bar:

        def on_batch(lines: int) -> None:
            bar(lines)
            sizer.adjust()  # before the next batch

        sizer.adjust()
        return translator.translate(sources, on_batch=on_batch, tgt_lang=tgt_lang)


@contextmanager
def _no_bar(total: int) -> Iterator[Callable[[int], None]]:
    """No progress shown: `progress`'s form, doing nothing."""
    yield lambda lines: None
