"""`attn-mt compare`: systems against a baseline on one test set, as the field reports them
(Koehn 2004; sacreBLEU 2.0): per metric the score, its 95% confidence interval and the p-value
of the difference from the baseline.

The figures are sacreBLEU's own paired tests (`sacrebleu.significance.PairedTest`): bootstrap
resampling (1,000 resamples) or approximate randomization (10,000 trials, and 1,000 bootstrap
resamples for the intervals), with sacreBLEU's seed (12345, or $SACREBLEU_SEED), so they are
those of `sacrebleu REF -i BASELINE SYSTEM... --paired-bs` (or `--paired-ar`).

A system is a file of hypotheses, or a model (a run folder or a .pt) that first translates the
sources with its own decode settings (or the beam given). Every file is read and checked before
any model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.errors import DataError, UserError, named
from attn_mt.paths import resolve_checkpoint
from attn_mt.scores import DEFAULT_METRICS, METRICS, build_metrics, check_metrics

if TYPE_CHECKING:
    from attn_mt.evaluate import Progress

PAIRED_TESTS = {
    "bs": "paired bootstrap resampling (1,000 resamples)",
    "ar": "paired approximate randomization (10,000 trials; intervals: 1,000 resamples)",
}
SIGNIFICANT = 0.05  # the p-value below which the table marks a difference with *


@dataclass(frozen=True)
class Figure:
    """One metric of one system: the score, the 95% interval of its bootstrap resamples (mean
    +- half the 2.5th-97.5th percentile range, as sacreBLEU gives it) and the p-value of its
    difference from the baseline (None for the baseline)."""

    score: float
    ci: tuple[float, float]
    p: float | None
    identical: bool = False  # the baseline's output, line for line (p 1: no difference to test)


@dataclass
class Comparison:
    """What `compare` found: each system's figures by metric, the baseline first."""

    names: list[str]
    figures: list[dict[str, Figure]]
    signatures: dict[str, str]
    paired: str  # "bs" or "ar"
    sentences: int

    def to_dict(self) -> dict:
        """`compare --json`: {"systems": [{"name", "metrics": {m: {"score", "ci", "p"}}}]}."""
        return {
            "systems": [
                {
                    "name": name,
                    "metrics": {
                        metric: {"score": f.score, "ci": list(f.ci), "p": f.p}
                        for metric, f in figures.items()
                    },
                }
                for name, figures in zip(self.names, self.figures, strict=True)
            ]
        }

    def table(self) -> str:
        """A table to read: a row per system, per metric `score [low, high] p`, * where
        p < 0.05; then what the figures are and the signatures."""
        names = [f"{self.names[0]} (baseline)", *self.names[1:]]
        rows = [["system", *(METRICS[m].label for m in self.signatures)]]
        for name, figures in zip(names, self.figures, strict=True):
            rows.append([name, *(_cell(f) for f in figures.values())])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        lower = [METRICS[m].label for m in self.signatures if not METRICS[m].higher_is_better]
        lines += [
            "",
            f"{self.sentences} sentences; [low, high]: the 95% confidence interval; p: the "
            f"p-value of the difference from the baseline,\n{PAIRED_TESTS[self.paired]}; "
            f"* p < {SIGNIFICANT}" + "".join(f"; {label}: lower is better" for label in lower),
        ]
        if any(f.identical for figures in self.figures for f in figures.values()):
            lines[-1] += (
                "; identical: the baseline's scores, sentence for sentence (its output, or one "
                "the metric reads alike)"
            )
        lines += [f"{METRICS[m].label} signature: {sig}" for m, sig in self.signatures.items()]
        return "\n".join(lines)


def _cell(f: Figure) -> str:
    low, high = f.ci
    text = f"{f.score:.2f} [{low:.2f}, {high:.2f}]"
    if f.identical:
        return f"{text} p 1 identical"
    if f.p is not None:
        text += f" p {f.p:.4f}" + (" *" if f.p < SIGNIFICANT else "")
    return text


