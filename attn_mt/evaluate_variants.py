"""`evaluate_variants` (`attn-mt evaluate --variants`): the same test set as people type it
(capitals, Title Case, no final punctuation, typos, spans), translated and scored against its
references changed alike, a row of scores per variant, and the files the paired tests read."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.data.augment import title_case, with_typos, without_final_punct
from attn_mt.errors import UserError
from attn_mt.evaluate import (
    Progress,
    TestChoice,
    TestSet,
    beside_checkpoint,
    test_set,
    translated,
)
from attn_mt.scores import METRICS, Scores
from attn_mt.text.normalize import final_punct

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translator

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
    choice: TestChoice | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
    **fields: Any,
) -> VariantEvaluation:
    """Translate the test set `choice` names (or its fields by keyword, as `evaluate_split`
    takes them) as given and as each variant
    writes it (`changed`), and score each against its references changed alike. Into the
    folder `out` (default beside the checkpoint, e.g. `best.test.beam5.variants/`) go each
    variant's `V.src`, `V.ref`, `V.hyp` and `V.alike` (the plain output changed alike), and
    for spans `spans.rest` (the output without its spans, against `plain.ref`): the files
    `attn-mt compare` runs the paired tests on."""
    from attn_mt.fileio import write_output
    from attn_mt.paths import check_output_dir

    variants = parse_variants(",".join(variants))
    test = test_set(translator, TestChoice.of(choice, fields))
    beam = test.beam
    named = f"{test.name}.beam{beam}.variants"
    folder = Path(out) if out is not None else beside_checkpoint(translator, named)
    check_output_dir(folder, inputs=test.inputs(translator))
    sources, references = test.lines()
    folder.mkdir(parents=True, exist_ok=True)
    plain: list[str] = []
    rows = []
    for variant in variants:
        files = {
            "src": changed(variant, sources, "src"),
            "ref": changed(variant, references, "ref"),
        }
        files["hyp"] = translated(translator, files["src"], test, progress)
        plain = plain or files["hyp"]
        row = _scored(variant, files, plain, references, test)
        for kind, lines in files.items():
            write_output(folder / f"{variant}.{kind}", "".join(x + "\n" for x in lines))
        rows.append(row)
    return VariantEvaluation(rows, folder, beam)


def _scored(
    variant: str,
    files: dict[str, list[str]],
    plain: list[str],
    references: list[str],
    test: TestSet,
) -> VariantScore:
    """A variant's row from its `files` (src, ref, hyp; `alike` and for spans `rest` are
    added), `plain` the plain test's output and `references` its references, scored by the
    metrics of `test`."""

    def scored(hypotheses: list[str], refs: list[str]) -> Scores:
        return test.score(hypotheses, refs, files["src"])

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
