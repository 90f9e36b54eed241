"""`attn-mt prepare`: the training corpora, once, as token shards that training memory-maps.

Every step streams, so memory stays bounded whatever the corpus size:
1. hash the input files (sha256); the hashes and the settings name the prepared folder, and a
   folder whose manifest matches is used as it is: an unchanged corpus is never encoded twice;
2. SentencePiece on a seeded random sample of at most `tokenizer.max_sentences` sentences
   (reservoir sampling; the whole corpus when it is smaller, which gives the model `train`
   trained on all lines before, from the same cache);
3. encode in chunks on `workers` processes, clean (empty pairs, `data.max_len`,
   `data.max_len_ratio`) and append to the flat token files; the index, the models and last
   the manifest follow, in a temp folder renamed into place when complete, so an interrupted
   prepare leaves nothing that training would trust.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt import distributed
from attn_mt.config import Config, DataConfig, TrainCorpus
from attn_mt.data import (
    FilterStats,
    cache_dir,
    check_text_file,
    clean_pairs,
    iter_parallel,
    train_corpora,
)
from attn_mt.errors import DataError, UserError
from attn_mt.paths import os_reason
from attn_mt.shards import (
    FORMAT,
    MANIFEST,
    SHARD_FILES,
    Shards,
    corpus_lines,
    open_shards,
    sha256_file,
)
from attn_mt.tokenizer import Tokenizer, build_tokenizers

log = logging.getLogger("attn_mt")

CHUNK = 20_000  # sentence pairs per encoding task


def prepared_root(cfg: DataConfig) -> Path:
    """Where prepared folders live: `data.prepared_dir`, else the cache's `prepared/`."""
    return Path(cfg.prepared_dir) if cfg.prepared_dir else cache_dir() / "prepared"


@dataclasses.dataclass
class Plan:
    """What a prepared folder must hold for this config, and where it is."""

    corpora: list[TrainCorpus]
    identity: dict[str, Any]  # what decides the tokens: input hashes, tags, settings
    folder: Path


