"""Parallel corpora: reading files, the named corpus `multi30k`, and token-budget batches.

Reading is strict and loud: a missing file, a line-count mismatch or invalid UTF-8 is a
`DataError` naming the file (and line). Batches are bucketed by length so padding stays small,
and their order is a pure function of (seed, epoch), which is what makes exact resume and
agreement between DDP ranks possible without storing any sampler state.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from attn_mt.config import DataConfig, TrainCorpus
from attn_mt.errors import DataError
from attn_mt.paths import atomic_write, os_reason
from attn_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
MULTI30K_LANGS = ("de", "en", "fr", "cs")
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}


# ---------------------------------------------------------------------------------------------
# Where things live


def cache_dir() -> Path:
    """The user cache folder: $ATTN_MT_CACHE, else $XDG_CACHE_HOME/attn-mt, else ~/.cache."""
    if os.environ.get("ATTN_MT_CACHE"):
        return Path(os.environ["ATTN_MT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attn-mt"


def data_roots() -> list[Path]:
    """Folders searched for named corpora, in order: $ATTN_MT_DATA, then the cache."""
    roots = []
    if os.environ.get("ATTN_MT_DATA"):
        roots.append(Path(os.environ["ATTN_MT_DATA"]).expanduser())
    roots.append(cache_dir() / "data")
    return roots


def offline() -> bool:
    """True when $ATTN_MT_OFFLINE is set (to anything but 0): never touch the network."""
    return os.environ.get("ATTN_MT_OFFLINE", "0").strip() not in ("", "0")


# ---------------------------------------------------------------------------------------------
# Named corpora


def corpus_file(name: str, filename: str, download: bool = True) -> Path:
    """Find `filename` of named corpus `name` locally, or download it (sha256-checked)."""
    looked = []
    for root in data_roots():
        path = root / name / filename
        if path.is_file():
            return path
        looked.append(str(path))
    target = cache_dir() / "data" / name / filename
    if download and offline():
        looked.append("no download: ATTN_MT_OFFLINE is set")
    elif download:
        try:
            _download(MULTI30K_URL + filename, target, MULTI30K_SHA256[filename])
            return target
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            looked.append(f"{MULTI30K_URL}{filename} ({getattr(err, 'reason', err)})")
    raise DataError(
        f"{name}: {filename} not found; looked in {'; '.join(looked)}. Put the corpus files in "
        f"$ATTN_MT_DATA/{name}/ (or run `attn-mt data fetch {name}` where there is network; "
        "ATTN_MT_OFFLINE=1 turns downloads off)"
    )


def _download(url: str, target: Path, sha256: str) -> None:
    """Download to a temp file beside `target`, check its hash, then rename atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=30) as response:
        payload = response.read()
    digest = hashlib.sha256(payload).hexdigest()
    if digest != sha256:
        raise DataError(f"{url}: sha256 {digest} does not match the expected {sha256}")
    with atomic_write(target) as out:
        out.write(payload)


def fetch_corpus(name: str) -> list[Path]:
    """Make every file of a named corpus available locally; return their paths."""
    if name != "multi30k":
        raise DataError(f"{name}: unknown corpus; known: multi30k")
    return [corpus_file(name, filename) for filename in MULTI30K_SHA256]


def corpus_info() -> list[str]:
    """Human-readable lines: each named corpus file and where (or whether) it was found."""
    lines = [f"data folders searched: {', '.join(str(r) for r in data_roots())}"]
    for filename, sha in MULTI30K_SHA256.items():
        found = next(
            (
                r / "multi30k" / filename
                for r in data_roots()
                if (r / "multi30k" / filename).is_file()
            ),
            None,
        )
        if found is None:
            lines.append(f"multi30k/{filename}: missing (attn-mt data fetch multi30k)")
            continue
        ok = hashlib.sha256(found.read_bytes()).hexdigest() == sha
        count = len(read_lines(found))
        lines.append(
            f"multi30k/{filename}: {count} lines, sha256 {'ok' if ok else 'MISMATCH'}, {found}"
        )
    return lines


