"""`evaluate_split`: a split or a pair of files -> translate -> score (`attn_mt.scores`) ->
hypotheses file; `evaluate_variants`: the same test set as people type it (capitals, Title
Case, no final punctuation, typos, spans), a row of scores per variant."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.data.augment import title_case, with_typos, without_final_punct
from attn_mt.errors import UserError
from attn_mt.scores import DEFAULT_METRICS, METRICS, Scores, check_metrics, score
from attn_mt.text.normalize import final_punct

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
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
    pair: str | None = None,
    tgt_lang: str | None = None,
    metrics: Sequence[str] = DEFAULT_METRICS,
    comet_model: Path | None = None,
    split_sentences: bool = True,
) -> Evaluation:
    """Translate a split of the translator's corpus (default test), or the files `src` and
    `ref`, score the hypotheses and write them to `out`, atomically.

    A multilingual model translates into `tgt_lang`, or the target of `pair` ("de-en"), the
    direction of a split; its evaluation also measures the off-target rate. `metrics` names
    the scores (`attn_mt.scores.METRICS`); COMET reads its model from `comet_model`.
    `out` defaults to a file beside the (first) checkpoint named after the split (or source
    file), the direction and the beam, e.g. `best.test.beam5.hyp.txt`. A line is split into
    its sentences as `translate` splits it (`split_sentences`).
    """
    from attn_mt.data.text import read_parallel
    from attn_mt.fileio import write_output
    from attn_mt.paths import check_output_file

    src, ref = (None if src is None else Path(src)), (None if ref is None else Path(ref))
    check_evaluation_files(split, src, ref, pair, tgt_lang)
    check_metrics(metrics, comet_model)
    data = translator.config.data
    tgt_lang = tgt_lang or (pair.partition("-")[2] if pair else None)
    src, ref, name = _files(translator, split, src, ref, pair)
    translator.language_prefix(tgt_lang)  # checked before any translation
    beam = translator.config.decode.beam
    out = Path(out) if out is not None else _beside(translator, f"{name}.beam{beam}.hyp.txt")
    inputs = [("--model", path) for path in translator.checkpoints]
    check_output_file(out, inputs=[*inputs, ("--src", src), ("--ref", ref)])
    sources, references = read_parallel(src, ref)
    if not sources:
        raise UserError(f"{src}: no lines; there is nothing to evaluate")
    hypotheses = _translated(translator, sources, tgt_lang, progress, split_sentences, pair)
    write_output(out, "".join(h + "\n" for h in hypotheses))  # kept, whatever scoring does
    scores = score(hypotheses, references, metrics, sources, comet_model)
    off_target = None
    if len(data.directions()) > 1 and tgt_lang is not None:
        from attn_mt.langid import off_target_rate

        languages = [lang for direction in data.directions() for lang in direction]
        off_target = off_target_rate(hypotheses, tgt_lang, languages)
    return Evaluation(scores, out, beam, off_target)


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


def _beside(translator: Translator, name: str) -> Path:
    """An output beside the (first) checkpoint: `best.` + `name`."""
    if not translator.checkpoints:
        raise UserError("evaluate: the translator has no checkpoint path; give out=FILE")
    checkpoint = translator.checkpoints[0]
    return checkpoint.with_name(f"{checkpoint.stem}.{name}")


def _translated(
    translator: Translator,
    sources: list[str],
    tgt_lang: str | None,
    progress: Progress | None,
    split_sentences: bool = True,
    pair: str | None = None,
) -> list[str]:
    """`sources` translated as `translate` translates them (each line's sentences one by one
    unless `split_sentences` is False; a test set of a sentence a line is translated alike
    either way), a bar shown where `progress` is given."""
    from attn_mt.documents.paragraphs import ParagraphTranslator

    src_lang = pair.partition("-")[0] if pair else None
    translator = ParagraphTranslator.splitting(translator, src_lang, split_sentences)
    if progress is None:
        return translator.translate(sources, tgt_lang=tgt_lang)
    with progress(len(sources)) as on_batch:
        return translator.translate(sources, on_batch=on_batch, tgt_lang=tgt_lang)


# ---------------------------------------------------------------------------------------------
# The text people type: the test set in capitals, Title Case, without final punctuation, with
# typos and with spans (`evaluate --variants`)

VARIANTS = ("plain", "upper", "title", "nopunct", "typos", "spans")
# What the `spans` variant puts into line i: TEST_SPANS[i % len], at the start of the source and
# reference alike in one round of the list, at the end (before the final punctuation) in the next.
TEST_SPANS = (
    ("url", "https://www.example.com/"),
    ("email", "info@example.com"),
    ("number", "1987"),
    ("handle", "@attn_mt"),
    ("url", "https://example.org/docs/index.html?id=42"),
    ("emoji", "🙂"),
    ("number", "42"),
    ("email", "anna.schmidt@example.org"),
    ("tag", "#multi30k"),
    ("path", "/etc/hosts"),
    ("number", "250"),
    ("code", "`make test`"),
    ("emoji", "👍"),
    ("url", "www.example.net/path"),
)


def parse_variants(text: str) -> tuple[str, ...]:
    """`--variants a,b`: known names, plain first (the others' baseline), each once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise UserError(
            f"--variants {text}: {', '.join(unknown) or 'none given'}; choose from "
            f"{','.join(VARIANTS)}"
        )
    return tuple(dict.fromkeys(["plain", *names]))


