"""`attn-mt prepare`: the training corpora, once, as token shards that training memory-maps.

Every step streams, so memory stays bounded whatever the corpus size:
1. hash the input files (sha256); the hashes and the settings name the prepared folder, and a
   folder whose manifest matches is used as it is: an unchanged corpus is never encoded twice;
2. where a corpus has `data.filters` rules on, judge its pairs on `workers` processes
   (`attn_mt.data.cleaning`): what they drop is never sampled nor encoded;
3. SentencePiece on a seeded random sample of at most `tokenizer.max_sentences` sentences of the
   kept pairs, changed as `data.augment` says (reservoir sampling; the whole corpus when it is
   smaller, which gives the model `train` trained on all lines before, from the same cache);
4. change the kept pairs as `data.augment` says, encode them in chunks on `workers` processes,
   clean (empty pairs, `data.max_len`, `data.max_len_ratio`) and append to the flat token
   files; the index, the models and last the manifest (with every rule's count) follow, in a
   temp folder renamed into place when complete, so an interrupted prepare leaves nothing that
   training would trust.

Building holds a lock beside the folder (`.NAME.lock`): a second `prepare` or `train` of the
same corpora waits, then uses what the first built; the holder removes the temp folders a
killed prepare left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import logging
import random
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt import distributed
from attn_mt.config.data import DataConfig, TrainCorpus, language_tag
from attn_mt.config.schema import Config
from attn_mt.data.augment import Augmenter
from attn_mt.data.cleaning import judge_corpora
from attn_mt.data.corpora import cache_dir, source_tags, train_corpora
from attn_mt.data.pool import worker_count
from attn_mt.data.shards import (
    FORMAT,
    MANIFEST,
    REBUILD,
    Shards,
    corpus_lines,
    open_shards,
    sha256_file,
    temperature_weights,
)
from attn_mt.data.shardwriter import Plan, augmenter, kept_lines, model_hashes, write_shards
from attn_mt.data.text import check_text_file, iter_lines, iter_parallel
from attn_mt.data.tokenizer import Tokenizer, build_tokenizers, train_tokenizer
from attn_mt.errors import DataError, UserError
from attn_mt.fileio import os_reason, sigterm_unwinds
from attn_mt.text.normalize import invisible

log = logging.getLogger("attn_mt")


def prepared_root(cfg: DataConfig) -> Path:
    """Where prepared folders live: `data.prepared_dir`, else the cache's `prepared/`."""
    return Path(cfg.prepared_dir) if cfg.prepared_dir else cache_dir() / "prepared"


def plan(cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None = None) -> Plan:
    """Hash the inputs and name the folder that holds (or will hold) their shards (a run from
    train.init_from's checkpoint: with its SentencePiece `tokenizers`)."""
    corpora = train_corpora(cfg.data)
    tags = [source_tags(cfg.data, c) for c in corpora]
    entries = [{"src": _digest(c.src), "tgt": _digest(c.tgt), "tag": c.tag} for c in corpora]
    if cfg.data.language_tags():  # only then: a bilingual folder keeps its name
        for entry, c in zip(entries, corpora, strict=True):
            entry["language_tag"] = language_tag(str(c.tgt_lang))
    for entry, c in zip(entries, corpora, strict=True):
        if (rules := cfg.data.filters_of(c)).any():  # an unused threshold changes nothing
            entry["filters"] = dataclasses.asdict(rules)
    identity = {
        "format": FORMAT,
        "corpora": entries,
        "tokenizer": _tokenizer_identity(cfg, tokenizers),
        "max_len": cfg.data.max_len,
        "max_len_ratio": cfg.data.max_len_ratio,
    }
    if cfg.data.augment.any():  # the draws come from the run's seed
        identity["augment"] = {**dataclasses.asdict(cfg.data.augment), "seed": cfg.train.seed}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    return Plan(corpora, identity, prepared_root(cfg.data) / key, tags)


def _tokenizer_identity(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None
) -> dict[str, Any]:
    """What decides the stored tokens: the SentencePiece models of the checkpoint a run starts
    from (train.init_from: their sha256), else the tokenizer keys that train them (sampling
    happens per batch, later). A resumed run's models are those its keys trained."""
    if cfg.train.init_from and tokenizers is not None:
        return {"sha256": model_hashes(tokenizers)}
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