def split_files(cfg: DataConfig, split: str) -> tuple[Path, Path] | None:
    """The (source, target) paths of `split` (train/valid/test), or None if not configured."""
    files = getattr(cfg, split)
    if isinstance(files, list):
        raise DataError("data.train: a list of corpora is read through `attn-mt prepare`")
    if files.src and files.tgt:
        return Path(files.src), Path(files.tgt)
    if files.src or files.tgt:
        missing = "tgt" if files.src else "src"
        raise DataError(f"data.{split}.{missing}: missing; give both src and tgt files")
    if cfg.dataset is None:
        return None
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"multi30k has no language {lang!r}; choose from {MULTI30K_LANGS}")
    stem = MULTI30K_SPLITS[split]
    return (
        corpus_file(cfg.dataset, f"{stem}.{cfg.src_lang}.gz"),
        corpus_file(cfg.dataset, f"{stem}.{cfg.tgt_lang}.gz"),
    )


def train_corpora(cfg: DataConfig) -> list[TrainCorpus]:
    """The training corpora of a mix, each with existing src/tgt paths (one when not a list)."""
    if isinstance(cfg.train, list):
        return list(cfg.train)
    src, tgt = split_files(cfg, "train")  # type: ignore[misc]  # validate() ensures both
    return [TrainCorpus(src=str(src), tgt=str(tgt))]


# ---------------------------------------------------------------------------------------------
# Reading text


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (plain or gzip), without line endings (LF or CRLF)."""
    return list(iter_lines(path))


def check_text_file(path: Path) -> None:
    """A DataError unless `path` names a file (not a folder, not missing)."""
    if path.is_dir():
        raise DataError(f"{path}: is a folder, not a text file")
    if not path.is_file():
        raise DataError(f"{path}: file not found")


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (plain or gzip), read as a stream: memory stays flat."""
    path = Path(path)
    check_text_file(path)
    number = 0
    try:
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):  # noqa: B007 (used after the loop)
                yield raw.removesuffix(b"\n").decode("utf-8").removesuffix("\r")
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:  # before OSError: BadGzipFile is one
        raise DataError(
            f"{path}: cannot read, damaged gzip data ({err}); download or compress it again"
        ) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({os_reason(err)})") from None
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}:{number}: invalid UTF-8 at byte {err.start}; convert the file to UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)"
        ) from None


def iter_parallel(src: str | Path, tgt: str | Path) -> Iterator[tuple[str, str]]:
    """(source, target) line pairs of a parallel corpus, streamed; the counts must match."""
    src_lines, tgt_lines = iter_lines(src), iter_lines(tgt)
    count = 0
    for count, pair in enumerate(itertools.zip_longest(src_lines, tgt_lines), start=1):
        if None in pair:
            extra_src = sum(1 for _ in src_lines) + (pair[0] is not None)
            extra_tgt = sum(1 for _ in tgt_lines) + (pair[1] is not None)
            _mismatch(src, count - 1 + extra_src, tgt, count - 1 + extra_tgt)
        yield pair


def _mismatch(src: str | Path, src_count: int, tgt: str | Path, tgt_count: int) -> NoReturn:
    raise DataError(
        f"{src} has {src_count} lines but {tgt} has {tgt_count}; "
        "a parallel corpus needs one target line per source line"
    )


