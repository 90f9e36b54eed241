"""Writing token shards (the format is described in `attn_mt.data.shards`): every corpus is
read as a stream, its pairs that `data.filters` kept are changed as `data.augment` says, encoded
and cleaned (data.max_len, data.max_len_ratio) in chunks by a pool of forked workers
(`attn_mt.data.pool`), written into a temp folder, and renamed into place once its manifest is
whole. Ctrl-C and SIGTERM are acted on between chunks, so a stopped build leaves no temp folder
and no half-written pool pipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt.config.data import TrainCorpus
from attn_mt.config.schema import Config
from attn_mt.data.augment import Augmenter
from attn_mt.data.cleaning import dropped_counts
from attn_mt.data.ids import tag_ids
from attn_mt.data.pool import chunks, ordered_map
from attn_mt.data.shards import FORMAT, MANIFEST, SHARD_FILES, sha256_file
from attn_mt.data.text import FilterStats, clean_pairs, iter_parallel
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import DataError
from attn_mt.text.normalize import invisible

log = logging.getLogger("attn_mt")


@dataclasses.dataclass
class Plan:
    """What a prepared folder must hold for this config, and where it is."""

    corpora: list[TrainCorpus]
    identity: dict[str, Any]  # what decides the tokens: input hashes, tags, settings
    folder: Path
    tags: list[list[str]]  # per corpus, the pieces put before each source sentence
    # Per corpus, the rule code of each line by data.filters (0 = kept; None: no rule on).
    codes: list[np.ndarray | None] = dataclasses.field(default_factory=list)


def model_hashes(tokenizers: tuple[Tokenizer, Tokenizer]) -> list[str]:
    return [hashlib.sha256(tok.model_bytes).hexdigest() for tok in tokenizers]


_WORKER: dict[str, Any] = {}  # each worker's tokenizers and settings, set once


def _init_worker(
    src_model: bytes,
    tgt_model: bytes,
    max_len: int,
    ratio: float,
    dtype: str,
    augmenter: Augmenter | None,
) -> None:
    _WORKER.update(src=Tokenizer(src_model), tgt=Tokenizer(tgt_model))
    _WORKER.update(max_len=max_len, ratio=ratio, dtype=dtype, augmenter=augmenter)


def encode_chunk(
    task: tuple[int, list[str], list[int], list[str], list[str]],
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, FilterStats]:
    """Encode and clean one chunk of a corpus: (corpus, src tokens, tgt tokens, lengths, stats).

    The pairs are first changed as data.augment says (drawn by their line numbers); the tags
    (target language, corpus) are put before each kept source sentence by id (`tag_ids`, the
    rule translation follows); cleaning looks at the sentences alone. The text is encoded as
    read, neither stripped nor cut: data.max_len drops an over-long pair.
    """
    corpus, tags, lines, src_lines, tgt_lines = task
    w = _WORKER
    if w["augmenter"] is not None:
        changed = [
            w["augmenter"].pair(s, t, corpus, line)
            for line, s, t in zip(lines, src_lines, tgt_lines, strict=True)
        ]
        src_lines, tgt_lines = [s for s, _ in changed], [t for _, t in changed]
    src_ids, tgt_ids = w["src"].encode(src_lines), w["tgt"].encode(tgt_lines)
    keep, stats = clean_pairs(src_ids, tgt_ids, w["max_len"], w["ratio"])
    prefix = tag_ids(w["src"], tags)  # by id, as translation puts the target-language tag
    src_kept = [prefix + src_ids[i] for i in keep]
    tgt_kept = [tgt_ids[i] for i in keep]
    lengths = np.array([[len(s), len(t)] for s, t in zip(src_kept, tgt_kept, strict=True)])
    return (
        corpus,
        np.fromiter(itertools.chain.from_iterable(src_kept), w["dtype"]),
        np.fromiter(itertools.chain.from_iterable(tgt_kept), w["dtype"]),
        lengths.reshape(-1, 2),
        stats,
    )


def kept_lines(src: str, tgt: str, codes: np.ndarray | None) -> Iterator[tuple[int, str, str]]:
    """(line, source, target) of the pairs of a corpus that data.filters kept (`codes`: each
    line's rule code, None for all), lines numbered from 0, read as translation reads a line:
    without the invisible characters SentencePiece keeps (`attn_mt.text.normalize`)."""
    for line, (s, t) in enumerate(iter_parallel(src, tgt)):
        if codes is None or not codes[line]:
            yield line, invisible(s), invisible(t)


def _tasks(target: Plan) -> Iterator[tuple[int, list[str], list[int], list[str], list[str]]]:
    """The kept pairs of every corpus in chunks (`pool.chunks`), corpus after corpus, read as
    a stream."""
    for index, (corpus, tags) in enumerate(zip(target.corpora, target.tags, strict=True)):
        assert corpus.src is not None and corpus.tgt is not None  # a validated config has both
        codes = target.codes[index] if target.codes else None
        for lines, src, tgt in chunks(kept_lines(corpus.src, corpus.tgt, codes)):
            yield index, tags, lines, src, tgt


def write_shards(
    cfg: Config, target: Plan, tokenizers: tuple[Tokenizer, Tokenizer], workers: int
) -> None:
    """Encode every corpus into a temp folder, then rename it to `target.folder`."""
    src_tok, tgt_tok = tokenizers
    tags = cfg.data.tags()
    for tag, piece in zip(tags, tag_ids(src_tok, tags), strict=True):
        if piece == src_tok.sp.unk_id():
            raise DataError(
                f"data.train: tag {tag} is not a piece of the source tokenizer (a resumed run's "
                "tokenizer was trained without it); start a new run to add tags"
            )
    dtype = "uint16" if max(src_tok.vocab_size, tgt_tok.vocab_size) <= 65535 else "int32"
    corpus_dtype = np.int16 if len(target.corpora) <= 2**15 else np.int32  # tens of thousands
    target.folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.folder.with_name(f".{target.folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    log.info("prepared data: encoding into %s with %d process(es)", target.folder, workers)
    stats = [dropped_counts(codes) for codes in target.codes or [None] * len(target.corpora)]
    lengths: list[np.ndarray] = []
    corpus_of: list[np.ndarray] = []
    try:
        init: tuple[Any, ...] = (src_tok.model_bytes, tgt_tok.model_bytes, cfg.data.max_len)
        init += (cfg.data.max_len_ratio, dtype, augmenter(cfg))
        encoded = ordered_map(encode_chunk, _tasks(target), workers, _init_worker, init)
        with open(tmp / "src.bin", "wb") as src_out, open(tmp / "tgt.bin", "wb") as tgt_out:
            for corpus, src, tgt, rows, chunk_stats in encoded:
                src_out.write(src.tobytes())
                tgt_out.write(tgt.tobytes())
                lengths.append(rows)
                corpus_of.append(np.full(len(rows), corpus, dtype=corpus_dtype))
                stats[corpus].add(chunk_stats)
        _check_kept(cfg, stats)
        all_lengths = np.concatenate(lengths)
        offsets = np.zeros((len(all_lengths) + 1, 2), dtype=np.int64)
        np.cumsum(all_lengths, axis=0, out=offsets[1:])
        np.save(tmp / "index.npy", offsets)
        np.save(tmp / "corpus.npy", np.concatenate(corpus_of))
        (tmp / "src.model").write_bytes(src_tok.model_bytes)
        (tmp / "tgt.model").write_bytes(tgt_tok.model_bytes)
        manifest = _manifest(tmp, target, stats, dtype, offsets, tokenizers)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _move_into_place(tmp, target.folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for c, s in zip(target.corpora, stats, strict=True):
        log.info("prepared data: %s: %d pairs kept, %s", c.src, s.kept, s.describe())


def augmenter(cfg: Config) -> Augmenter | None:
    """The run's `data.augment`, or None when every share is 0."""
    return Augmenter(cfg.data.augment, cfg.train.seed) if cfg.data.augment.any() else None


def _manifest(
    folder: Path,
    target: Plan,
    stats: list[FilterStats],
    dtype: str,
    offsets: np.ndarray,
    tokenizers: tuple[Tokenizer, Tokenizer],
) -> dict[str, Any]:
    """What a prepared folder holds: its corpora and their filter counts, what it was made
    from (`target.identity`), its sizes, and every file's size and sha256."""
    corpora = [
        {**ident, "src_path": c.src, "tgt_path": c.tgt, **dataclasses.asdict(s), "pairs": s.pairs}
        for ident, c, s in zip(target.identity["corpora"], target.corpora, stats, strict=True)
    ]
    return {
        "format": FORMAT,
        "corpora": corpora,
        "identity": target.identity,
        "dtype": dtype,
        "pairs": len(offsets) - 1,
        "tokens": [int(n) for n in offsets[-1]],
        "tokenizer_sha256": model_hashes(tokenizers),
        "files": {
            name: {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
            for name in SHARD_FILES
        },
    }


def _check_kept(cfg: Config, stats: Sequence[FilterStats]) -> None:
    total = FilterStats()
    for s in stats:
        total.add(s)
    if not total.kept:
        raise DataError(
            f"every training pair was filtered out ({total.describe()}); loosen the rule that "
            f"dropped most (data.max_len is {cfg.data.max_len}; data.filters, per corpus too)"
        )


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Rename the finished temp folder to `folder`, replacing an outdated one."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        os.replace(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, folder)