def prepare_shards(
    cfg: Config,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    workers: int = 0,
    repair: bool = False,
) -> Shards:
    """The shards of `cfg`'s training corpora: reused when up to date, else (re)built.

    tokenizers: use these (a resumed run's, train.init_from's, or rank 0's) instead of training
    SentencePiece; a run from train.init_from must give its checkpoint's.
    workers: encoding processes (0 = every core). repair: rebuild a damaged folder instead
    of refusing it (what `attn-mt prepare` does).
    """
    workers = worker_count(workers)
    if cfg.train.init_from and tokenizers is None:
        raise DataError(
            f"train.init_from {cfg.train.init_from}: a run started from a checkpoint encodes "
            "its data with that checkpoint's SentencePiece models; `attn-mt train` prepares them"
        )
    target = plan(cfg, tokenizers)
    if shards := _reusable(target, tokenizers, repair):
        return shards
    with _build_lock(target.folder) as waited:
        if waited and (shards := _reusable(target, tokenizers, repair)):
            return shards  # another process built it while this one waited
        target.codes = judge_corpora(cfg.data, target.corpora, workers)
        if tokenizers is None:
            tokenizers = _train_tokenizers(cfg, target)
        write_shards(cfg, target, tokenizers, workers)
    return open_shards(target.folder)


def _reusable(
    target: Plan, tokenizers: tuple[Tokenizer, Tokenizer] | None, repair: bool
) -> Shards | None:
    """The prepared folder when it is up to date; None when it must be (re)built; a damaged
    one is a DataError unless `repair`."""
    if target.folder.exists() and not target.folder.is_dir():  # where the folder belongs
        if not repair:
            rebuild = REBUILD.format(folder=target.folder)
            raise DataError(f"{target.folder}: a file, not a prepared folder; {rebuild}")
        log.warning("%s: a file, not a prepared folder; replacing it", target.folder)
        target.folder.unlink()
    if (target.folder / MANIFEST).is_file():
        try:
            shards = open_shards(target.folder)
        except DataError as err:
            if not repair:
                raise
            log.warning("%s; rebuilding it", str(err).split("; rebuild")[0])
        else:
            same_tokens = tokenizers is None or shards.tokenizer_hashes() == model_hashes(
                tokenizers
            )
            if shards.manifest.get("identity") == target.identity and same_tokens:
                log.info("prepared data: %s is up to date (%d pairs)", target.folder, len(shards))
                return shards
            log.info("prepared data: %s is outdated (another tokenizer)", target.folder)
    return None


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[bool]:
    """Hold the lock for building `folder` (yields whether another process held it first);
    temp folders that a killed prepare left are removed while it is held."""
    lock = folder.with_name(f".{folder.name}.lock")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")  # noqa: SIM115 (closed below)
    except OSError as err:
        raise DataError(
            f"{folder.parent}: cannot use the prepared-data cache ({os_reason(err)}); make it "
            "writable or set data.prepared_dir or ATTN_MT_CACHE to another folder"
        ) from None
    with handle, sigterm_unwinds():  # SIGTERM: write_shards removes its temp folder
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            log.info("prepared data: another process is preparing %s; waiting for it", folder)
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = True
        for suffix in ("tmp", "old"):  # see write_shards and _move_into_place
            for stale in folder.parent.glob(glob.escape(f".{folder.name}.") + f"*.{suffix}"):
                shutil.rmtree(stale, ignore_errors=True)
        yield waited


