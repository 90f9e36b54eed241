"""Writing token shards (the format is described in `attn_mt.data.shards`): every corpus is
read as a stream, encoded and cleaned in chunks by a pool of forked workers, written into a
temp folder, and renamed into place once its manifest is whole. Ctrl-C and SIGTERM are acted on
between chunks, so a stopped build leaves no temp folder and no half-written pool pipe.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt.config import Config
from attn_mt.configdata import TrainCorpus
from attn_mt.data.shards import FORMAT, MANIFEST, SHARD_FILES, sha256_file
from attn_mt.data.text import FilterStats, clean_pairs, iter_parallel
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import DataError
from attn_mt.fileio import Terminated

log = logging.getLogger("attn_mt")

CHUNK = 20_000  # sentence pairs per encoding task, at most
# Characters per encoding task, at most: its message (at most 3 UTF-8 bytes a character for any
# common script) fits a pipe's 64 KiB. Pool.terminate() drains the task pipe once, then waits
# for the thread that fills it: one left halfway through a larger message, with the workers
# gone (a SIGTERM to the group), waited forever.
CHUNK_CHARS = 16_000


@dataclasses.dataclass
class Plan:
    """What a prepared folder must hold for this config, and where it is."""

    corpora: list[TrainCorpus]
    identity: dict[str, Any]  # what decides the tokens: input hashes, tags, settings
    folder: Path
    tags: list[list[str]]  # per corpus, the pieces put before each source sentence


def model_hashes(tokenizers: tuple[Tokenizer, Tokenizer]) -> list[str]:
    return [hashlib.sha256(tok.model_bytes).hexdigest() for tok in tokenizers]


_WORKER: dict[str, Any] = {}  # each worker's tokenizers and settings, set once


def _init_pool_worker(*init_args: Any) -> None:
    # Ctrl-C and SIGTERM are the parent's to act on (a terminal or a scheduler signals the
    # whole group): a worker dying of one could leave a pool pipe half written, and the pool
    # would wait on it forever; the parent lets the tasks in flight end, then closes the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _init_worker(*init_args)


def _init_worker(src_model: bytes, tgt_model: bytes, max_len: int, ratio: float, dtype: str):
    _WORKER.update(src=Tokenizer(src_model), tgt=Tokenizer(tgt_model))
    _WORKER.update(max_len=max_len, ratio=ratio, dtype=dtype)


def encode_chunk(
    task: tuple[int, list[str], list[str], list[str]],
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, FilterStats]:
    """Encode and clean one chunk of a corpus: (corpus, src tokens, tgt tokens, lengths, stats).

    The tags (target language, corpus) are put before each kept source sentence; cleaning
    looks at the sentences alone.
    """
    corpus, tags, src_lines, tgt_lines = task
    w = _WORKER
    src_ids, tgt_ids = w["src"].encode(src_lines), w["tgt"].encode(tgt_lines)
    keep, stats = clean_pairs(src_ids, tgt_ids, w["max_len"], w["ratio"])
    prefix = [w["src"].sp.piece_to_id(tag) for tag in tags]
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


def _tasks(target: Plan) -> Iterator[tuple[int, list[str], list[str], list[str]]]:
    """Chunks of at most `CHUNK` pairs and about `CHUNK_CHARS` characters, corpus after
    corpus, read as a stream."""
    for index, (corpus, tags) in enumerate(zip(target.corpora, target.tags, strict=True)):
        assert corpus.src is not None and corpus.tgt is not None  # a validated config has both
        src: list[str] = []
        tgt: list[str] = []
        chars = 0
        for s, t in iter_parallel(corpus.src, corpus.tgt):
            src.append(s)
            tgt.append(t)
            chars += len(s) + len(t)
            if len(src) == CHUNK or chars >= CHUNK_CHARS:
                yield index, tags, src, tgt
                src, tgt, chars = [], [], 0
        if src:
            yield index, tags, src, tgt


def _encoded(tasks: Iterator[Any], workers: int, init_args: tuple[Any, ...]) -> Iterator[Any]:
    """`encode_chunk` over `tasks` in order; at most 2 chunks per worker are in flight."""
    if workers == 1:
        _init_worker(*init_args)
        yield from map(encode_chunk, tasks)
        return
    with _signals_between_results() as received:  # from before the first fork
        # fork: the workers need no imports of their own (spawn would import torch in each)
        pool = multiprocessing.get_context("fork").Pool(workers, _init_pool_worker, init_args)
        try:
            pending: collections.deque = collections.deque()
            for task in tasks:
                pending.append(pool.apply_async(encode_chunk, (task,)))
                if len(pending) >= 2 * workers:
                    yield _result(pending.popleft(), received)
            while pending:
                yield _result(pending.popleft(), received)
        finally:
            pool.close()  # not terminate(): the workers ignore SIGTERM; their tasks are small
            pool.join()


@contextlib.contextmanager
def _signals_between_results() -> Iterator[list[int]]:
    """While a pool runs, Ctrl-C and SIGTERM are only noted (in the list yielded) and acted on
    between results, by the handler before (which raises): raised in the middle of the pool's
    own code, they could leave a lock held or a pipe half read that the pool then waits on."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    received: list[int] = []
    kept = [
        sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) != signal.SIG_IGN
    ]
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in kept
    }
    try:
        yield received
    except _Stopped:
        pass  # acted on below
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        handler = previous[signal.Signals(received[0])]
        if callable(handler):
            handler(received[0], None)  # KeyboardInterrupt; fileio.sigterm_unwinds's Terminated
        raise Terminated(128 + received[0])  # the results are incomplete: never go on


def _result(result: Any, received: list[int]) -> Any:
    """The result of a task, unless a signal comes first."""
    while not result.ready():
        if received:
            raise _Stopped
        result.wait(0.1)
    return result.get()


class _Stopped(Exception):
    """A SIGTERM came while the pool ran: end it, then act on the signal."""


def write_shards(
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
    corpus_dtype = np.int16 if len(target.corpora) <= 2**15 else np.int32  # tens of thousands
    target.folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.folder.with_name(f".{target.folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    log.info("prepared data: encoding into %s with %d process(es)", target.folder, workers)
    stats = [FilterStats() for _ in target.corpora]
    lengths: list[np.ndarray] = []
    corpus_of: list[np.ndarray] = []
    try:
        init: tuple[Any, ...] = (src_tok.model_bytes, tgt_tok.model_bytes, cfg.data.max_len)
        init += (cfg.data.max_len_ratio, dtype)
        with open(tmp / "src.bin", "wb") as src_out, open(tmp / "tgt.bin", "wb") as tgt_out:
            for corpus, src, tgt, rows, chunk_stats in _encoded(_tasks(target), workers, init):
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
