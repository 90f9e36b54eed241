"""The pass of `data.filters` over a config's training corpora, on worker processes: what
`prepare` keeps before it trains SentencePiece and encodes, and what `attn-mt clean` writes.

The corpora are read once, as a stream, in chunks; each worker judges a chunk with the corpus's
`PairFilter` and gives back a rule code per pair (and the scores of the pairs it kept by the
rules that accept in order: dedup's hashes); this process, which sees the chunks in order, drops
the repeats (`SeenHashes`: 8 bytes a pair kept) and, in `attn-mt clean`, what a model scores
under `score_min`. Memory stays bounded by the chunks in flight and those hashes, whatever the
corpus size.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from attn_mt.config.data import DataConfig, TrainCorpus
from attn_mt.data.filters import PairFilter, rule_code, rule_names
from attn_mt.data.pool import chunks, ordered_map
from attn_mt.data.rules import ChunkRule, Score
from attn_mt.data.text import FilterStats, iter_parallel
from attn_mt.errors import ConfigError
from attn_mt.fileio import atomic_write

_JUDGES: list[PairFilter | None] = []  # each worker's filters, one per corpus, set once
# The score rule of a corpus: which of its pairs (sources, targets) a model drops. It runs a
# model, so `attn-mt clean` builds it (`attn_mt.decode.pairscore`) and this pass calls it.
Scorer = Callable[[list[str], list[str]], np.ndarray]


@dataclass
class Judged:
    """A chunk of one corpus, with the rule code of each pair (0 = kept; see `rule_names`)."""

    corpus: int  # its index in data.train
    lines: list[int]  # 0-based line numbers in the corpus files
    src: list[str]
    tgt: list[str]
    codes: np.ndarray  # (N,) uint8


def pair_filters(
    cfg: DataConfig, corpora: list[TrainCorpus], every: bool
) -> list[PairFilter | None]:
    """Each corpus's `PairFilter`; with `every` False, None for a corpus with no rule on."""
    filters: list[PairFilter | None] = []
    for corpus in corpora:
        rules = cfg.filters_of(corpus)
        src_lang, tgt_lang = corpus.src_lang or cfg.src_lang, corpus.tgt_lang or cfg.tgt_lang
        filters.append(PairFilter(rules, src_lang, tgt_lang) if every or rules.any() else None)
    return filters


def _init_judges(judges: list[PairFilter | None]) -> None:
    _JUDGES[:] = judges