def shards_for_run(
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
        mine.append(prepare_shards(cfg, tokenizers, workers))
        return mine[0].folder, mine[0].tokenizers()

    folder, tokenizers = distributed.from_main(first, world)
    error = None
    if world.local_rank == 0 and not world.is_main:
        try:
            mine.append(prepare_shards(cfg, tokenizers, workers))
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


def prepared_corpus_lines(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None = None
) -> list[str]:
    """`corpus_lines` of the prepared data, or of the raw files when not prepared yet
    (`tokenizers`: train.init_from's, as `plan` takes them)."""
    target = plan(cfg, tokenizers)
    if not (target.folder / MANIFEST).is_file():
        entries = []
        for c, ident in zip(target.corpora, target.identity["corpora"], strict=True):
            assert c.src is not None and c.tgt is not None  # a validated config has both
            pairs = sum(1 for _ in iter_parallel(c.src, c.tgt))
            entries.append({**ident, "src_path": c.src, "kept": pairs, "pairs": pairs})
        note = "not prepared yet (attn-mt prepare --config FILE): counts before cleaning"
        return [f"training corpora {note}", *corpus_lines(entries, _weights(cfg, entries))]
    entries = open_shards(target.folder).manifest["corpora"]  # a damaged folder: say so
    return [
        f"training corpora prepared in {target.folder}",
        *corpus_lines(entries, _weights(cfg, entries)),
    ]


def _weights(cfg: Config, entries: list[dict[str, Any]]) -> list[float]:
    """The corpora's weights in an epoch: data.train's, then data.temperature's mix."""
    counts = [entry["kept"] for entry in entries]
    return temperature_weights(cfg.data.weights(), counts, cfg.data.temperature)


# ---------------------------------------------------------------------------------------------
# SentencePiece on a bounded sample


def sample_pairs(
    corpora: Sequence[TrainCorpus],
    limit: int,
    seed: int = 0,
    codes: Sequence[np.ndarray | None] = (),
    changes: Augmenter | None = None,
) -> tuple[list[str], list[str]]:
    """At most `limit` pairs drawn uniformly from all corpora (reservoir sampling, one pass),
    in corpus order; every pair when there are no more than `limit`. `codes`: each corpus's
    rule codes by data.filters (only the pairs kept are drawn); `changes`: data.augment's,
    applied to the pairs drawn."""
    rng = random.Random(seed)
    kept: list[tuple[int, int, int, str, str]] = []
    seen = 0
    for index, corpus in enumerate(corpora):
        assert corpus.src is not None and corpus.tgt is not None  # a validated config has both
        for line, src, tgt in kept_lines(corpus.src, corpus.tgt, codes[index] if codes else None):
            if seen < limit:
                kept.append((seen, index, line, src, tgt))
            elif (slot := rng.randrange(seen + 1)) < limit:
                kept[slot] = (seen, index, line, src, tgt)
            seen += 1
    kept.sort()
    if changes is not None:
        kept = [(n, c, i, *changes.pair(s, t, c, i)) for n, c, i, s, t in kept]
    return [src for *_, src, _ in kept], [tgt for *_, tgt in kept]


def language_sample(
    corpora: Sequence[TrainCorpus],
    limit: int,
    seed: int = 0,
    codes: Sequence[np.ndarray | None] = (),
) -> list[str]:
    """A balanced sample for one joint SentencePiece model over several languages: at most
    `limit` sentences in all, an equal share per language, each drawn uniformly (reservoir
    sampling) from the distinct files of that language, languages in order of first use; a
    file's lines that data.filters dropped (`codes` of the first corpus that reads it) are left
    out."""
    files: dict[str, dict[str, np.ndarray | None]] = {}
    for index, c in enumerate(corpora):
        for lang, path in ((c.src_lang, c.src), (c.tgt_lang, c.tgt)):
            files.setdefault(str(lang), {}).setdefault(str(path), codes[index] if codes else None)
    share = limit // len(files)
    lines: list[str] = []
    for lang, paths in files.items():
        rng = random.Random(f"{seed}-{lang}")
        kept: list[tuple[int, str]] = []
        read = (
            invisible(line)  # as the shards read it (`kept_lines`)
            for path, dropped in paths.items()
            for number, line in enumerate(iter_lines(path))
            if dropped is None or not dropped[number]
        )
        for seen, line in enumerate(read):
            if seen < share:
                kept.append((seen, line))
            elif (slot := rng.randrange(seen + 1)) < share:
                kept[slot] = (seen, line)
        lines += [line for _, line in sorted(kept)]
    return lines


def _train_tokenizers(cfg: Config, target: Plan) -> tuple[Tokenizer, Tokenizer]:
    """SentencePiece (cached by sample and settings) on a sample of `max_sentences` lines of
    the pairs data.filters kept, changed as data.augment says; for several directions one
    joint model on a sample balanced between the languages (not augmented)."""
    t, corpora = cfg.tokenizer, target.corpora
    if len(cfg.data.directions()) > 1:
        lines = language_sample(corpora, t.max_sentences, codes=target.codes)
        log.info(
            "prepared data: one joint SentencePiece on %d sentences balanced by language",
            len(lines),
        )
        joint = train_tokenizer(t, lines, cache_dir() / "spm", cfg.data.tags())
        return joint, joint
    limit = t.max_sentences // 2 if t.joint else t.max_sentences
    src, tgt = sample_pairs(corpora, limit, codes=target.codes, changes=augmenter(cfg))
    if not any(s.strip() and g.strip() for s, g in zip(src, tgt, strict=True)):
        raise DataError(f"{corpora[0].src}: the training corpus has no non-empty pairs")
    log.info("prepared data: SentencePiece on %d sampled pairs", len(src))
    return build_tokenizers(t, src, tgt, cache_dir() / "spm", cfg.data.tags())