def plan(cfg: Config) -> Plan:
    """Hash the inputs and name the folder that holds (or will hold) their shards."""
    corpora = train_corpora(cfg.data)
    identity = {
        "format": FORMAT,
        "corpora": [{"src": _digest(c.src), "tgt": _digest(c.tgt), "tag": c.tag} for c in corpora],
        "tokenizer": _tokenizer_identity(cfg),
        "max_len": cfg.data.max_len,
        "max_len_ratio": cfg.data.max_len_ratio,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    return Plan(corpora, identity, prepared_root(cfg.data) / key)


def _tokenizer_identity(cfg: Config) -> dict[str, Any]:
    """The tokenizer keys that decide the stored tokens: sampling happens per batch, later."""
    keys = dataclasses.asdict(cfg.tokenizer)
    keys.pop("sampling_alpha")
    return keys


def _digest(path: str | None) -> dict[str, Any]:
    """The size and sha256 of an input file: what says it changed."""
    file = Path(str(path))
    check_text_file(file)
    try:
        return {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
    except OSError as err:
        raise DataError(f"{file}: cannot read ({os_reason(err)})") from None


def prepare(
    cfg: Config,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    workers: int = 0,
    repair: bool = False,
) -> Shards:
    """The shards of `cfg`'s training corpora: reused when up to date, else (re)built.

    tokenizers: use these (a resumed run's, or rank 0's) instead of training SentencePiece.
    workers: encoding processes (0 = every core). repair: rebuild a damaged folder instead
    of refusing it (what `attn-mt prepare` does).
    """
    target = plan(cfg)
    if (target.folder / MANIFEST).is_file():
        try:
            shards = open_shards(target.folder)
        except DataError as err:
            if not repair:
                raise
            log.warning("%s; rebuilding it", str(err).split("; rebuild")[0])
        else:
            same_tokens = tokenizers is None or shards.tokenizer_hashes() == _hashes(tokenizers)
            if shards.manifest.get("identity") == target.identity and same_tokens:
                log.info("prepared data: %s is up to date (%d pairs)", target.folder, len(shards))
                return shards
            log.info("prepared data: %s is outdated (another tokenizer)", target.folder)
    if tokenizers is None:
        tokenizers = _train_tokenizers(cfg, target.corpora)
    _build(cfg, target, tokenizers, workers or _cores())
    return open_shards(target.folder)


def prepare_for(
    cfg: Config,
    tokenizers: tuple[Tokenizer, Tokenizer] | None,
    world: distributed.World,
    workers: int = 0,
) -> Shards:
    """The shards for every process of a run, prepared once per machine.

    Global rank 0 prepares first (training SentencePiece if need be: its models are the run's)
    while the others wait; then the first process of every other machine prepares with rank
    0's models (a quick check where it shares rank 0's folder). Every process maps its
    machine's folder, and the shards' digests must agree across machines. torchrun numbers a
    machine's processes from `rank - local_rank`, where its first process is.
    """
    mine: list[Shards] = []  # what this process prepared itself, if anything
    if world.distributed and not workers:
        # Encode in this process: forking one whose process group has threads running can
        # leave a child deadlocked on a lock held at the fork (a test's pool worker hung so).
        # A large corpus is prepared beforehand with `attn-mt prepare --workers N`.
        workers = 1

    def first() -> tuple[Path, tuple[Tokenizer, Tokenizer]]:
        mine.append(prepare(cfg, tokenizers, workers))
        return mine[0].folder, mine[0].tokenizers()

    folder, tokenizers = distributed.from_main(first, world)
    error = None
    if world.local_rank == 0 and not world.is_main:
        try:
            mine.append(prepare(cfg, tokenizers, workers))
            folder = mine[0].folder
        except UserError as err:
            error = str(err)
    reports = distributed.gather((folder, error), world)
    for _, failed in reports:
        if failed:
            raise DataError(failed)
    shards = mine[0] if mine else open_shards(reports[world.rank - world.local_rank][0])
    if len(set(distributed.gather(shards.digest, world))) > 1:
        raise DataError(
            "the prepared training data differ between machines (their manifests' file hashes "
            "differ); give every machine the same training files"
        )
    return shards


def prepared_corpus_lines(cfg: Config) -> list[str]:
    """`corpus_lines` of the prepared data, or of the raw files when not prepared yet."""
    target = plan(cfg)
    weights = cfg.data.weights()
    if not (target.folder / MANIFEST).is_file():
        entries = []
        for c in target.corpora:
            pairs = sum(1 for _ in iter_parallel(c.src, c.tgt))
            entries.append({"src_path": c.src, "kept": pairs, "pairs": pairs, "tag": c.tag})
        note = "not prepared yet (attn-mt prepare --config FILE): counts before cleaning"
        return [f"training corpora {note}", *corpus_lines(entries, weights)]
    manifest = open_shards(target.folder).manifest  # a damaged folder: say so
    return [
        f"training corpora prepared in {target.folder}",
        *corpus_lines(manifest["corpora"], weights),
    ]


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _hashes(tokenizers: tuple[Tokenizer, Tokenizer]) -> list[str]:
    return [hashlib.sha256(tok.model_bytes).hexdigest() for tok in tokenizers]


# ---------------------------------------------------------------------------------------------
# SentencePiece on a bounded sample


def sample_pairs(
    corpora: Iterable[TrainCorpus], limit: int, seed: int = 0
) -> tuple[list[str], list[str]]:
    """At most `limit` pairs drawn uniformly from all corpora (reservoir sampling, one pass),
    in corpus order; every pair when there are no more than `limit`."""
    rng = random.Random(seed)
    kept: list[tuple[int, str, str]] = []
    seen = 0
    for corpus in corpora:
        for src, tgt in iter_parallel(corpus.src, corpus.tgt):
            if seen < limit:
                kept.append((seen, src, tgt))
            elif (slot := rng.randrange(seen + 1)) < limit:
                kept[slot] = (seen, src, tgt)
            seen += 1
    kept.sort()
    return [src for _, src, _ in kept], [tgt for _, _, tgt in kept]


def _train_tokenizers(cfg: Config, corpora: list[TrainCorpus]) -> tuple[Tokenizer, Tokenizer]:
    """SentencePiece (cached by sample and settings) on a sample of `max_sentences` lines."""
    t = cfg.tokenizer
    src, tgt = sample_pairs(corpora, t.max_sentences // 2 if t.joint else t.max_sentences)
    if not any(s.strip() and g.strip() for s, g in zip(src, tgt, strict=True)):
        raise DataError(f"{corpora[0].src}: the training corpus has no non-empty pairs")
    log.info("prepared data: SentencePiece on %d sampled pairs", len(src))
    return build_tokenizers(t, src, tgt, cache_dir() / "spm", cfg.data.tags())


# ---------------------------------------------------------------------------------------------
# Encoding on worker processes

_WORKER: dict[str, Any] = {}  # each worker's tokenizers and settings, set once


def _init_worker(src_model: bytes, tgt_model: bytes, max_len: int, ratio: float, dtype: str):
    _WORKER.update(src=Tokenizer(src_model), tgt=Tokenizer(tgt_model))
    _WORKER.update(max_len=max_len, ratio=ratio, dtype=dtype)


def encode_chunk(
    task: tuple[int, str | None, list[str], list[str]],
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, FilterStats]:
    """Encode and clean one chunk of a corpus: (corpus, src tokens, tgt tokens, lengths, stats).

    A tag is put before each kept source sentence; cleaning looks at the sentences alone.
    """
    corpus, tag, src_lines, tgt_lines = task
    w = _WORKER
    src_ids, tgt_ids = w["src"].encode(src_lines), w["tgt"].encode(tgt_lines)
    keep, stats = clean_pairs(src_ids, tgt_ids, w["max_len"], w["ratio"])
    prefix = [w["src"].sp.piece_to_id(tag)] if tag else []
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


def _tasks(corpora: list[TrainCorpus]) -> Iterator[tuple[int, str | None, list[str], list[str]]]:
    """Chunks of `CHUNK` pairs, corpus after corpus, read as a stream."""
    for index, corpus in enumerate(corpora):
        pairs = iter_parallel(corpus.src, corpus.tgt)
        while chunk := list(itertools.islice(pairs, CHUNK)):
            yield index, corpus.tag, [s for s, _ in chunk], [t for _, t in chunk]


def _encoded(tasks: Iterator[Any], workers: int, init_args: tuple[Any, ...]) -> Iterator[Any]:
    """`encode_chunk` over `tasks` in order; at most 2 chunks per worker are in flight."""
    if workers == 1:
        _init_worker(*init_args)
        yield from map(encode_chunk, tasks)
        return
    # fork: the workers need no imports of their own (spawn would import torch in each)
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, init_args) as pool:
        pending: collections.deque = collections.deque()
        for task in tasks:
            pending.append(pool.apply_async(encode_chunk, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _build(
    cfg: Config, target: Plan, tokenizers: tuple[Tokenizer, Tokenizer], workers: int
) -> None:
    """Encode every corpus into a temp folder, then rename it to `target.folder`."""
    src_tok, tgt_tok = tokenizers
    for tag in cfg.data.tags():
        if src_tok.sp.piece_to_id(tag) == src_tok.sp.unk_id():
            raise DataError(
                f"data.train: tag {tag} is not a piece of the source tokenizer (a resumed run's "
                "tokenizer was trained without it); start a new run to add tags"
            )
    dtype = "uint16" if max(src_tok.vocab_size, tgt_tok.vocab_size) <= 65535 else "int32"
    target.folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.folder.with_name(f".{target.folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    log.info("prepared data: encoding into %s with %d process(es)", target.folder, workers)
    stats = [FilterStats() for _ in target.corpora]
    lengths: list[np.ndarray] = []
    corpus_of: list[np.ndarray] = []
    try:
        init = (src_tok.model_bytes, tgt_tok.model_bytes, cfg.data.max_len)
        init += (cfg.data.max_len_ratio, dtype)
        with open(tmp / "src.bin", "wb") as src_out, open(tmp / "tgt.bin", "wb") as tgt_out:
            for corpus, src, tgt, rows, chunk_stats in _encoded(
                _tasks(target.corpora), workers, init
            ):
                src_out.write(src.tobytes())
                tgt_out.write(tgt.tobytes())
                lengths.append(rows)
                corpus_of.append(np.full(len(rows), corpus, dtype=np.int16))
                stats[corpus].add(chunk_stats)
        _check_kept(cfg, stats)
        all_lengths = np.concatenate(lengths)
        offsets = np.zeros((len(all_lengths) + 1, 2), dtype=np.int64)
        np.cumsum(all_lengths, axis=0, out=offsets[1:])
        np.save(tmp / "index.npy", offsets)
        np.save(tmp / "corpus.npy", np.concatenate(corpus_of))
        (tmp / "src.model").write_bytes(src_tok.model_bytes)
        (tmp / "tgt.model").write_bytes(tgt_tok.model_bytes)
        manifest = {
            "format": FORMAT,
            "corpora": [
                {
                    **ident,
                    "src_path": c.src,
                    "tgt_path": c.tgt,
                    **dataclasses.asdict(s),
                    "pairs": s.kept + s.empty + s.too_long + s.bad_ratio,
                }
                for ident, c, s in zip(
                    target.identity["corpora"], target.corpora, stats, strict=True
                )
            ],
            "identity": target.identity,
            "dtype": dtype,
            "pairs": int(len(all_lengths)),
            "tokens": [int(n) for n in offsets[-1]],
            "tokenizer_sha256": _hashes(tokenizers),
            "files": {
                name: {"bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
                for name in SHARD_FILES
            },
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _move_into_place(tmp, target.folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for c, s in zip(target.corpora, stats, strict=True):
        log.info(
            "prepared data: %s: %d pairs kept; dropped %d empty, %d longer than %d tokens, "
            "%d over the length ratio",
            c.src,
            s.kept,
            s.empty,
            s.too_long,
            cfg.data.max_len,
            s.bad_ratio,
        )


def _check_kept(cfg: Config, stats: list[FilterStats]) -> None:
    total = FilterStats()
    for s in stats:
        total.add(s)
    if not total.kept:
        raise DataError(
            f"every training pair was filtered out ({total.empty} empty, {total.too_long} longer "
            f"than data.max_len={cfg.data.max_len} tokens, {total.bad_ratio} over "
            f"data.max_len_ratio={cfg.data.max_len_ratio:g}); raise data.max_len"
        )


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Rename the finished temp folder to `folder`, replacing an outdated one."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        os.replace(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, folder)