def judge_chunk(task: tuple[int, list[str], list[str]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """A worker's part: (rule codes, the scores of the pairs kept by each rule that accepts in
    order)."""
    corpus, src, tgt = task
    judge = _JUDGES[corpus]
    assert judge is not None  # only corpora with filters are sent
    codes = judge.judge(src, tgt)
    return codes, judge.in_order_scores(src, tgt, codes)


def judged(
    corpora: list[TrainCorpus],
    judges: list[PairFilter | None],
    workers: int,
    scorers: Sequence[Scorer | None] = (),
) -> Iterator[Judged]:
    """Every chunk of the corpora that have a filter, judged on `workers` processes, in order;
    then, in this process, the rules that accept in order (a pair equal to one kept before in
    its corpus gets the code of `dedup`), then a corpus's scorer (`score` runs a model)."""
    waiting: collections.deque[tuple[int, list[int], list[str], list[str]]] = collections.deque()

    def tasks() -> Iterator[tuple[int, list[str], list[str]]]:
        for index, (corpus, judge) in enumerate(zip(corpora, judges, strict=True)):
            if judge is not None:
                assert corpus.src is not None and corpus.tgt is not None  # a validated config
                numbered = (
                    (i, s, t) for i, (s, t) in enumerate(iter_parallel(corpus.src, corpus.tgt))
                )
                for lines, src, tgt in chunks(numbered):
                    waiting.append((index, lines, src, tgt))
                    yield index, src, tgt

    in_order: list[ChunkRule] = []
    in_order_corpus = -1
    for codes, scores in ordered_map(judge_chunk, tasks(), workers, _init_judges, (judges,)):
        index, lines, src, tgt = waiting.popleft()
        judge = judges[index]
        assert judge is not None
        if index != in_order_corpus:  # repeats are looked for within a corpus
            in_order, in_order_corpus = judge.in_order_rules(), index
        judge.say_cut(f"data.train[{index}]", lines, src, tgt, codes)  # langid's long sides
        kept = np.flatnonzero(codes == 0)  # by the workers: the pairs `scores` are of
        for rule, scored in zip(in_order, scores, strict=True):
            left = codes[kept] == 0
            codes[kept[left][~rule.accept(scored[left])]] = rule_code(rule.name)
        scorer = scorers[index] if scorers else None
        if scorer is not None and (rows := np.flatnonzero(codes == 0).tolist()):
            drops = scorer([src[i] for i in rows], [tgt[i] for i in rows])
            codes[np.asarray(rows)[drops]] = rule_code(Score.name)
        yield Judged(index, lines, src, tgt, codes)


def judge_corpora(
    cfg: DataConfig, corpora: list[TrainCorpus], workers: int
) -> list[np.ndarray | None]:
    """For `prepare`: each corpus's rule code per line, None for a corpus with no rule on."""
    for i, corpus in enumerate(corpora):
        if Score.is_on(cfg.filters_of(corpus)):
            where = "data.filters" if corpus.filters is None else f"data.train[{i}].filters"
            raise ConfigError(
                f"{where}.score: runs a model, in `attn-mt clean` only; clean the corpus there "
                "and train on the pairs it keeps (docs/bigger-corpora.md)"
            )
    judges = pair_filters(cfg, corpora, every=False)
    parts: list[list[np.ndarray]] = [[] for _ in corpora]
    if any(judges):
        for chunk in judged(corpora, judges, workers):
            parts[chunk.corpus].append(chunk.codes)
    return [
        np.concatenate([np.zeros(0, np.uint8), *p]) if judge else None
        for p, judge in zip(parts, judges, strict=True)
    ]


def dropped_counts(codes: np.ndarray | None) -> FilterStats:
    """The pairs each rule dropped, from a corpus's codes (`kept` left 0: encoding counts it)."""
    stats = FilterStats()
    if codes is not None:
        names = rule_names()
        for code, count in enumerate(np.bincount(codes, minlength=len(names) + 1)):
            if code:
                stats.drop(names[code - 1], int(count))
    return stats


# ---------------------------------------------------------------------------------------------
# attn-mt clean


@dataclass
class CleanReport:
    """One corpus cleaned: its counts per rule (every rule on, in order), an example of each."""

    src: str
    tgt: str
    kept_files: tuple[Path, Path]
    lines: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # rule -> first

    def record(self) -> dict[str, Any]:
        """Its entry in report.json."""
        return {
            "src": self.src,
            "tgt": self.tgt,
            "lines": self.lines,
            "kept": self.kept,
            "dropped": self.dropped,
        }


def kept_files(cfg: DataConfig, corpora: list[TrainCorpus], out: Path) -> list[tuple[Path, Path]]:
    """Where `clean` writes each corpus's kept pairs: OUT/train.N.SRC.gz and OUT/train.N.TGT.gz
    (N its 1-based place in data.train, SRC and TGT its languages)."""
    files = []
    for n, corpus in enumerate(corpora, start=1):
        src_lang, tgt_lang = corpus.src_lang or cfg.src_lang, corpus.tgt_lang or cfg.tgt_lang
        files.append((out / f"train.{n}.{src_lang}.gz", out / f"train.{n}.{tgt_lang}.gz"))
    return files


def clean_corpora(
    cfg: DataConfig,
    corpora: list[TrainCorpus],
    out: Path,
    workers: int,
    scorers: Sequence[Scorer | None] = (),
) -> list[CleanReport]:
    """Write the kept pairs of every corpus, `dropped.tsv` and `report.json` into `out`, each
    file written whole or not at all (docs/bigger-corpora.md describes them); `scorers`: each
    corpus's `score` rule, where its config has one."""
    judges = pair_filters(cfg, corpora, every=True)
    reports = []
    for corpus, judge, files in zip(corpora, judges, kept_files(cfg, corpora, out), strict=True):
        assert judge is not None
        on = [rule.name for rule in judge.rules]
        reports.append(
            CleanReport(str(corpus.src), str(corpus.tgt), files, dropped=dict.fromkeys(on, 0))
        )
    with contextlib.ExitStack() as stack:
        dropped_tsv = stack.enter_context(atomic_write(out / "dropped.tsv"))
        handles = [
            tuple(stack.enter_context(_gzip_out(path)) for path in r.kept_files) for r in reports
        ]
        for chunk in judged(corpora, judges, workers, scorers):
            _write_chunk(chunk, reports[chunk.corpus], handles[chunk.corpus], dropped_tsv)
    with atomic_write(out / "report.json") as handle:
        report = {"corpora": [r.record() for r in reports]}
        handle.write((json.dumps(report, indent=1) + "\n").encode("utf-8"))
    return reports


@contextlib.contextmanager
def _gzip_out(path: Path) -> Iterator[IO[bytes]]:
    with (
        atomic_write(path) as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as handle,
    ):
        yield handle  # type: ignore[misc]


def _write_chunk(
    chunk: Judged, report: CleanReport, kept: tuple[IO[bytes], ...], dropped_tsv: IO[bytes]
) -> None:
    """The chunk's kept pairs into the corpus's files, its dropped ones into dropped.tsv."""
    keep = chunk.codes == 0
    report.lines += len(chunk.codes)
    report.kept += int(keep.sum())
    for handle, side in zip(kept, (chunk.src, chunk.tgt), strict=True):
        handle.write(
            "".join(line + "\n" for line, k in zip(side, keep, strict=True) if k).encode("utf-8")
        )
    rows, names = [], rule_names()
    for i in np.flatnonzero(~keep):
        rule = names[chunk.codes[i] - 1]
        line, src, tgt = chunk.lines[i] + 1, chunk.src[i], chunk.tgt[i]
        report.dropped[rule] += 1
        report.examples.setdefault(rule, (line, src, tgt))
        rows.append(f"{chunk.corpus + 1}\t{line}\t{rule}\t{_field(src)}\t{_field(tgt)}\n")
    dropped_tsv.write("".join(rows).encode("utf-8"))


def _field(text: str) -> str:
    """A line as one dropped.tsv field: a tab or carriage return in it becomes a space."""
    return text.replace("\t", " ").replace("\r", " ")