def with_span(line: str, number: int) -> str:
    """`line` with the span of line `number` (from 0) of the `spans` variant put in."""
    _, span = TEST_SPANS[number % len(TEST_SPANS)]
    if (number // len(TEST_SPANS)) % 2 == 0:
        return f"{span} {line.lstrip()}"
    body = line.rstrip()
    final = final_punct(body)
    return f"{body[: len(body) - len(final)].rstrip()} {span}{final}"


def changed(variant: str, lines: list[str], side: str) -> list[str]:
    """`lines` (the `side` "src", "ref" or "hyp") as `variant` writes them, by data.augment's
    own functions: typos on sources alone (a per-line seed), spans on every side."""
    if variant == "upper":
        return [line.upper() for line in lines]
    if variant == "title":
        return [title_case(line) for line in lines]
    if variant == "nopunct":
        return [without_final_punct(line) for line in lines]
    if variant == "typos" and side == "src":
        return [with_typos(line, random.Random(n)) for n, line in enumerate(lines)]
    if variant == "spans":
        return [with_span(line, n) for n, line in enumerate(lines)]
    return list(lines)


@dataclass
class VariantScore:
    """One variant's scores; `alike`: of the plain test's output changed as the variant
    changes the text (what a perfect reader of the variant would score); for `spans`, the
    share of spans found verbatim per kind and the scores of the rest of the output."""

    name: str
    scores: Scores
    alike: Scores | None = None
    verbatim: dict[str, float] | None = None
    rest: Scores | None = None

    def to_dict(self) -> dict:
        found: dict = {"name": self.name, **self.scores.to_dict()}
        if self.alike is not None:
            found["plain_alike"] = self.alike.to_dict()
        if self.verbatim is not None:
            found["spans_verbatim"] = self.verbatim
        if self.rest is not None:
            found["rest"] = self.rest.to_dict()
        return found


@dataclass
class VariantEvaluation:
    """`evaluate --variants`: a row per variant and the folder of their files."""

    rows: list[VariantScore]
    folder: Path
    beam: int

    def to_dict(self) -> dict:
        return {
            "variants": [row.to_dict() for row in self.rows],
            "folder": str(self.folder),
            "beam": self.beam,
        }

    def table(self, metrics: Sequence[str]) -> str:
        """A row per variant: its scores, the plain output's changed alike, spans verbatim."""
        labels = [METRICS[m].label for m in metrics]
        lines = [
            f"{'variant':<9}"
            + "".join(f"{x:>9}" for x in labels)
            + "".join(f"{'alike ' + x:>15}" for x in labels)
            + "  spans verbatim"
        ]
        for row in self.rows:
            line = f"{row.name:<9}" + "".join(f"{row.scores.values[m]:9.2f}" for m in metrics)
            if row.alike is not None:
                line += "".join(f"{row.alike.values[m]:15.2f}" for m in metrics)
            if row.verbatim is not None:
                kinds = ", ".join(f"{k} {v:.1f}%" for k, v in row.verbatim.items() if k != "all")
                line += f"  {row.verbatim['all']:.1f}% ({kinds})"
            lines.append(line)
        return "\n".join(lines)


def evaluate_variants(
    translator: Translator,
    variants: Sequence[str],
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
    pair: str | None = None,
    tgt_lang: str | None = None,
    metrics: Sequence[str] = DEFAULT_METRICS,
    comet_model: Path | None = None,
    split_sentences: bool = True,
) -> VariantEvaluation:
    """Translate the test set (as `evaluate_split` picks it) as given and as each variant
    writes it (`changed`), and score each against its references changed alike. Into the
    folder `out` (default beside the checkpoint, e.g. `best.test.beam5.variants/`) go each
    variant's `V.src`, `V.ref`, `V.hyp` and `V.alike` (the plain output changed alike), and
    for spans `spans.rest` (the output without its spans, against `plain.ref`): the files
    `attn-mt compare` runs the paired tests on."""
    from attn_mt.data.text import read_parallel
    from attn_mt.fileio import write_output
    from attn_mt.paths import check_output_dir

    src, ref = (None if src is None else Path(src)), (None if ref is None else Path(ref))
    check_evaluation_files(split, src, ref, pair, tgt_lang)
    check_metrics(metrics, comet_model)
    variants = parse_variants(",".join(variants))
    tgt_lang = tgt_lang or (pair.partition("-")[2] if pair else None)
    src, ref, name = _files(translator, split, src, ref, pair)
    translator.language_prefix(tgt_lang)  # checked before any translation
    beam = translator.config.decode.beam
    folder = Path(out) if out is not None else _beside(translator, f"{name}.beam{beam}.variants")
    inputs = [("--model", path) for path in translator.checkpoints]
    check_output_dir(folder, inputs=[*inputs, ("--src", src), ("--ref", ref)])
    sources, references = read_parallel(src, ref)
    if not sources:
        raise UserError(f"{src}: no lines; there is nothing to evaluate")
    folder.mkdir(parents=True, exist_ok=True)
    plain: list[str] = []
    rows = []
    for variant in variants:
        files = {
            "src": changed(variant, sources, "src"),
            "ref": changed(variant, references, "ref"),
        }
        files["hyp"] = _translated(
            translator, files["src"], tgt_lang, progress, split_sentences, pair
        )
        plain = plain or files["hyp"]
        row = _scored(variant, files, plain, references, metrics, comet_model)
        for kind, lines in files.items():
            write_output(folder / f"{variant}.{kind}", "".join(x + "\n" for x in lines))
        rows.append(row)
    return VariantEvaluation(rows, folder, beam)


def _scored(
    variant: str,
    files: dict[str, list[str]],
    plain: list[str],
    references: list[str],
    metrics: Sequence[str],
    comet_model: Path | None,
) -> VariantScore:
    """A variant's row from its `files` (src, ref, hyp; `alike` and for spans `rest` are
    added), `plain` the plain test's output and `references` its references."""

    def scored(hypotheses: list[str], refs: list[str]) -> Scores:
        return score(hypotheses, refs, metrics, files["src"], comet_model)

    row = VariantScore(variant, scored(files["hyp"], files["ref"]))
    if variant != "plain":
        files["alike"] = changed(variant, plain, "hyp")
        row.alike = scored(files["alike"], files["ref"])
    if variant == "spans":
        row.verbatim, files["rest"] = _spans_found(files["hyp"])
        row.rest = scored(files["rest"], references)
    return row


def _spans_found(hypotheses: list[str]) -> tuple[dict[str, float], list[str]]:
    """The percent of the `spans` variant's spans found verbatim in its outputs, in all and per
    kind, and each output without its span (where found), its spaces closed."""
    found: dict[str, list[bool]] = {"all": []}
    rest = []
    for number, line in enumerate(hypotheses):
        kind, span = TEST_SPANS[number % len(TEST_SPANS)]
        held = span in line
        found["all"].append(held)
        found.setdefault(kind, []).append(held)
        rest.append(" ".join(line.replace(span, " ", 1).split()) if held else line)
    return {kind: 100 * sum(held) / len(held) for kind, held in found.items()}, rest