def read_parallel(src: str | Path, tgt: str | Path) -> tuple[list[str], list[str]]:
    """Source and target lines of a parallel corpus; their counts must match."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        _mismatch(src, len(src_lines), tgt, len(tgt_lines))
    return src_lines, tgt_lines


@dataclass
class FilterStats:
    """What cleaning removed from a training corpus."""

    kept: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0  # one side over data.max_len_ratio times longer than the other

    def add(self, other: FilterStats) -> None:
        """Count `other`'s pairs too."""
        for name in ("kept", "empty", "too_long", "bad_ratio"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def clean_pairs(
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    max_len: int,
    max_ratio: float = 0,
) -> tuple[list[int], FilterStats]:
    """Indices of pairs to train on: drop empty pairs, pairs over `max_len` tokens, and (when
    `max_ratio` > 0) pairs whose longer side has more than `max_ratio` times the tokens."""
    keep, stats = [], FilterStats()
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if not s or not t:
            stats.empty += 1
        elif len(s) > max_len or len(t) > max_len:
            stats.too_long += 1
        elif max_ratio and max(len(s), len(t)) > max_ratio * min(len(s), len(t)):
            stats.bad_ratio += 1
        else:
            keep.append(i)
    stats.kept = len(keep)
    return keep, stats


# ---------------------------------------------------------------------------------------------
# Batches


@dataclass
class Batch:
    """A padded batch. Decoder input is `<bos> y1..yn`, target `y1..yn <eos>` (teacher forcing)."""

    src: torch.Tensor  # (B, S) source ids ending in <eos>, right-padded
    tgt_in: torch.Tensor  # (B, T) <bos> y1 .. yn
    tgt_out: torch.Tensor  # (B, T) y1 .. yn <eos>
    ids: list[int]  # corpus indices of the rows

    @property
    def num_tgt_tokens(self) -> int:
        """Non-pad target tokens: the denominator of the loss."""
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        """The same batch on `device`."""
        nb = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=nb),
            self.tgt_in.to(device, non_blocking=nb),
            self.tgt_out.to(device, non_blocking=nb),
            self.ids,
        )


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Right-pad lists of ids into a (B, L) long tensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def collate(
    src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]], rows: Sequence[int]
) -> Batch:
    """Build a `Batch` of corpus rows: source + <eos>; <bos> + target; target + <eos>."""
    src = pad_sequences([src_ids[i] + [EOS_ID] for i in rows], PAD_ID)
    tgt_in = pad_sequences([[BOS_ID] + tgt_ids[i] for i in rows], PAD_ID)
    tgt_out = pad_sequences([tgt_ids[i] + [EOS_ID] for i in rows], PAD_ID)
    return Batch(src, tgt_in, tgt_out, list(rows))


def length_batches(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    batch_tokens: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[list[int]]:
    """`bucket_batches` as lists of row indices."""
    return [rows.tolist() for rows in bucket_batches(lengths, batch_tokens, order)]


def bucket_batches(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    batch_tokens: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[np.ndarray]:
    """Group row indices into batches whose padded size `rows * longest side` fits the budget.

    Rows are sorted by their longest side (what the budget counts), then by (source, target)
    length, ties kept in `order`, then cut greedily, so rows of one batch have near-equal
    lengths and padding stays small. A single row longer than the budget still forms its own
    batch. `lengths` is (N, K): e.g. (source, target) tokens per row.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths.reshape(len(lengths), -1) if lengths.size else lengths.reshape(0, 1)
    order = np.arange(len(lengths)) if order is None else np.asarray(order, dtype=np.int64)
    columns = lengths[order].T  # (K, N): e.g. source and target length
    keys = [columns.max(axis=0, initial=0), *columns]  # longest side first, then each side
    base = int(lengths.max(initial=0)) + 1
    if base ** len(keys) < 2**62:  # one int64 key sorts faster than a lexsort
        composite = np.zeros(len(order), dtype=np.int64)
        for key in keys:
            composite = composite * base + key
        by_length = np.argsort(composite, kind="stable")  # ties keep `order`
    else:
        by_length = np.lexsort(keys[::-1])  # also stable
    ranked, sizes = order[by_length], keys[0][by_length]  # sizes non-decreasing
    batches: list[np.ndarray] = []
    start = 0
    while start < len(ranked):
        # Sizes only grow, so a batch's longest row is its last: rows start..j fit while
        # sizes[j] * (j - start + 1) <= budget, and that product only grows with j.
        room = max(batch_tokens // max(int(sizes[start]), 1), 1)
        window = sizes[start : start + room + 1]
        over = window * np.arange(1, len(window) + 1) > batch_tokens
        over[0] = False  # a row longer than the budget still forms its own batch
        count = int(np.argmax(over)) if over.any() else len(window)
        batches.append(ranked[start : start + count])
        start += count
    return batches


def epoch_order(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    batch_tokens: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> list[np.ndarray]:
    """This rank's batches of one epoch, in a shuffled order fixed by (seed, epoch).

    Every rank computes the same global list and takes every `world_size`-th batch; the list is
    cut to a multiple of `world_size` so all ranks do the same number of steps (no deadlock).
    """
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    tie_order = torch.randperm(len(lengths), generator=gen).numpy()
    batches = bucket_batches(lengths, batch_tokens, tie_order)
    shuffled = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
    usable = len(shuffled) - len(shuffled) % world_size
    return shuffled[rank:usable:world_size]


def padding_fraction(batches: Sequence[Batch]) -> float:
    """Share of pad positions among all source and target positions of `batches`."""
    total = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt_out == PAD_ID).sum()) for b in batches)
    return pads / max(total, 1)
