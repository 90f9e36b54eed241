"""`attn-mt clean`: a config's `data.filters` applied to its training corpora without training,
so a user can read what each rule drops before a run (docs/bigger-corpora.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import ConfigSetOption, DeviceOption
from attn_mt.errors import UserError, named
from attn_mt.fileio import os_reason

if TYPE_CHECKING:
    from attn_mt.config.data import DataConfig, TrainCorpus
    from attn_mt.data.cleaning import CleanReport, Scorer
    from attn_mt.decode.pairscore import PairScore

EXAMPLE_CHARS = 40  # of each side, in the printed table


@app.command(epilog="Example: attn-mt clean -c paracrawl.yaml --out cleaned/")
def clean(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", metavar="FILE", help="The YAML config file.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            help="Folder for the kept pairs (train.N.SRC.gz, train.N.TGT.gz), dropped.tsv and "
            "report.json.",
        ),
    ] = None,
    set_: ConfigSetOption = None,
    workers: Annotated[
        int,
        typer.Option("--workers", metavar="N", help="Filter processes (0 = every core).", min=0),
    ] = 0,
    device: DeviceOption = "auto",
) -> None:
    """Apply data.filters to the training corpora: write the pairs kept, each dropped pair with
    the rule that dropped it (dropped.tsv) and the counts (report.json); print a table."""
    from attn_mt.config.file import load_config

    if config is None or out is None:
        raise UserError("clean: give --config FILE and --out DIR")
    cfg = load_config(config, set_ or [], training=False)  # no training: no budget needed
    if device != "auto":  # a device named is checked, whether or not a rule runs a model
        from attn_mt.precision import resolve_device

        resolve_device(device)
    from attn_mt.data.cleaning import clean_corpora, kept_files
    from attn_mt.data.corpora import train_corpora
    from attn_mt.data.pool import worker_count
    from attn_mt.paths import check_output_dir, check_output_file

    corpora = train_corpora(cfg.data)
    inputs = [
        (f"data.train[{i}].{side}", getattr(corpus, side))
        for i, corpus in enumerate(corpora)
        for side in ("src", "tgt")
    ]
    check_output_dir(out, "--out", inputs)
    outputs = [path for pair in kept_files(cfg.data, corpora, out) for path in pair]
    for path in [*outputs, out / "dropped.tsv", out / "report.json"]:
        check_output_file(path, "--out", inputs)
    processes = worker_count(workers)
    start = time.monotonic()
    scorers, models = _scorers(cfg.data, corpora, device)
    try:
        reports = clean_corpora(cfg.data, corpora, out, processes, scorers)
    except OSError as err:  # a full disk, a file-size limit: each file is whole or not there
        name = named(err.filename or out)
        raise UserError(
            f"--out {named(out)}: cannot write {name} ({os_reason(err)}); no file there is left "
            "half-written: make room and run clean again"
        ) from None
    seconds = time.monotonic() - start
    for number, report in enumerate(reports, start=1):
        for line in _table(number, report):
            print(line)
    for model in models:  # the scale of exp(-H), to tune score_min by
        print(model.summary())
    lines = sum(r.lines for r in reports)
    print(
        f"{lines:,} pairs in {seconds:.1f} s ({lines / max(seconds, 1e-9):,.0f} pairs/s, "
        f"{processes} process(es)); written to {out}: "
        f"{', '.join(p.name for p in outputs)}, dropped.tsv, report.json"
    )


def _scorers(
    data: DataConfig, corpora: list[TrainCorpus], device: str
) -> tuple[list[Scorer | None], list[PairScore]]:
    """Each corpus's `score` rule (its models loaded once for every corpus that shares them),
    and the rules loaded."""
    from attn_mt.decode.pairscore import PairScore

    loaded: dict[tuple, PairScore] = {}
    scorers: list[Scorer | None] = []
    for corpus in corpora:
        rules = data.filters_of(corpus)
        if rules.score is None:
            scorers.append(None)
            continue
        langs = (corpus.src_lang or data.src_lang, corpus.tgt_lang or data.tgt_lang)
        settings = (rules.score, rules.score_backward, rules.score_min, *langs)
        if settings not in loaded:
            loaded[settings] = PairScore(rules, *langs, device=device)
        scorers.append(loaded[settings].drops)
    return scorers, list(loaded.values())


def _table(number: int, report: CleanReport) -> list[str]:
    """The lines of one corpus: its counts, then a row per rule: dropped, share, an example."""
    share = 100 * report.kept / max(report.lines, 1)
    lines = [
        f"corpus {number}: {report.src}: {report.lines:,} pairs, {report.kept:,} kept "
        f"({share:.1f}%)",
        f"  {'rule':<11} {'dropped':>9} {'share':>7}  example (line: source ||| target)",
    ]
    for rule, count in report.dropped.items():
        example = ""
        if rule in report.examples:
            line, src, tgt = report.examples[rule]
            example = f"{line}: {_short(src)} ||| {_short(tgt)}"
        lines.append(
            f"  {rule:<11} {count:>9,} {100 * count / max(report.lines, 1):>6.2f}%  {example}"
        )
    return lines


def _short(text: str) -> str:
    """A side of an example, cut to EXAMPLE_CHARS characters (tabs as spaces)."""
    text = text.replace("\t", " ")
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"