def compare(
    systems: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[str],
    metrics: Sequence[str] = DEFAULT_METRICS,
    paired: str = "bs",
    sources: Sequence[str] | None = None,
    comet_model: Path | None = None,
) -> Comparison:
    """sacreBLEU's paired test (`paired`: "bs" or "ar") of (name, hypotheses) systems, the
    first the baseline, against one reference each. A system whose output is the baseline's,
    line for line, or whose every sentence the metric scores as the baseline's (an output that
    differs in spaces the tokenizer drops), is `identical`, with p 1: there is no difference
    to test (sacreBLEU's tests count a resample whose difference is 0 as at least as large as
    none, and give p 1/(N+1))."""
    from sacrebleu.significance import PairedTest

    if paired not in PAIRED_TESTS:
        raise UserError(f"--paired {paired}: unknown; use bs or ar")
    built = build_metrics(metrics, references, sources, comet_model)
    named_systems: list[tuple[str, Sequence[str]]] = [(name, list(h)) for name, h in systems]
    # n_ar_confidence 0: approximate randomization's intervals by sacreBLEU's 1,000 resamples
    test = PairedTest(
        named_systems, built, None, paired, n_ar_confidence=0 if paired == "ar" else -1
    )
    signatures, results = test()
    columns = [column for name, column in results.items() if name != "System"]  # metric order
    figures: list[dict[str, Figure]] = [{} for _ in systems]
    base = named_systems[0][1]
    for metric, column in zip(built, columns, strict=True):
        for row, result in enumerate(column):
            assert not isinstance(result, str) and result.mean is not None and result.ci is not None
            low, high = float(result.mean - result.ci), float(result.mean + result.ci)
            same = row > 0 and _scored_alike(built[metric], named_systems[row][1], base)
            p = None if row == 0 else 1.0 if same else result.p_value
            figures[row][metric] = Figure(float(result.score), (low, high), p, same)
    names = [name for name, _ in systems]
    by_metric = {m: str(sig) for m, sig in zip(built, signatures.values(), strict=True)}
    return Comparison(names, figures, by_metric, paired, len(references))


def _scored_alike(metric: Any, hypotheses: Sequence[str], baseline: Sequence[str]) -> bool:
    """Whether `metric` (its references cached) scores every sentence of `hypotheses` as the
    baseline's: the same lines, or the same sufficient statistics line for line."""
    if list(hypotheses) == list(baseline):
        return True
    extract = getattr(metric, "_extract_corpus_statistics", None)  # sacreBLEU's own metrics
    if extract is None:
        return False
    ours, theirs = extract(list(hypotheses), None), extract(list(baseline), None)
    return all(list(a) == list(b) for a, b in zip(ours, theirs, strict=True))


def is_model(path: Path) -> bool:
    """A run folder or a checkpoint, which translates; any other file holds hypotheses."""
    return path.is_dir() or path.suffix == ".pt"


def compare_files(
    systems: Sequence[Path],
    ref: Path,
    src: Path | None = None,
    metrics: Sequence[str] = DEFAULT_METRICS,
    paired: str = "bs",
    beam: int | None = None,
    device: str = "auto",
    progress: Progress | None = None,
    comet_model: Path | None = None,
) -> Comparison:
    """`compare` of hypothesis files and models (`is_model`: they translate `src` with their
    own decode settings, or `beam`), every file read and checked before a model loads: one
    line per reference line, no empty file, --src when a model translates or COMET reads it."""
    from attn_mt.data.text import read_lines

    check_metrics(metrics, comet_model)
    if not systems:
        raise UserError("compare: name a baseline and the systems to compare with it")
    references = _read(ref, "--ref")
    if not references:
        raise UserError(f"--ref {named(ref)}: no lines; there is nothing to compare against")
    need = f"one line per reference line ({len(references)} in {named(ref)})"
    sources = None
    if src is not None:
        sources = _read(src, "--src")
        if len(sources) != len(references):
            raise UserError(f"--src {named(src)} has {len(sources)} lines; it needs {need}")
    found = {path: resolve_checkpoint(path) for path in systems if is_model(path)}
    models = list(found)
    if beam is not None and beam < 1:
        raise UserError(f"--beam {beam}: must be 1 or more (1 = greedy)")
    if beam is not None and not models:
        raise UserError(f"--beam {beam}: every system is a hypothesis file; no model translates")
    if sources is None and (models or "comet" in metrics):
        why = f"{named(models[0])} is a model" if models else "COMET reads the sources"
        raise UserError(f"compare: {why}; give --src FILE, the sources it translates")
    outputs: dict[Path, list[str]] = {}
    for path in systems:
        if path not in found:
            outputs[path] = lines = read_lines(path)
            if not lines:
                raise UserError(f"{named(path)}: no lines; a system's output needs {need}")
            if len(lines) != len(references):
                raise UserError(f"{named(path)} has {len(lines)} lines; a system needs {need}")
    for path in models:
        assert sources is not None  # checked above
        outputs[path] = _translate(found[path], sources, beam, device, progress)
    named_outputs = [(str(path), outputs[path]) for path in systems]
    return compare(named_outputs, references, metrics, paired, sources, comet_model)


def _read(path: Path, option: str) -> list[str]:
    """The lines of --ref or --src; an error names the option."""
    from attn_mt.data.text import read_lines

    try:
        return read_lines(path)
    except DataError as err:
        raise DataError(f"{option} {err}") from None


def _translate(
    checkpoint: Path, sources: list[str], beam: int | None, device: str, progress: Progress | None
) -> list[str]:
    """A model's translation of the sources: its own decode settings, or `beam`."""
    import attn_mt

    decode = None if beam is None else {"beam": beam}
    translator = attn_mt.load(checkpoint, device=device, decode=decode)
    if progress is None:
        return translator.translate(sources)
    with progress(len(sources)) as on_batch:
        return translator.translate(sources, on_batch=on_batch)
